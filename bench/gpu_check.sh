#!/usr/bin/env bash
# The GPU check of issue #32 in one GPU visit (docs/benchmarks.md, "GPU check"). Prepare here with
# `make gpu-bundle` (bench/gpu_stage.py build), then, through the device tool, two commands:
#   A: carry [".gpuA"]   bash bench/gpu_check.sh stage
#   B: carry [".gpuB"]   bash bench/gpu_check.sh run "$OUT"      (within A's warm window, ~30 s)
# and hand the machine back. On a CPU: bash bench/gpu_check.sh --dry-run OUT (tiny shapes, minutes).
# The GPU recipe (a later visit): A as above, then B: carry [".gpuB"]  bash bench/gpu_check.sh recipe "$OUT"
# (SFT, GRPO for MINUTES=4 of training, evaluations; environment as examples/smollm2_nq.sh takes it).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# the GPU image's python3 holds torch; here the venv's, when there is one
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && ! command -v nvidia-smi >/dev/null 2>&1; then PY=.venv/bin/python; fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD/.gpuA/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TORCHINDUCTOR_CACHE_DIR="$PWD/.gpu-cache/inductor" NUMBA_CACHE_DIR="$PWD/.gpu-cache/numba"  # never in a payload
recipe() {  # the GPU recipe (issue #32): examples/smollm2_nq.sh with configs/smollm2_nq_gpu.yaml from the joined GGUF
  local out=${1:?usage: bash bench/gpu_check.sh recipe OUT}
  local gguf=${GGUF:-}  # GGUF=path: a local file (a CPU try of this mode); else the two parts joined
  [ -n "$gguf" ] || gguf=$("$PY" bench/gpu_stage.py join | "$PY" -c "import json, sys; d = json.loads(sys.stdin.read().strip().splitlines()[-1]); print(d.get('gguf') or '') if d.get('weights') == 'real' else print('')")
  [ -n "$gguf" ] || { echo "gpu_check recipe: no joined GGUF (run command A first, within the warm window)" >&2; return 1; }
  local run=${RECIPE_WORK:-.gpuA/work/gpu_recipe}
  mkdir -p "$run/bin" "$out"
  local py; py=$(command -v "$PY"); py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py")  # absolute, venv kept
  printf '#!/bin/sh\nexec %s -m sleuth "$@"\n' "$py" > "$run/bin/sleuth"
  printf '#!/bin/sh\nexec %s "$@"\n' "$py" > "$run/bin/python"  # the example runs its helpers with this one
  chmod +x "$run/bin/sleuth" "$run/bin/python"
  CONFIG=${CONFIG:-configs/smollm2_nq_gpu.yaml} SLEUTH=$(cd "$run/bin" && pwd)/sleuth EVAL_LIMIT=${EVAL_LIMIT:-100} \
    SLEUTH_SET="--set model.name_or_path=$gguf --set train.time_limit_minutes=${MINUTES:-4} --set train.eval_limit=1 ${SLEUTH_SET:-}" \
    bash examples/smollm2_nq.sh "$run" > "$out/recipe_log.txt" 2>&1
  local rc=$?
  for f in summary.md times.tsv; do [ -f "$run/$f" ] && cp "$run/$f" "$out/"; done
  [ -f "$run/rl/metrics.jsonl" ] && cp "$run/rl/metrics.jsonl" "$out/rl_metrics.jsonl"
  [ -f "$run/sft/metrics.jsonl" ] && cp "$run/sft/metrics.jsonl" "$out/sft_metrics.jsonl"
  tail -40 "$out/recipe_log.txt"; [ -f "$out/summary.md" ] && cat "$out/summary.md"
  return $rc
}

case "${1:-}" in
  stage) exec "$PY" bench/gpu_stage.py install ;;
  recipe) shift; recipe "$@"; exit $? ;;
  run) shift; exec "$PY" bench/gpu_check.py "$@" ;;
  --dry-run) shift; exec "$PY" bench/gpu_check.py --dry-run "$@" ;;
  *) echo "usage: bash bench/gpu_check.sh stage | run OUT [--deadline S] [--only STEPS] | recipe OUT | --dry-run OUT" >&2
     exit 2 ;;
esac
