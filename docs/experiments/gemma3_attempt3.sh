#!/usr/bin/env bash
# Issue #36, attempt 3, as registered in docs/results.md ("Pre-registered: RL from zero on Gemma-3-270M, attempt
# 3"): Search-R1's instruction with one worked example (rollout.format search_r1_fewshot). Two phases, each run
# from the checkout's root on an otherwise idle machine:
#   bash docs/experiments/gemma3_attempt3.sh pilot    # the gate: the base model sampled on the first 16 of P (~10 min)
#   nohup bash docs/experiments/gemma3_attempt3.sh select > runs/gemma3/attempt3_sel.log 2>&1 &   # arms E, F (~1.6 h)
#   nohup bash docs/experiments/gemma3_attempt3.sh report ARM > runs/gemma3/zero3.log 2>&1 &   # the reported run
# `select` refuses to start unless the pilot passed its gate. `report E|F` is the reported run of the arm the
# selection chose: 120 minutes of RL from the base model into runs/gemma3/zero3, evaluated as attempt 2 (~2.5 h
# after the base rows). The base model's four evaluations do not depend on the arm (E and F differ only in the
# reward), and the whole run does not fit one session: `report ARM --base-only` runs the same command until its
# four base evaluations are done, stops it as its RL stage begins, and keeps them in
# docs/experiments/gemma3_zero3_base.tar.gz (with their done/ marks and times; never overwritten). Where that file
# exists and runs/gemma3/zero3 does not, `report ARM` restores it first and the recipe skips those evaluations.
# All modes run at the registered code (REG below): from this checkout where its sleuth/, configs/ and examples/
# (but the summary script) equal REG's, else from a worktree at REG beside it (made if missing; its runs/ a link to
# this checkout's, its Python this checkout's .venv with the worktree first on PYTHONPATH).
set -euo pipefail
usage() { echo "usage: $0 pilot|select|report E|F [--base-only]" >&2; exit 2; }
MODE=${1:-}; ARM=${2:-}; BASE_ONLY=0
case "$MODE" in
  pilot|select) [ $# -eq 1 ] || usage ;;
  report) { [ $# -eq 2 ] || [ $# -eq 3 ]; } || usage
    case "$ARM" in E|F) ;; *) echo "ARM must be E or F (the selection's arms), got '$ARM'" >&2; exit 2 ;; esac
    if [ $# -eq 3 ]; then [ "$3" = --base-only ] || usage; BASE_ONLY=1; fi ;;
  *) usage ;;
esac
cd "$(dirname "$0")/../.."
ROOT=$PWD
REG=2fbbba6
PY=$ROOT/.venv/bin/python
[ -x "$PY" ] || { echo "no $PY: make venv first" >&2; exit 2; }
export SLEUTH=$ROOT/.venv/bin/sleuth
RUNDIR=$ROOT
if ! git diff --quiet "$REG" -- sleuth configs examples ':!examples/recipe_summary.py'; then
  RUNDIR=$(cd .. && pwd)/sleuth_$REG
  [ -d "$RUNDIR" ] || git worktree add --detach "$RUNDIR" "$REG"
  [ "$(git -C "$RUNDIR" rev-parse --short=7 HEAD)" = "$REG" ] && git -C "$RUNDIR" diff --quiet \
    || { echo "$RUNDIR is not a clean worktree at $REG" >&2; exit 2; }
  [ -e "$RUNDIR/runs" ] || ln -s "$ROOT/runs" "$RUNDIR/runs"
  export PYTHONPATH=$RUNDIR
  echo "running at $REG from $RUNDIR"
fi
mkdir -p runs/gemma3
"$PY" bench/rl_gain_split.py runs/rl_gain >/dev/null  # writes P, S, C and checks them against the recorded hashes
cd "$RUNDIR"
# the recipe's evaluation setting (examples/gemma3_zero.sh's `setting` of configs/gemma3_zero.yaml)
FLAGS=(--corpus ../shared/data/corpus/wiki_dev.jsonl --topk 3 --max-turns 2 --max-tokens-per-turn 128
       --max-context-tokens 1024 --set rollout.max_obs_tokens=300 --no-compare --json)
PILOT=runs/gemma3/attempt3_pilot

if [ "$MODE" = pilot ]; then
  for fmt in search_r1_fewshot search_r1; do
    [ -e "$PILOT/$fmt/report.md" ] || "$SLEUTH" eval --model gemma3-270m --data runs/rl_gain/P.jsonl --limit 16 \
      --samples 8 --temperature 1 --format "$fmt" "${FLAGS[@]}" --out "$PILOT/$fmt" --no-cache >/dev/null
  done
  "$PY" - "$PILOT" <<'PY'
