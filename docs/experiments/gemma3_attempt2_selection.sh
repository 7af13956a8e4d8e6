#!/usr/bin/env bash
# Issue #36, attempt 2's selection, as registered in docs/results.md ("Pre-registered: RL from zero on
# Gemma-3-270M, attempt 2"): arm C then arm D, 40 minutes of RL each from the base model, one after the other on an
# otherwise idle machine, then each evaluated once on the first 200 questions of S with attempt 1's evaluation
# command. Run from the checkout's root after `python bench/rl_gain_split.py runs/rl_gain`:
#   nohup bash docs/experiments/gemma3_attempt2_selection.sh > runs/gemma3/attempt2_sel.log 2>&1 &
# It refuses to run where sleuth/, configs/ or examples/ (but the summary script) differ from 6fa50b9 (c182230, the commit
# that registered the attempt, with the fix the deviation under the registration describes).
set -euo pipefail
cd "$(dirname "$0")/../.."
REG=6fa50b9
if ! git diff --quiet "$REG" -- sleuth configs examples ':!examples/recipe_summary.py'; then
  echo "sleuth/, configs/ or examples/ differ from $REG: run this from a worktree at $REG" >&2; exit 2
fi
for f in S P; do [ -f "runs/rl_gain/$f.jsonl" ] || { echo "runs/rl_gain/$f.jsonl missing: python bench/rl_gain_split.py runs/rl_gain" >&2; exit 2; }; done
SET="--set data.train_files=[runs/rl_gain/P.jsonl] --set reward.read_corrective=false"
EVAL=(--data runs/rl_gain/S.jsonl --limit 200 --corpus ../shared/data/corpus/wiki_dev.jsonl --topk 3
      --format search_r1 --max-turns 2 --max-tokens-per-turn 128 --max-context-tokens 1024
      --set rollout.max_obs_tokens=300 --no-compare --json)
mkdir -p runs/gemma3
arm() {  # arm NAME ENV...: the registered training command with ENV, then its evaluation on S
  local name=$1; shift
  local out=runs/gemma3/sel_$name
  echo "== arm $name: $* ($(date -u +%FT%TZ))"
  env "$@" RL_MINUTES=40 SFT_ROUTE=0 SLEUTH_SET="$SET" examples/gemma3_zero.sh "$out" --no-eval
  echo "== arm $name: evaluation on S ($(date -u +%FT%TZ))"
  [ -e "$out/eval_S/report.md" ] || .venv/bin/sleuth eval --model "$out/rl" "${EVAL[@]}" --out "$out/eval_S"
  echo "== arm $name: done ($(date -u +%FT%TZ))"
}
arm C REWARD=search_r1
arm D REWARD=search_r1_staged STAGE1_MINUTES=20
