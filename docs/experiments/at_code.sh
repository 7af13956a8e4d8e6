# Sourced by a registered experiment's script (attempt 7 on; the earlier scripts keep their own copy, frozen as
# registered): `at_code REG` sets RUNDIR to where the code registered at commit REG runs: the checkout ($ROOT)
# where its sleuth/, configs/ and examples/ (but the summary script) equal REG's, else a clean worktree at REG
# beside it (created once, with runs/ linked to the checkout's), put first on PYTHONPATH.
at_code() {
  local reg=$1
  RUNDIR=$ROOT
  git diff --quiet "$reg" -- sleuth configs examples ':!examples/recipe_summary.py' && return 0
  RUNDIR=$(cd "$ROOT/.." && pwd)/sleuth_$reg
  [ -d "$RUNDIR" ] || git worktree add --detach "$RUNDIR" "$reg"
  [ "$(git -C "$RUNDIR" rev-parse --short=7 HEAD)" = "$reg" ] && git -C "$RUNDIR" diff --quiet \
    || { echo "$RUNDIR is not a clean worktree at $reg" >&2; exit 2; }
  [ -e "$RUNDIR/runs" ] || ln -s "$ROOT/runs" "$RUNDIR/runs"
  export PYTHONPATH=$RUNDIR
  echo "running at $reg from $RUNDIR"
}

# `at_code_setup REG` (attempt 11 on): what every registered Gemma-3 run does first, from the checkout's root ($ROOT):
# checks the environment, runs at_code, writes P, S and C (checked against their recorded hashes), then enters
# $RUNDIR. Sets PY and exports SLEUTH.
at_code_setup() {
  PY=$ROOT/.venv/bin/python
  [ -x "$PY" ] || { echo "no $PY: make venv first" >&2; exit 2; }
  export SLEUTH=$ROOT/.venv/bin/sleuth
  at_code "$1"
  mkdir -p runs/gemma3
  "$PY" bench/rl_gain_split.py runs/rl_gain >/dev/null  # writes P, S, C and checks them against the recorded hashes
  cd "$RUNDIR"
}
