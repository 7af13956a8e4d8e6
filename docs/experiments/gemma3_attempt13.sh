#!/usr/bin/env bash
# Issue #36, attempt 13, as registered in docs/results.md ("Pre-registered: RL from zero on Gemma-3-270M, attempt
# 13"): attempt 11's run with a context that holds two searches and an answer (rollout.max_context_tokens 1,536,
# in RL and in every evaluation; the token budget of a micro-batch held at attempt 11's 8,192 so the update's
# memory stays as measured). Two phases, each from the checkout's root on an otherwise idle machine:
#   nohup bash docs/experiments/gemma3_attempt13.sh train > runs/gemma3/zero13_train.log 2>&1 &
#   nohup bash docs/experiments/gemma3_attempt13.sh eval > runs/gemma3/zero13_eval.log 2>&1 &
# `train`: 120 minutes of RL from the base model (the recipe with --no-eval); `eval`: the base rows (with search,
# without, RAG, C: all re-measured at this context) and RL's (search, no search, C); the recipe's finished stages
# are marked done and never rerun. No gate of its own: attempt 10's gate (docs/experiments/gemma3_attempt10_gate.json)
# is its precondition, as for attempts 11 and 12.
set -euo pipefail
PHASE=${1:-}
case "$PHASE" in train|eval) ;; *) echo "usage: $0 train|eval" >&2; exit 2 ;; esac
cd "$(dirname "$0")/../.."
ROOT=$PWD
REG=b609aa0  # the code attempt 13 is registered at
. docs/experiments/at_code.sh
at_code_setup "$REG"  # the environment, the code at REG, P/S/C checked; then in $RUNDIR
at_code_gate "$ROOT/docs/experiments/gemma3_attempt10_gate.json" 0.7 "attempt 13"
SET=$(at_code_attempt11_set)
# attempt 13's change: two searches of <= 300 observed tokens each and an answer fit after the ~490-token prompt
# (at 1,024 a second search filled the context: attempt 11's steps 7-10); a micro-batch holds <= 8,192 real tokens,
# attempt 11's worst case (8 rows x 1,024), which splits micro-batches without changing the gradient
SET="$SET --set rollout.max_context_tokens=1536 --set train.max_tokens_per_micro_batch=8192"
OUT=runs/gemma3/zero13
if [ "$PHASE" = train ]; then
  [ ! -e "$OUT/done/rl" ] || { echo "$OUT: RL is done already; the next phase is eval" >&2; exit 2; }
  at_code_recipe "$OUT" "$SET" --no-eval
else
  [ -e "$OUT/done/rl" ] || { echo "$OUT: no finished RL; run the train phase first" >&2; exit 2; }
  at_code_recipe "$OUT" "$SET"
  # one more arm: attempt 11's RL model on the dev questions at this context (does the context at evaluation alone
  # change its figures?), with the recipe's evaluation flags for this setting, checked against its rl_search row's
  if [ ! -e "$OUT/done/eval_rl11_search" ]; then
    "$SLEUTH" eval --model runs/gemma3/zero11/rl --corpus ../shared/data/corpus/wiki_dev.jsonl --topk 3 \
      --format search_r1_fewshot3_reask --max-turns 2 --max-tokens-per-turn 128 --max-context-tokens 1536 \
      --set rollout.max_obs_tokens=300 --data ../shared/data/dev/nq.jsonl ../shared/data/dev/hotpotqa.jsonl \
      --limit 100 --out "$OUT/eval/rl11_search" --cache-dir "$OUT/eval/cache" --no-compare --json
    "$PY" - "$OUT/eval/rl_search/setting.json" "$OUT/eval/rl11_search/setting.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
for s in (a, b):
    s.pop("model"), s.pop("model_path")
sys.exit(f"attempt 11's arm ran at another setting than attempt 13's rl_search: {a} != {b}" if a != b else 0)
PY
    touch "$OUT/done/eval_rl11_search"
  fi
fi
