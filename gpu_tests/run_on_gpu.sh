#!/usr/bin/env bash
# The one script a machine with an NVIDIA GPU runs (under 10 minutes): what the mocked GPU tests assume about CuPy,
# the GPU tests themselves (the CUDA-marked ones run there), and benchmarks/gpu.py's per-step times against NumPy,
# all into one results file.
#
#   bash gpu_tests/run_on_gpu.sh [RESULTS.md]      # default: gpu_results_<host>_<date>.md in the current directory
#
# Needs agpc installed with its GPU extra (pip install -e ".[gpu,test]", or ".[gpu-cuda13,test]" for a CUDA 13
# driver). PYTHON=... picks the interpreter. Exit status: 0 when everything passed, 1 when something failed (the
# file's last section lists what), 2 when CuPy cannot compute on this machine (the file says why).
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(realpath -m "${1:-gpu_results_$(hostname)_$(date +%Y%m%d_%H%M%S).md}")"
PY="${PYTHON:-python}"
cd "$ROOT" || exit 2
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
failed=()

section() { printf '\n## %s\n\n' "$1" >> "$OUT"; }

# run TITLE SECONDS COMMAND...: the command's output into the file, in a code block; a failure is listed
run() {
    local title="$1" seconds="$2"; shift 2
    local started=$SECONDS status
    section "$title"
    echo '```' >> "$OUT"
    timeout "$seconds" "$@" >> "$OUT" 2>&1
    status=$?
    echo '```' >> "$OUT"
    echo "exit status $status, $((SECONDS - started)) s: \`$*\`" >> "$OUT"
    if [ "$status" -ne 0 ]; then
        failed+=("$title (exit status $status$([ "$status" -eq 124 ] && echo ", timed out after $seconds s"))")
    fi
}

{
    echo "# agpc on a GPU: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname)"
    echo
    echo "agpc source: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout')"
    echo
    echo '```'
    if command -v nvidia-smi > /dev/null; then nvidia-smi 2>&1 | head -15; else echo "nvidia-smi: not found"; fi
    echo '```'
} > "$OUT"

section "Can CuPy compute here"
"$PY" gpu_tests/probe_cupy.py --check-device >> "$OUT" 2>&1
status=$?
if [ "$status" -ne 0 ]; then
    echo "CuPy cannot compute on this machine: nothing else was run (see above)." | tee -a "$OUT"
    echo "results: $OUT"
    exit 2
fi

run "What the mocked tests assume about CuPy (gpu_tests/probe_cupy.py)" 150 "$PY" gpu_tests/probe_cupy.py
run "GPU tests: CuPy with CUDA, the cuda-marked tests included (pytest gpu_tests)" 240 \
    "$PY" -m pytest -q -p no:cacheprovider gpu_tests -rfEsx
run "One step on the GPU against NumPy, with its synchronisations (benchmarks/gpu.py)" 180 \
    "$PY" benchmarks/gpu.py --methods sep,ep,svi,batch-ep --ms 200,1000 --batches 200,2000 --dtypes float64,float32 \
    --repeats 5 --max-step-seconds 5

section "What failed"
if [ "${#failed[@]}" -eq 0 ]; then
    echo "nothing" >> "$OUT"
else
    printf -- '- %s\n' "${failed[@]}" >> "$OUT"
fi
echo "results: $OUT"
[ "${#failed[@]}" -eq 0 ]
