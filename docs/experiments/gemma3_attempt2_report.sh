#!/usr/bin/env bash
# Issue #36, attempt 2's reported run, as registered in docs/results.md ("Pre-registered: RL from zero on
# Gemma-3-270M, attempt 2"): the arm the selection chose, from the base model, 120 minutes of RL, evaluated as
# attempt 1 (base: search, no search, RAG; RL: search, no search; each on the 200 dev questions and on C):
#   nohup bash docs/experiments/gemma3_attempt2_report.sh search_r1_staged > runs/gemma3/zero2.log 2>&1 &
# REWARD is the chosen arm's: search_r1 (arm C) or search_r1_staged (arm D, stage 1 for 20 minutes; chosen).
# It runs at 6fa50b9's code, as registered: from this checkout where its sleuth/, configs/ and examples/ (but the
# summary script) equal 6fa50b9's, else from a worktree at 6fa50b9 beside it (made if missing; its runs/ a link
# to this checkout's, its Python this checkout's .venv with the worktree first on PYTHONPATH).
# The base model's four evaluations do not depend on the arm (both arms use Search-R1's prompt), and the whole
# run does not fit one session: `... REWARD --base-only` runs the same command until its four base evaluations
# are done, stops it as its RL stage begins, and keeps them in docs/experiments/gemma3_zero2_base.tar.gz (with
# their done/ marks and times; never overwritten). Where that file exists and runs/gemma3/zero2 does not, the
# full run restores it first and the recipe skips those evaluations.
set -euo pipefail
usage() { echo "usage: $0 search_r1|search_r1_staged [--base-only]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
case "$1" in search_r1|search_r1_staged) ;; *) echo "REWARD must be search_r1 or search_r1_staged, got $1" >&2; exit 2 ;; esac
BASE_ONLY=0
if [ $# -eq 2 ]; then [ "$2" = --base-only ] || usage; BASE_ONLY=1; fi
cd "$(dirname "$0")/../.."
ROOT=$PWD
REG=6fa50b9
PY=$ROOT/.venv/bin/python
[ -x "$PY" ] || { echo "no $PY: make venv first" >&2; exit 2; }
RUNDIR=$ROOT
if ! git diff --quiet "$REG" -- sleuth configs examples ':!examples/recipe_summary.py'; then
  RUNDIR=$(cd .. && pwd)/sleuth_$REG
  [ -d "$RUNDIR" ] || git worktree add --detach "$RUNDIR" "$REG"
  [ "$(git -C "$RUNDIR" rev-parse --short=7 HEAD)" = "$REG" ] && git -C "$RUNDIR" diff --quiet \
    || { echo "$RUNDIR is not a clean worktree at $REG" >&2; exit 2; }
  [ -e "$RUNDIR/runs" ] || ln -s "$ROOT/runs" "$RUNDIR/runs"
  export PYTHONPATH=$RUNDIR SLEUTH=$ROOT/.venv/bin/sleuth
  echo "running at $REG from $RUNDIR"
fi
mkdir -p runs
"$PY" bench/rl_gain_split.py runs/rl_gain >/dev/null  # writes P, S, C and checks them against the recorded hashes
OUT=runs/gemma3/zero2
BASE_TAR=$ROOT/docs/experiments/gemma3_zero2_base.tar.gz
BASE_EVALS=(search direct rag confirm)
if [ "$BASE_ONLY" = 1 ] && [ -e "$BASE_TAR" ]; then echo "$BASE_TAR exists already: not run again" >&2; exit 2; fi
if [ "$BASE_ONLY" = 0 ] && [ -f "$BASE_TAR" ] && [ ! -e "$OUT" ]; then
  mkdir -p "$OUT" && tar -xzf "$BASE_TAR" -C "$OUT" && echo "restored the base evaluations from $BASE_TAR"
fi
run() {
  cd "$RUNDIR"
  REWARD=$1 RL_MINUTES=120 STAGE1_MINUTES=20 SFT_ROUTE=0 CONFIRM=runs/rl_gain/C.jsonl \
    SLEUTH_SET="--set data.train_files=[runs/rl_gain/P.jsonl] --set reward.read_corrective=false" \
    examples/gemma3_zero.sh "$OUT"
}
if [ "$BASE_ONLY" = 0 ]; then run "$1"; exit; fi
set -m  # the recipe in a process group of its own, stopped whole
run "$1" &
pid=$!
set +m
until [ -e "$OUT/done/eval_base__confirm_" ]; do
  kill -0 "$pid" 2>/dev/null || { echo "the recipe ended before its base evaluations did" >&2; exit 1; }
  sleep 5
done
kill -- "-$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
rm -rf "$OUT/rl" "$OUT/rl_stage1"  # the RL stage it had begun: nothing of it is kept
members=(times.tsv)
for m in "${BASE_EVALS[@]}"; do members+=("eval/base_$m" "done/eval_base__${m}_"); done
tar -czf "$BASE_TAR" -C "$OUT" "${members[@]}"
echo "kept in $BASE_TAR: ${members[*]}"
