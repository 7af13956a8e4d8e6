#!/usr/bin/env bash
# Issue #36, attempt 12, as registered in docs/results.md ("Pre-registered: RL from zero on Gemma-3-270M, attempt
# 12"): attempt 11's run (the re-asking prompt search_r1_fewshot3_reask at temperature 0.7, a reward that pays an
# exact match after a search answered by passages and nothing else) with the trajectories cut by a token budget kept
# in the loss (train.overlong=keep; the config's mask left them out). From the checkout's root, on an otherwise
# idle machine:
#   nohup bash docs/experiments/gemma3_attempt12.sh > runs/gemma3/zero12.log 2>&1 &
# No gate of its own: attempt 10's gate (docs/experiments/gemma3_attempt10_gate.json, 4 of 256 samples at 0.7 right
# after a real search) is its precondition. The base rows are attempt 10's (the same prompt, greedy evaluations),
# restored from docs/experiments/gemma3_zero10_base.tar.gz into runs/gemma3/zero12; then 120 minutes of RL from the
# base model and RL's evaluations (search, no search, C), as attempts 10 and 11.
set -euo pipefail
[ $# -eq 0 ] || { echo "usage: $0 (no arguments)" >&2; exit 2; }
cd "$(dirname "$0")/../.."
ROOT=$PWD
REG=162bafd  # the code attempt 12 is registered at (attempt 11's; train.overlong=keep needs no new code)
. docs/experiments/at_code.sh
at_code_setup "$REG"  # the environment, the code at REG, P/S/C checked; then in $RUNDIR
GATE=$ROOT/docs/experiments/gemma3_attempt10_gate.json
"$PY" -c "import json, sys; g = json.load(open('$GATE')); sys.exit(not (g['gate'] == 'go' and g['temperature'] == 0.7))" \
  || { echo "attempt 10's gate ($GATE) does not say go at 0.7: attempt 12 has no precondition" >&2; exit 2; }
SET="--set data.train_files=[runs/rl_gain/P.jsonl] --set reward.read_corrective=false"
SET="$SET --set rollout.format=search_r1_fewshot3_reask --set rollout.temperature=0.7"  # attempt 10's
# attempt 11's change (kept): no shaped term (the config's format_score 0.2 and final_format_score 0.1, attempt 10's
# retrieval_score 0.1 all 0), the right answer paid only after a search answered by passages
SET="$SET --set reward.format_score=0 --set reward.final_format_score=0 --set reward.retrieval_score=0"
SET="$SET --set reward.format_requires_search=true --set reward.answer_requires_search=true"
# attempt 12's change: a trajectory cut by the context or the turn's token budget stays in the loss with its reward
# (0), so in a group holding a right answer it is pushed down as a wrong answer is (configs/gemma3_zero.yaml: mask)
SET="$SET --set train.overlong=keep"
OUT=runs/gemma3/zero12
BASE_TAR=$ROOT/docs/experiments/gemma3_zero10_base.tar.gz  # attempt 10's base rows
if [ ! -e "$OUT" ]; then
  mkdir -p "$OUT" && tar -xzf "$BASE_TAR" -C "$OUT" && echo "restored attempt 10's base evaluations from $BASE_TAR"
fi
echo "== the reported run ($(date -u +%FT%TZ))"
REWARD=search_r1 RL_MINUTES=120 SFT_ROUTE=0 CONFIRM=runs/rl_gain/C.jsonl SLEUTH_SET="$SET" \
  examples/gemma3_zero.sh "$OUT"
echo "== done ($(date -u +%FT%TZ))"
