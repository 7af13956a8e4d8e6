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
