#!/usr/bin/env bash
# Issue #36, attempt 7, as registered in docs/results.md ("Pre-registered: RL from zero on Gemma-3-270M, attempt
# 7"): attempt 6's run (three worked examples, attempt 3's arm F reward) with Search-R1's shaped terms paid only to
# a response that made a search answered by passages (reward.format_requires_search=true). No gate. From the
# checkout's root, on an otherwise idle machine:
#   nohup bash docs/experiments/gemma3_attempt7.sh report > runs/gemma3/zero7.log 2>&1 &
# The base rows are attempt 6's (docs/experiments/gemma3_zero6_base.tar.gz), restored into runs/gemma3/zero7 where
# it does not exist; then 120 minutes of RL from the base model and RL's evaluations (~2.4 h).
# It runs at the registered code (REG below): from this checkout where its sleuth/, configs/ and examples/ (but the
# summary script) equal REG's, else from a worktree at REG beside it (as attempt 6's script).
set -euo pipefail
[ "${1:-}" = report ] && [ $# -eq 1 ] || { echo "usage: $0 report" >&2; exit 2; }
cd "$(dirname "$0")/../.."
ROOT=$PWD
REG=2aaf533  # the code attempt 7 is registered at (docs/results.md)
BASE_CODE=d1f7ce9  # attempt 6's code, whose base rows attempt 7 reuses
PY=$ROOT/.venv/bin/python
[ -x "$PY" ] || { echo "no $PY: make venv first" >&2; exit 2; }
export SLEUTH=$ROOT/.venv/bin/sleuth
# the base rows carry over only if REG changes nothing an evaluation reads: the reward and its config, no more
changed=$(git diff --name-only "$BASE_CODE" "$REG" -- sleuth configs examples ':!examples/recipe_summary.py')
bad=$(grep -v -e '^sleuth/reward/' -e '^sleuth/config\.py$' <<<"$changed" || true)
[ -z "$bad" ] || { echo "between $BASE_CODE and $REG more than the reward changed ($bad): attempt 6's base rows do not carry over" >&2; exit 2; }
# (sleuth/config.py's part of that diff is RewardConfig.format_requires_search alone: `git diff d1f7ce9 2aaf533 --
# sleuth/config.py`, read at registration)
. docs/experiments/at_code.sh
at_code "$REG"
mkdir -p runs/gemma3
"$PY" bench/rl_gain_split.py runs/rl_gain >/dev/null  # writes P, S, C and checks them against the recorded hashes
cd "$RUNDIR"
SET="--set data.train_files=[runs/rl_gain/P.jsonl] --set reward.read_corrective=false"
SET="$SET --set rollout.format=search_r1_fewshot3 --set reward.retrieval_score=0.1"  # attempt 6
SET="$SET --set reward.format_requires_search=true"  # attempt 7's change
OUT=runs/gemma3/zero7
BASE_TAR=$ROOT/docs/experiments/gemma3_zero6_base.tar.gz
if [ ! -e "$OUT" ]; then
  mkdir -p "$OUT" && tar -xzf "$BASE_TAR" -C "$OUT" && echo "restored attempt 6's base evaluations from $BASE_TAR"
fi
echo "== the reported run ($(date -u +%FT%TZ))"
REWARD=search_r1 RL_MINUTES=120 SFT_ROUTE=0 CONFIRM=runs/rl_gain/C.jsonl SLEUTH_SET="$SET" examples/gemma3_zero.sh "$OUT"
echo "== done ($(date -u +%FT%TZ))"
