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

# What the Gemma-3 runs from attempt 13 on share (attempts 11 and 12 keep their own copy, frozen as registered).
# `at_code_gate GATE TEMPERATURE WHO`: exits unless the gate record GATE says go at TEMPERATURE (WHO names the
# attempt that needs it, for the message).
at_code_gate() {
  "$PY" -c "import json, sys; g = json.load(open(sys.argv[1])); sys.exit(not (g['gate'] == 'go' and g['temperature'] \
== float(sys.argv[2])))" "$1" "$2" || { echo "the gate $1 does not say go at $2: $3 has no precondition" >&2; exit 2; }
}

# `at_code_attempt11_set`: prints attempt 11's --set words (P to train on, the re-asking prompt at 0.7, the reward
# 1 for an exact match after a search answered by passages and nothing else), to which an attempt adds its change.
at_code_attempt11_set() {
  local s="--set data.train_files=[runs/rl_gain/P.jsonl] --set reward.read_corrective=false"
  s="$s --set rollout.format=search_r1_fewshot3_reask --set rollout.temperature=0.7"
  s="$s --set reward.format_score=0 --set reward.final_format_score=0 --set reward.retrieval_score=0"
  echo "$s --set reward.format_requires_search=true --set reward.answer_requires_search=true"
}

# `at_code_recipe OUT SET [--no-eval]`: the reported run, examples/gemma3_zero.sh into OUT with the --set words SET:
# Search-R1's reward kind, 120 minutes of RL from the base model, no SFT route, every model also on C.
at_code_recipe() {
  echo "== the reported run into $1 ($(date -u +%FT%TZ))"
  REWARD=search_r1 RL_MINUTES=120 SFT_ROUTE=0 CONFIRM=runs/rl_gain/C.jsonl SLEUTH_SET="$2" \
    examples/gemma3_zero.sh "$1" ${3:+"$3"}
  echo "== done ($(date -u +%FT%TZ))"
}
