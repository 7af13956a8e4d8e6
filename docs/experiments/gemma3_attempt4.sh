#!/usr/bin/env bash
# Issue #36, attempt 4, as registered in docs/results.md ("Pre-registered: RL from zero on Gemma-3-270M, attempt
# 4"): the worked example searches for its question as written (rollout.format search_r1_fewshot_verbatim).
# Three phases, each run from the checkout's root on an otherwise idle machine:
#   bash docs/experiments/gemma3_attempt4.sh pilot    # the gate: the base model sampled on 32 questions of P (~10 min)
#   nohup bash docs/experiments/gemma3_attempt4.sh select > runs/gemma3/attempt4_sel.log 2>&1 &   # arms G, H (~1.7 h)
#   nohup bash docs/experiments/gemma3_attempt4.sh report ARM > runs/gemma3/zero4.log 2>&1 &   # the reported run
# `select` refuses to start unless the pilot passed its gate. `report G|H` is the reported run of the arm the
# selection chose: the base model's four evaluations in this prompt, 120 minutes of RL from the base model, and
# RL's evaluations, into runs/gemma3/zero4 (~2.8 h; `--base-only` stops it as its RL stage begins, as attempt 3's
# script does, keeping the base rows in docs/experiments/gemma3_zero4_base.tar.gz, which `report ARM` restores).
# All modes run at the registered code (REG below): from this checkout where its sleuth/, configs/ and examples/
# (but the summary script) equal REG's, else from a worktree at REG beside it (made if missing; its runs/ a link to
# this checkout's, its Python this checkout's .venv with the worktree first on PYTHONPATH).
set -euo pipefail
usage() { echo "usage: $0 pilot|select|report G|H [--base-only]" >&2; exit 2; }
MODE=${1:-}; ARM=${2:-}; BASE_ONLY=0
case "$MODE" in
  pilot|select) [ $# -eq 1 ] || usage ;;
  report) { [ $# -eq 2 ] || [ $# -eq 3 ]; } || usage
    case "$ARM" in G|H) ;; *) echo "ARM must be G or H (the selection's arms), got '$ARM'" >&2; exit 2 ;; esac
    if [ $# -eq 3 ]; then [ "$3" = --base-only ] || usage; BASE_ONLY=1; fi ;;
  *) usage ;;
esac
cd "$(dirname "$0")/../.."
ROOT=$PWD
REG=f0a9eb2  # registered 90e72d7; the declared deviation of 2026-11-28 (docs/results.md): the OOM fix
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
FORMAT=search_r1_fewshot_verbatim
# the recipe's evaluation setting (examples/gemma3_zero.sh's `setting` of configs/gemma3_zero.yaml)
FLAGS=(--corpus ../shared/data/corpus/wiki_dev.jsonl --topk 3 --max-turns 2 --max-tokens-per-turn 128
       --max-context-tokens 1024 --set rollout.max_obs_tokens=300 --no-compare --json)
PILOT=runs/gemma3/attempt4_pilot

if [ "$MODE" = pilot ]; then
  [ -e "$PILOT/$FORMAT/report.md" ] || "$SLEUTH" eval --model gemma3-270m --data runs/rl_gain/P.jsonl --limit 16 \
    --samples 8 --temperature 1 --format "$FORMAT" "${FLAGS[@]}" --out "$PILOT/$FORMAT" --no-cache >/dev/null
  "$PY" - "$PILOT/$FORMAT" runs/gemma3/attempt3_pilot/search_r1_fewshot \
    "$ROOT/docs/experiments/gemma3_attempt4_pilot_gate.json" <<'PY'
import json, sys
from pathlib import Path
from sleuth.reward import is_valid_format
copies = {"query", "timbuktu city country", "in which country is the city of timbuktu?"}  # placeholder, examples'
def count(d):
    rows = [json.loads(l) for l in (Path(d) / "trajectories.jsonl").read_text().splitlines() if l.strip()]
    real = lambda r: [q for q in r["queries"] if q.strip().lower() not in copies]
    return {"samples": len(rows), "valid_sequences": sum(is_valid_format(r["response"]) for r in rows),
            "samples_with_a_real_search": sum(bool(real(r)) for r in rows),
            "samples_with_a_retrieval_hit": sum(bool(r["retrieval_hit"]) for r in rows),
            "valid_sequences_with_a_retrieval_hit": sum(bool(r["retrieval_hit"]) and is_valid_format(r["response"])
                                                        for r in rows),
            "searches": sum(len(r["queries"]) for r in rows), "answered": sum(r["stop_reason"] == "answered" for r in rows),
            "em": sum(r["em"] for r in rows)}
out = {"search_r1_fewshot_verbatim": count(sys.argv[1])}
if Path(sys.argv[2]).is_dir():  # attempt 3's pilot, the same 32 questions and seeds: the contrast
    out["search_r1_fewshot (attempt 3's pilot)"] = count(sys.argv[2])
v = out["search_r1_fewshot_verbatim"]
go = v["samples_with_a_retrieval_hit"] >= 8 and v["valid_sequences_with_a_retrieval_hit"] >= 1
out["gate"] = "go" if go else "stop"
for path in (Path(sys.argv[1]).parent / "gate.json", Path(sys.argv[3])):
    if not path.exists():
        path.write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps(out, indent=1))
PY
  exit
fi

GATE=$PILOT/gate.json  # the pilot's, else the copy kept in git
[ -e "$GATE" ] || GATE=$ROOT/docs/experiments/gemma3_attempt4_pilot_gate.json
"$PY" -c "import json, sys; sys.exit(json.load(open('$GATE'))['gate'] != 'go')" 2>/dev/null \
  || { echo "the pilot has not passed its gate ($GATE): attempt 4 stops there, as registered" >&2; exit 2; }
SET="--set data.train_files=[runs/rl_gain/P.jsonl] --set reward.read_corrective=false --set rollout.format=$FORMAT"
declare -A EXTRA_SET=([G]="--set reward.retrieval_score=0.1" [H]="")  # each arm's setting beside SET

if [ "$MODE" = report ]; then
  OUT=runs/gemma3/zero4
  BASE_TAR=$ROOT/docs/experiments/gemma3_zero4_base.tar.gz
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
  for m in search direct rag confirm; do members+=("eval/base_$m" "done/eval_base__${m}_"); done
  tar -czf "$BASE_TAR" -C "$OUT" "${members[@]}"
  echo "kept in $BASE_TAR: ${members[*]} ($(date -u +%FT%TZ))"
  exit
fi
EVAL=(--data runs/rl_gain/S.jsonl --limit 200 --format "$FORMAT" "${FLAGS[@]}")
for name in G H; do  # the registered training command, then its evaluation on S
  out=runs/gemma3/sel_$name
  echo "== arm $name: ${EXTRA_SET[$name]} ($(date -u +%FT%TZ))"
  REWARD=search_r1 RL_MINUTES=40 SFT_ROUTE=0 SLEUTH_SET="$SET ${EXTRA_SET[$name]}" \
    examples/gemma3_zero.sh "$out" --no-eval
  echo "== arm $name: evaluation on S ($(date -u +%FT%TZ))"
  [ -e "$out/eval_S/report.md" ] || "$SLEUTH" eval --model "$out/rl" "${EVAL[@]}" --out "$out/eval_S"
  echo "== arm $name: done ($(date -u +%FT%TZ))"
done
