#!/usr/bin/env bash
# Issue #36, attempt 16, as registered in docs/results.md ("Pre-registered: RL from zero on Gemma-3-270M, attempt
# 16"): attempt 15's run (train.overlong=keep, train.skip_zero_advantage=true) with the update's rows in shared-prefix
# micro-batches (train.share_prefix=true, train.remove_padding=false: a group's common tokens run once, the same
# gradient), so that 120 minutes hold more steps. Two phases, each from the checkout's root on an otherwise idle
# machine:
#   nohup bash docs/experiments/gemma3_attempt16.sh train > runs/gemma3/zero16_train.log 2>&1 &
#   nohup bash docs/experiments/gemma3_attempt16.sh eval > runs/gemma3/zero16_eval.log 2>&1 &
# `train`: attempt 10's base rows restored (docs/experiments/gemma3_zero10_base.tar.gz, as for attempt 11), then
# 120 minutes of RL from the base model (the recipe with --no-eval); `eval`: RL's rows (search, no search, C). The
# recipe's finished stages are marked done and never rerun. No gate of its own: attempt 10's gate
# (docs/experiments/gemma3_attempt10_gate.json) is its precondition, as for attempts 11-15.
set -euo pipefail
PHASE=${1:-}
case "$PHASE" in train|eval) ;; *) echo "usage: $0 train|eval" >&2; exit 2 ;; esac
cd "$(dirname "$0")/../.."
ROOT=$PWD
REG=fc2da96  # the code attempt 16 is registered at (fd918af's, with train.share_prefix over sliding windows)
. docs/experiments/at_code.sh
at_code_setup "$REG"  # the environment, the code at REG, P/S/C checked; then in $RUNDIR
at_code_gate "$ROOT/docs/experiments/gemma3_attempt10_gate.json" 0.7 "attempt 16"
# attempt 16's change: attempt 15's settings and the update's rows in shared-prefix micro-batches (packed rows off,
# which share_prefix cannot run with); the config's seed (0), as attempts 11-13 and 15
SET="$(at_code_attempt11_set) --set train.overlong=keep --set train.skip_zero_advantage=true"
SET="$SET --set train.remove_padding=false --set train.share_prefix=true"
OUT=runs/gemma3/zero16
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