import json, sys
from pathlib import Path
from sleuth.reward import is_valid_format
pilot = Path(sys.argv[1])
copies = {"query", "timbuktu city country"}  # the instruction's placeholder, the example's query
out = {}
for fmt in ("search_r1_fewshot", "search_r1"):
    rows = [json.loads(l) for l in (pilot / fmt / "trajectories.jsonl").read_text().splitlines() if l.strip()]
    out[fmt] = {"samples": len(rows), "valid_sequences": sum(is_valid_format(r["response"]) for r in rows),
                "real_searches": sum(q.strip().lower() not in copies for r in rows for q in r["queries"]),
                "samples_with_a_real_search": sum(any(q.strip().lower() not in copies for q in r["queries"]) for r in rows),
                "searches": sum(len(r["queries"]) for r in rows),
                "answered": sum(r["stop_reason"] == "answered" for r in rows),
                "em": sum(r["em"] for r in rows)}
f = out["search_r1_fewshot"]
out["gate"] = "go" if f["valid_sequences"] >= 1 and f["samples_with_a_real_search"] >= 1 else "stop"
(pilot / "gate.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps(out, indent=1))
PY
  exit
fi

GATE=$PILOT/gate.json  # the pilot's, else the copy kept in git
[ -e "$GATE" ] || GATE=$ROOT/docs/experiments/gemma3_attempt3_pilot_gate.json
"$PY" -c "import json, sys; sys.exit(json.load(open('$GATE'))['gate'] != 'go')" 2>/dev/null \
  || { echo "the pilot has not passed its gate ($GATE): attempt 3 stops there, as registered" >&2; exit 2; }
SET="--set data.train_files=[runs/rl_gain/P.jsonl] --set reward.read_corrective=false --set rollout.format=search_r1_fewshot"
declare -A EXTRA_SET=([E]="" [F]="--set reward.retrieval_score=0.1")  # each arm's setting beside SET

if [ "$MODE" = report ]; then
  OUT=runs/gemma3/zero3
  BASE_TAR=$ROOT/docs/experiments/gemma3_zero3_base.tar.gz
  BASE_EVALS=(search direct rag confirm)
  if [ "$BASE_ONLY" = 1 ] && [ -e "$BASE_TAR" ]; then echo "$BASE_TAR exists already: not run again" >&2; exit 2; fi
  if [ "$BASE_ONLY" = 0 ] && [ -f "$BASE_TAR" ] && [ ! -e "$OUT" ]; then
    mkdir -p "$OUT" && tar -xzf "$BASE_TAR" -C "$OUT" && echo "restored the base evaluations from $BASE_TAR"
  fi
  echo "== the reported run, arm $ARM: ${EXTRA_SET[$ARM]} ($(date -u +%FT%TZ))"
  run() {
    REWARD=search_r1 RL_MINUTES=120 SFT_ROUTE=0 CONFIRM=runs/rl_gain/C.jsonl SLEUTH_SET="$SET ${EXTRA_SET[$ARM]}" \
      examples/gemma3_zero.sh "$OUT"
  }
  if [ "$BASE_ONLY" = 0 ]; then run; echo "== done ($(date -u +%FT%TZ))"; exit; fi
  set -m  # the recipe in a process group of its own, stopped whole
  run &
  pid=$!
  set +m
  until [ -e "$OUT/done/eval_base__confirm_" ]; do
    kill -0 "$pid" 2>/dev/null || { echo "the recipe ended before its base evaluations did" >&2; exit 1; }
    sleep 5
  done
  kill -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$OUT/rl"  # the RL stage it had begun: nothing of it is kept
  members=(times.tsv)
  for m in "${BASE_EVALS[@]}"; do members+=("eval/base_$m" "done/eval_base__${m}_"); done
  tar -czf "$BASE_TAR" -C "$OUT" "${members[@]}"
  echo "kept in $BASE_TAR: ${members[*]} ($(date -u +%FT%TZ))"
  exit
fi
EVAL=(--data runs/rl_gain/S.jsonl --limit 200 --format search_r1_fewshot "${FLAGS[@]}")
arm() {  # arm NAME EXTRA_SET: the registered training command, then its evaluation on S
  local name=$1 extra=$2
  local out=runs/gemma3/sel_$name
  echo "== arm $name: $extra ($(date -u +%FT%TZ))"
  REWARD=search_r1 RL_MINUTES=40 SFT_ROUTE=0 SLEUTH_SET="$SET $extra" examples/gemma3_zero.sh "$out" --no-eval
  echo "== arm $name: evaluation on S ($(date -u +%FT%TZ))"
  [ -e "$out/eval_S/report.md" ] || "$SLEUTH" eval --model "$out/rl" "${EVAL[@]}" --out "$out/eval_S"
  echo "== arm $name: done ($(date -u +%FT%TZ))"
}
arm E "${EXTRA_SET[E]}"
arm F "${EXTRA_SET[F]}"
