#!/usr/bin/env bash
# The CUDA path of meshscope end to end, on one machine with NVIDIA GPUs, in under 8 minutes:
# a profiled CUDA run of the runner (NCCL, CUDA-event step timers, CUDA-stream traces, memory
# events and a memory snapshot per rank), its analysis, the overlap and compute time checked
# against Holistic Trace Analysis on the same traces, tokens/s and MFU against the device
# table's peak (collectors/devices.py), the step timers against the trace, and the trace's
# memory peaks against torch.cuda.max_memory_allocated. Everything is printed; the exit code is the number of checks
# that failed (bench/gpu_report.py), or the failing step's own.
#
#   bench/gpu_check.sh [--cpu] [--out DIR] [--steps N]
#
# One rank per GPU: NCCL refuses two ranks of one communicator on the same device ("Duplicate
# GPU detected"), so a single GPU runs world size 1 (no collectives: the overlap is undefined
# there and only compute time is compared with HTA); with N GPUs, dp=N. The model is the
# largest preset that fits a GPU twice over (on an 80-141 GB GPU: `small`, ~270 M parameters).
# --cpu runs the same steps on the CPU (gloo, dp=2, the tiny preset; GPUs hidden), which is
# how tests/test_gpu_check.py exercises the script on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
MODE=cuda
OUT=""
STEPS=12
while [[ $# -gt 0 ]]; do
    case $1 in
        --cpu) MODE=cpu ;;
        --out) OUT=$2; shift ;;
        --steps) STEPS=$2; shift ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_check.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
if [[ $MODE == cpu ]]; then
    export CUDA_VISIBLE_DEVICES=""
    STEPS=${STEPS_CPU:-6}
fi
OUT=${OUT:-$(mktemp -d /tmp/meshscope-gpu-check.XXXXXX)}
mkdir -p "$OUT"
RUN=$OUT/run
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
started=$SECONDS
step() { echo; echo "=== $1 ($((SECONDS - started)) s) ==="; }

step "machine"
if [[ $MODE == cuda ]] && command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
fi
args=()
[[ $MODE == cpu ]] && args+=(--cpu)
choice=$("$PY" bench/gpu_report.py machine "${args[@]}" | tee /dev/stderr | tail -1)
eval "$choice"   # preset=… layout=… global_batch=…

step "run: layout $layout, preset $preset, $STEPS steps (the last 3 profiled) -> $RUN"
timeout 300 "$PY" -m meshscope run --layout "$layout" --model "$preset" --steps "$STEPS" \
    --profile-steps "$((STEPS - 3))-$((STEPS - 1))" --global-batch "$global_batch" \
    --microbatches 4 --memory-snapshot --out "$RUN"

step "analyze"
timeout 90 "$PY" -m meshscope analyze --no-cache "$RUN"

step "checks"
status=0
timeout 60 "$PY" bench/gpu_report.py check "$RUN" || status=$?
echo
echo "gpu_check: $MODE mode, $((SECONDS - started)) s in all; run directory $RUN"
exit $status
