#!/usr/bin/env bash
# Issue #36, attempt 17, as registered in docs/results.md ("Pre-registered: RL from zero on Gemma-3-270M, attempt
# 17"): attempt 16's run at a second seed (train.seed=1, as attempt 14 was attempt 11's): whether attempt 16's setting
# meets the criteria at a seed other than the one that did. Two phases, each from the checkout's root on an otherwise
# idle machine, in one session (runs/ does not outlive it; the records are kept with gemma3_records.py after `eval`):
#   nohup bash docs/experiments/gemma3_attempt17.sh train > runs/gemma3/zero17_train.log 2>&1 &
#   nohup bash docs/experiments/gemma3_attempt17.sh eval > runs/gemma3/zero17_eval.log 2>&1 &
# `train`: attempt 10's base rows restored (docs/experiments/gemma3_zero10_base.tar.gz, as for attempt 11), then
# 120 minutes of RL from the base model (the recipe with --no-eval); `eval`: RL's rows (search, no search, C). The
# recipe's finished stages are marked done and never rerun. No gate of its own: attempt 10's gate
# (docs/experiments/gemma3_attempt10_gate.json) is its precondition, as for attempts 11-16.
set -euo pipefail
PHASE=${1:-}
case "$PHASE" in train|eval) ;; *) echo "usage: $0 train|eval" >&2; exit 2 ;; esac
cd "$(dirname "$0")/../.."
ROOT=$PWD
REG=fc2da96  # the code attempt 16 ran at, and attempt 17 is registered at
. docs/experiments/at_code.sh
at_code_setup "$REG"  # the environment, the code at REG, P/S/C checked; then in $RUNDIR
at_code_gate "$ROOT/docs/experiments/gemma3_attempt10_gate.json" 0.7 "attempt 17"
# attempt 16's settings exactly, at train.seed=1 (attempt 16: the config's seed 0)
SET="$(at_code_attempt11_set) --set train.overlong=keep --set train.skip_zero_advantage=true"
SET="$SET --set train.remove_padding=false --set train.share_prefix=true --set train.seed=1"
OUT=runs/gemma3/zero17
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
