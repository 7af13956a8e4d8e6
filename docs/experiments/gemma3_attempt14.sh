#!/usr/bin/env bash
# Issue #36, attempt 14, as registered in docs/results.md ("Pre-registered: RL from zero on Gemma-3-270M, attempt
# 14"): attempt 11's run again at another seed (train.seed=1: the order P's questions are drawn in and the rollout's
# sampling), to measure how far two runs of one setting differ. Two phases, each from the checkout's root on an
# otherwise idle machine:
#   nohup bash docs/experiments/gemma3_attempt14.sh train > runs/gemma3/zero14_train.log 2>&1 &
#   nohup bash docs/experiments/gemma3_attempt14.sh eval > runs/gemma3/zero14_eval.log 2>&1 &
# `train`: attempt 10's base rows restored (docs/experiments/gemma3_zero10_base.tar.gz, as for attempt 11), then
# 120 minutes of RL from the base model (the recipe with --no-eval); `eval`: RL's rows (search, no search, C). The
# recipe's finished stages are marked done and never rerun. No gate of its own: attempt 10's gate
# (docs/experiments/gemma3_attempt10_gate.json) is its precondition, as for attempts 11-13.
set -euo pipefail
PHASE=${1:-}
case "$PHASE" in train|eval) ;; *) echo "usage: $0 train|eval" >&2; exit 2 ;; esac
cd "$(dirname "$0")/../.."
ROOT=$PWD
REG=b609aa0  # the code attempt 14 is registered at (162bafd's training and evaluation, one more metric)
. docs/experiments/at_code.sh
at_code_setup "$REG"  # the environment, the code at REG, P/S/C checked; then in $RUNDIR
at_code_gate "$ROOT/docs/experiments/gemma3_attempt10_gate.json" 0.7 "attempt 14"
# attempt 14's change: the run's seed (attempts 11-13 ran at the config's train.seed 0); nothing else
SET="$(at_code_attempt11_set) --set train.seed=1"
OUT=runs/gemma3/zero14
BASE_TAR=$ROOT/docs/experiments/gemma3_zero10_base.tar.gz  # attempt 10's base rows (attempt 11's, restored alike)
if [ "$PHASE" = train ]; then
  [ ! -e "$OUT/done/rl" ] || { echo "$OUT: RL is done already; the next phase is eval" >&2; exit 2; }
  if [ ! -e "$OUT" ]; then
    mkdir -p "$OUT" && tar -xzf "$BASE_TAR" -C "$OUT" && echo "restored attempt 10's base evaluations from $BASE_TAR"
  fi
  at_code_recipe "$OUT" "$SET" --no-eval
else
  [ -e "$OUT/done/rl" ] || { echo "$OUT: no finished RL; run the train phase first" >&2; exit 2; }
  at_code_recipe "$OUT" "$SET"
fi
