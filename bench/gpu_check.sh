#!/usr/bin/env bash
# The GPU check of issue #32 in one GPU visit (docs/benchmarks.md, "GPU check"). Prepare here with
# `make gpu-bundle` (bench/gpu_stage.py build), then, through the device tool, two commands:
#   A: carry [".gpuA"]   bash bench/gpu_check.sh stage
#   B: carry [".gpuB"]   bash bench/gpu_check.sh run "$OUT"      (within A's warm window, ~30 s)
# and hand the machine back. On a CPU: bash bench/gpu_check.sh --dry-run OUT (tiny shapes, minutes).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# the GPU image's python3 holds torch; here the venv's, when there is one
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && ! command -v nvidia-smi >/dev/null 2>&1; then PY=.venv/bin/python; fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD/.gpuA/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TORCHINDUCTOR_CACHE_DIR="$PWD/.gpu-cache/inductor" NUMBA_CACHE_DIR="$PWD/.gpu-cache/numba"  # never in a payload
case "${1:-}" in
  stage) exec "$PY" bench/gpu_stage.py install ;;
  run) shift; exec "$PY" bench/gpu_check.py "$@" ;;
  --dry-run) shift; exec "$PY" bench/gpu_check.py --dry-run "$@" ;;
  *) echo "usage: bash bench/gpu_check.sh stage | run OUT [--deadline S] [--only STEPS] | --dry-run OUT" >&2; exit 2 ;;
esac
