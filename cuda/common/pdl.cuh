// Programmatic dependent launch (PDL, sm_90 and newer; sm_120 has it too).
//
// A kernel launched with the programmatic-stream-serialization attribute (engine/ops/launch_ex.py,
// only while a decode graph is captured) may start while the kernel before it in the stream still
// runs. DS_PDL_WAIT() blocks until that kernel has completed and its writes are visible; nothing the
// previous kernels produce may be read, and nothing they read may be written, before it. Every kernel
// that includes this header runs DS_PDL_BEGIN() (the wait, then DS_PDL_LAUNCH(), which lets the next
// kernel start its own prologue) on every path before touching such memory, early returns included.
// Since the next kernel launches only after every CTA here passed its wait, at most two kernels
// overlap, and only the code before the wait runs early: the skinny GEMM's first weight loads, K4's
// loads of its own layer's state. Launched without the attribute (eager steps, older GPUs), both
// instructions are no-ops.
#pragma once
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DS_PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define DS_PDL_LAUNCH() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define DS_PDL_WAIT() ((void)0)
#define DS_PDL_LAUNCH() ((void)0)
#endif
#define DS_PDL_BEGIN() \
  do {                 \
    DS_PDL_WAIT();     \
    DS_PDL_LAUNCH();   \
  } while (0)
