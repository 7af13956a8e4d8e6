#!/usr/bin/env bash
# The GPU check of issue #32 in one GPU visit (docs/benchmarks.md, "GPU check"). Prepare here with
# `make gpu-bundle` (bench/gpu_stage.py build), then, through the device tool, two commands:
#   A: carry [".gpuA"]   bash bench/gpu_check.sh stage
#   B: carry [".gpuB"]   bash bench/gpu_check.sh run "$OUT"      (within A's warm window, ~30 s)
# and hand the machine back. On a CPU: bash bench/gpu_check.sh --dry-run OUT (tiny shapes, minutes).
# The GPU recipe (a later visit): A as above, then B: carry [".gpuB"]  bash bench/gpu_check.sh recipe "$OUT"
# (SFT, GRPO for MINUTES=4 of training, evaluations; environment as examples/smollm2_nq.sh takes it).
# Issue #35's GPU figure (a visit of its own): A, then B: carry [".gpuB"]  bash bench/gpu_check.sh async "$OUT"
# (`sleuth sft` of the GPU config, then bench/async.py --config configs/smollm2_nq_gpu.yaml: STEPS=4 steps an arm,
# sync and async on the one GPU, 0.3 s retrieval latency and none).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# the GPU image's python3 holds torch; here the venv's, when there is one
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && ! command -v nvidia-smi >/dev/null 2>&1; then PY=.venv/bin/python; fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD/.gpuA/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TORCHINDUCTOR_CACHE_DIR="$PWD/.gpu-cache/inductor" NUMBA_CACHE_DIR="$PWD/.gpu-cache/numba"  # never in a payload
joined_gguf() {  # joined_gguf MODE: GGUF=path (a local file: a CPU try), else A's and B's parts joined and verified
  local gguf=${GGUF:-}
  [ -n "$gguf" ] || gguf=$("$PY" bench/gpu_stage.py join | "$PY" -c "import json, sys; d = json.loads(sys.stdin.read().strip().splitlines()[-1]); print(d.get('gguf') or '') if d.get('weights') == 'real' else print('')")
  [ -n "$gguf" ] || { echo "gpu_check $1: no joined GGUF (run command A first, within the warm window)" >&2; return 1; }
  echo "$gguf"
}
async_bench() {  # issue #35 on a GPU: a SmolLM2 SFT model (the GPU config's sft section), then bench/async.py on it
  local out=${1:?usage: bash bench/gpu_check.sh async OUT}
  local gguf; gguf=$(joined_gguf async) || return 1
  local work=${ASYNC_WORK:-.gpuA/work/async}
  mkdir -p "$work" "$out"
  "$PY" -m sleuth sft --config configs/smollm2_nq_gpu.yaml --out "$work/sft" --overwrite --json \
    --set "model.name_or_path=$gguf" > "$out/async_sft_log.txt" 2>&1 || { tail -30 "$out/async_sft_log.txt"; return 1; }
  "$PY" bench/async.py --model "$work/sft" --config configs/smollm2_nq_gpu.yaml --steps "${STEPS:-4}" \
    --threads "${THREADS:-16}" --json 2>&1 | tee "$out/async.txt"
  return "${PIPESTATUS[0]}"
}
recipe() {  # the GPU recipe (issue #32): examples/smollm2_nq.sh with configs/smollm2_nq_gpu.yaml from the joined GGUF
  local out=${1:?usage: bash bench/gpu_check.sh recipe OUT}
  local gguf; gguf=$(joined_gguf recipe) || return 1
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
  async) shift; async_bench "$@"; exit $? ;;
  run) shift; exec "$PY" bench/gpu_check.py "$@" ;;
  --dry-run) shift; exec "$PY" bench/gpu_check.py --dry-run "$@" ;;
  *) echo "usage: bash bench/gpu_check.sh stage | run OUT [--deadline S] [--only STEPS] | recipe OUT | async OUT | --dry-run OUT" >&2
     exit 2 ;;
esac
