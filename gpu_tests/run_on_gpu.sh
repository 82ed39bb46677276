#!/usr/bin/env bash
# The one script a machine with an NVIDIA GPU runs (under 10 minutes, CuPy's first kernel compiles included): what
# the mocked GPU tests assume about CuPy and what the library calls a step makes cost the host, the GPU tests
# themselves (the CUDA-marked ones run there), benchmarks/gpu.py's per-step times against NumPy and against the
# launch model (the GPU's own batch included), and the airline test NLL of the GPU's default batch against the
# CPU's, all into one results file.
#
#   bash gpu_tests/run_on_gpu.sh [RESULTS.md]      # default: gpu_results_<host>_<date>.md in the current directory
#
# Needs agpc installed with its GPU extra (pip install -e ".[gpu,test]", or ".[gpu-cuda13,test]" for a CUDA 13
# driver), and the airline data (../shared/data/airline2008.npz beside the checkout; AIRLINE_DATA=... names another
# path). PYTHON=... picks the interpreter (default python3). Exit status: 0 when everything passed, 1 when something
# failed (the file's last section lists what), 2 when this machine cannot run it: no interpreter, agpc not
# importable, no CuPy, no usable CUDA device or CUDA library (one line says which, here and in the file).
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(realpath -m "${1:-gpu_results_$(hostname)_$(date +%Y%m%d_%H%M%S).md}")"
PY="${PYTHON:-python3}"
AIRLINE_DATA="$(realpath -m "${AIRLINE_DATA:-$ROOT/../shared/data/airline2008.npz}")"
cd "$ROOT" || exit 2
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# 10 minutes (600 s) with room for the last section: every section's timeout is cut to what is left of this
DEADLINE=$((SECONDS + 580))
failed=()

section() { printf '\n## %s\n\n' "$1" >> "$OUT"; }

# stop WHY...: this machine cannot run the script: WHY (its words joined in one line) on stdout and in the file,
# exit status 2
stop() {
    printf '%s\nNothing else was run.\n' "$*" | tee -a "$OUT"
    echo "results: $OUT"
    exit 2
}

# ask SECONDS COMMAND...: run COMMAND for at most SECONDS (then TERM, KILL 10 s later: a hung CUDA start-up);
# ANSWER is the last line of its standard output, or of its errors when it printed nothing (a traceback's last
# line: the error), or that none came in time. (Kept apart so that a warning printed after the answer, CuPy's
# for one, does not take its place; the errors go into the results file.)
ask() {
    local seconds="$1" status errors
    shift
    errors="$(mktemp)"
    ANSWER="$(timeout -k 10 "$seconds" "$@" 2> "$errors")"
    status=$?
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
        ANSWER="no answer within $seconds s"
    elif [ -n "$ANSWER" ]; then
        ANSWER="$(printf '%s\n' "$ANSWER" | tail -n 1)"
    else
        ANSWER="$(tail -n 1 "$errors")"
    fi
    if [ -s "$errors" ]; then
        { echo '```'; cat "$errors"; echo '```'; } >> "$OUT"
    fi
    rm -f "$errors"
    return "$status"
}

# run TITLE SECONDS COMMAND...: the command's output into the file, in a code block, within SECONDS (and what is
# left of the deadline); a failure is listed
run() {
    local title="$1" seconds="$2"
    shift 2
    local started=$SECONDS left=$((DEADLINE - SECONDS)) status
    [ "$seconds" -gt "$left" ] && seconds=$left
    section "$title"
    if [ "$seconds" -le 0 ]; then
        echo "not run: nothing left of the script's 10 minutes" >> "$OUT"
        failed+=("$title (not run: no time left)")
        return
    fi
    echo '```' >> "$OUT"
    timeout -k 10 "$seconds" "$@" >> "$OUT" 2>&1
    status=$?
    echo '```' >> "$OUT"
    echo "exit status $status, $((SECONDS - started)) s: \`$*\`" >> "$OUT"
    if [ "$status" -ne 0 ]; then
        failed+=("$title (exit status $status$( [ "$status" -eq 124 ] || [ "$status" -eq 137 ] &&
            echo ", timed out after $seconds s"))")
    fi
}

{
    echo "# agpc on a GPU: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname)"
    echo
    echo "agpc source: $(timeout 10 git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout')"
} > "$OUT"

section "Can this machine run it"
# in order, each within its own timeout: the interpreter, agpc, CuPy, a CUDA device, CuPy's CUDA libraries
if ! command -v "$PY" > /dev/null 2>&1; then
    stop "No Python interpreter: '$PY' is not found (the default is python3 on PATH; PYTHON=... names another)."
fi
if ! ask 20 "$PY" -c 'import sys; print(sys.version.split()[0]); sys.exit(sys.version_info < (3, 10))'; then
    stop "No Python interpreter: '$PY' does not run as Python 3.10 or newer ($ANSWER)."
