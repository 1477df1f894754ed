#!/usr/bin/env bash
# The GPU test tier (`pytest -m gpu`), one pytest process per test file, each under its own time limit,
# with a table of what each file gave. One process for the whole tier takes well over ten minutes on an
# H200 (the 4B model's runners are built again by several model and memory tests), so a single limit
# either cuts it off or is too long to notice a hang; per file, a hang costs one file.
#
# Usage: deploy/gpu-tests.sh OUT_DIR [TEST_FILE...]
#        deploy/gpu-tests.sh --list      (the default file list, one per line)
#   OUT_DIR    one log per file (OUT_DIR/<file>.log) and summary.txt land here
#   TEST_FILE  files to run (default: every tests/**/test_*.py that marks tests with pytest.mark.gpu)
# Env: PY (default python3), PER_FILE_TIMEOUT (seconds, default 1200).
# Exit status: 0 when every file passed (or had no GPU test selected) and at least one test passed;
# 1 when a file failed, errored or ran past its limit; 2 when nothing ran (no CUDA device: every GPU
# test skipped), which on a GPU host means CUDA is not visible to torch.
set -uo pipefail
if [ $# -lt 1 ]; then
    echo "usage: $0 OUT_DIR [TEST_FILE...] | --list" >&2
    exit 64
fi
root=$(cd "$(dirname "$0")/.." && pwd)
gpu_files() { (cd "$root" && grep -rl --include='test_*.py' 'pytest.mark.gpu' tests | LC_ALL=C sort); }
if [ "$1" = --list ]; then
    gpu_files
    exit 0
fi
out=$1
shift
PY=${PY:-python3}
limit=${PER_FILE_TIMEOUT:-1200}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root" || exit 1

files=("$@")
if [ ${#files[@]} -eq 0 ]; then
    mapfile -t files < <(gpu_files)
fi

bad=0 passed=0
printf '%-50s %6s %7s  %s\n' file rc seconds summary | tee "$out/summary.txt"
for f in "${files[@]}"; do
    log="$out/$(echo "${f%.py}" | tr '/' '_').log"
    t0=$SECONDS
    timeout "$limit" "$PY" -m pytest -m gpu -q -rfE -p no:cacheprovider "$f" >"$log" 2>&1
    rc=$?
    # pytest's last line: "N passed, M skipped ... in 1.23s", or "N deselected" when no test is GPU
    summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|deselected|error)' "$log" | tail -n 1 | tr -d '=')
    case $rc in
        0 | 5) ;;  # 5: no test selected
        124 | 137) summary="ran past ${limit} s: $summary" bad=1 ;;
        *) bad=1 ;;
    esac
    n=$(echo "$summary" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || true)
    passed=$((passed + ${n:-0}))
    printf '%-50s %6s %7s  %s\n' "$f" "$rc" $((SECONDS - t0)) "${summary:-no summary (see $log)}" \
        | tee -a "$out/summary.txt"
done
if [ "$bad" != 0 ]; then
    echo "GPU tests: FAILED (logs in $out)" | tee -a "$out/summary.txt"
    exit 1
fi
if [ "$passed" = 0 ]; then
    echo "GPU tests: none ran (every GPU test skipped: no CUDA device visible to torch)" | tee -a "$out/summary.txt"
    exit 2
fi
echo "GPU tests: $passed passed" | tee -a "$out/summary.txt"
