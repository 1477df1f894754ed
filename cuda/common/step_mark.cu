// A marker on the device's timeline: an empty kernel that the runner launches on its stream at the
// start of every step while --profile-steps is on (engine/worker/step_profile.py). The profiler's
// trace then shows where each step begins, whatever mix of graph replays, piecewise graphs and eager
// launches the step is: the kernels between two marks are one step's, in stream order. It takes the
// step's index only so that a trace viewer can tell marks apart; it reads and writes no memory.

__global__ void step_mark_kernel(int step) { (void)step; }