fi
echo "- Python $ANSWER: $(command -v "$PY")" >> "$OUT"
if ! ask 60 "$PY" -c 'import agpc.backend'; then
    stop "agpc cannot be imported by $PY ($ANSWER): pip install -e \".[gpu,test]\" in $ROOT with that" \
        "interpreter, or name another with PYTHON=..."
fi
if ! ask 60 "$PY" -c 'import cupy; print(cupy.__version__)'; then
    stop "No CuPy: import cupy fails with $PY ($ANSWER): pip install -e \".[gpu,test]\" (a CUDA 12 driver) or" \
        "\".[gpu-cuda13,test]\" (CUDA 13)."
fi
echo "- CuPy $ANSWER" >> "$OUT"
{
    echo '```'
    if command -v nvidia-smi > /dev/null; then
        timeout -k 5 20 nvidia-smi 2>&1 | head -15
    else
        echo "nvidia-smi: not found"
    fi
    echo '```'
} >> "$OUT"
if ! ask 60 "$PY" -c 'import cupy; print(cupy.cuda.runtime.getDeviceCount())'; then
    stop "No usable CUDA device: CuPy imports, but cupy.cuda.runtime.getDeviceCount() failed ($ANSWER): the" \
        "NVIDIA driver is missing, older than CuPy's CUDA runtime, or hung (nvidia-smi's answer is in $OUT)."
fi
if [ "$ANSWER" = "0" ]; then
    stop "No usable CUDA device: CuPy finds none (cupy.cuda.runtime.getDeviceCount() is 0)."
fi
echo "- CUDA devices: $ANSWER" >> "$OUT"
# agpc.backend.check_device: the CUDA libraries CuPy needs (cuBLAS, cuSOLVER, NVRTC), each with the smallest call
if ! ask 120 "$PY" gpu_tests/probe_cupy.py --check-device; then
    case "$ANSWER" in
        "CuPy cannot compute on this machine: "*) stop "$ANSWER" ;;  # (the probe's own line: what is missing)
        *) stop "CuPy cannot compute on this machine: gpu_tests/probe_cupy.py --check-device: $ANSWER" ;;
    esac
fi
echo "- $ANSWER" >> "$OUT"
if [ ! -f "$AIRLINE_DATA" ]; then
    echo "Warning: no airline data at $AIRLINE_DATA (AIRLINE_DATA=... names it): the GPU's default batch will not be" \
        "compared with the CPU's." | tee -a "$OUT"
fi

run "What the mocked tests assume about CuPy, and the host cost of its library calls (gpu_tests/probe_cupy.py)" 90 \
    "$PY" gpu_tests/probe_cupy.py
# From here on a machine without a usable GPU is an error, not a fall-back: the GPU tests would run on the mock and
# the stand-in (and pass), benchmarks/gpu.py would print its NumPy half (gpu_tests/conftest.py, benchmarks/gpu.py)
export AGPC_REQUIRE_CUDA=1 PYTHONUNBUFFERED=1
# -v and unbuffered: a test that hangs until the section's timeout is named by the last line the file holds; a
# stack dump of every thread after 60 s in one test (faulthandler)
run "GPU tests: CuPy with CUDA, the cuda-marked tests included (pytest gpu_tests)" 220 \
    "$PY" -m pytest -v --tb=short -p no:cacheprovider -o faulthandler_timeout=60 --durations=15 gpu_tests -rfEsx
# three repeats, not five: the NumPy half of this table alone took 101 s on a loaded 2-core machine (209 s at five)
run "One step on the GPU against NumPy and against the launch model, the GPU's own batch too (benchmarks/gpu.py)" \
    120 "$PY" benchmarks/gpu.py --methods sep,ep,svi,batch-ep --ms 200,1000 --batches 200,2000,auto \
    --dtypes float64,float32 --repeats 3 --max-step-seconds 5
if [ -f "$AIRLINE_DATA" ]; then
    # EP (the default method), one million rows: its fits with batch 200 and auto, 45 s each, on the GPU (loading
    # the data and fitting the linear models took 12 s more on a loaded 2-core machine)
    run "Airline test NLL: the GPU's default batch against the CPU's (benchmarks/airline.py --backend cupy)" 130 \
        "$PY" benchmarks/airline.py --backend cupy --data "$AIRLINE_DATA" --methods ep --n-train 1000000 \
        --budget 45 --linear-budget 5 --plot "${OUT%.md}_airline.png"
else
    section "Airline test NLL: the GPU's default batch against the CPU's (benchmarks/airline.py --backend cupy)"
    echo "not run: no airline data at $AIRLINE_DATA" >> "$OUT"
    failed+=("airline test NLL (not run: no data at $AIRLINE_DATA)")
fi

section "What failed"
if [ "${#failed[@]}" -eq 0 ]; then
    echo "nothing" >> "$OUT"
else
    printf -- '- %s\n' "${failed[@]}" >> "$OUT"
fi
echo "results: $OUT"
[ "${#failed[@]}" -eq 0 ]
