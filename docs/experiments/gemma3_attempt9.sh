#!/usr/bin/env bash
# Issue #36, attempt 9, as registered in docs/results.md ("Pre-registered: RL from zero on Gemma-3-270M, attempt
# 9"): attempt 7's run (three worked examples, Search-R1's shaped terms paid only after a search answered by
# passages) in the prompt whose observations ask the question again after the passages
# (rollout.format=search_r1_fewshot3_reask). From the checkout's root, on an otherwise idle machine:
#   bash docs/experiments/gemma3_attempt9.sh gate     # the base model with search on the first 200 of S, then
#                                                     # sampled on 32 questions of P (~20 min)
#   nohup bash docs/experiments/gemma3_attempt9.sh report [--base-only] > runs/gemma3/zero9.log 2>&1 &
# `report` refuses to start unless the gate said go: the base model's four evaluations in this prompt, 120 minutes
# of RL from the base model and RL's evaluations, into runs/gemma3/zero9. `--base-only` stops as the RL stage
# begins, keeping the base rows in docs/experiments/gemma3_zero9_base.tar.gz (never overwritten), which `report`
# restores where runs/gemma3/zero9 does not exist.
set -euo pipefail
usage() { echo "usage: $0 gate|report [--base-only]" >&2; exit 2; }
MODE=${1:-}; BASE_ONLY=0
case "$MODE" in
  gate) [ $# -eq 1 ] || usage ;;
  report) [ $# -le 2 ] || usage; if [ $# -eq 2 ]; then [ "$2" = --base-only ] || usage; BASE_ONLY=1; fi ;;
  *) usage ;;
esac
cd "$(dirname "$0")/../.."
ROOT=$PWD
REG=ed8786f  # the code attempt 9 is registered at (docs/results.md)
PY=$ROOT/.venv/bin/python
[ -x "$PY" ] || { echo "no $PY: make venv first" >&2; exit 2; }
export SLEUTH=$ROOT/.venv/bin/sleuth
. docs/experiments/at_code.sh
at_code "$REG"
mkdir -p runs/gemma3
"$PY" bench/rl_gain_split.py runs/rl_gain >/dev/null  # writes P, S, C and checks them against the recorded hashes
cd "$RUNDIR"
FORMAT=search_r1_fewshot3_reask
# the recipe's evaluation setting (examples/gemma3_zero.sh's `setting` of configs/gemma3_zero.yaml)
FLAGS=(--corpus ../shared/data/corpus/wiki_dev.jsonl --topk 3 --max-turns 2 --max-tokens-per-turn 128
       --max-context-tokens 1024 --set rollout.max_obs_tokens=300 --no-compare --json)
G=runs/gemma3/attempt9_gate
GATE=$ROOT/docs/experiments/gemma3_attempt9_gate.json
BEFORE=$ROOT/docs/experiments/gemma3_attempt8_gate.json  # search_r1_fewshot3 on S, measured in attempt 8's gate

if [ "$MODE" = gate ]; then
  [ -e "$G/S_search/report.md" ] || "$SLEUTH" eval --model gemma3-270m --data runs/rl_gain/S.jsonl --limit 200 \
    --format "$FORMAT" "${FLAGS[@]}" --out "$G/S_search" >/dev/null  # the base model with search on S, greedy
  # then its samples in this prompt on attempt 3's pilot questions (the first 16 NQ and 16 HotpotQA of P)
  [ -e "$G/P_samples/report.md" ] || "$SLEUTH" eval --model gemma3-270m --data runs/rl_gain/P.jsonl --limit 16 \
    --samples 8 --temperature 1 --format "$FORMAT" "${FLAGS[@]}" --out "$G/P_samples" --no-cache >/dev/null
  "$PY" - "$G" "$GATE" "$BEFORE" <<'PY'
import json, sys
from pathlib import Path
from sleuth.reward import is_valid_format
g, gate, before = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text())
read = lambda d: [json.loads(l) for l in (g / d / "trajectories.jsonl").read_text().splitlines() if l.strip()]
copies = {"query", "timbuktu city country", "girl with a pearl earring painter", "penicillin discovered year"}
real = lambda x: [q for q in x["queries"] if q.strip().lower() not in copies]
answered = lambda r: [x for x in r if x["answer"]]
r = read("S_search")
out = {"S search search_r1_fewshot3 (attempt 8's gate)": before["S search search_r1_fewshot3"]}
out["S search search_r1_fewshot3_reask"] = {
    "questions": len(r), "em": sum(x["em"] for x in r), "cover_em": sum(x["cover_em"] for x in r),
    "f1": sum(x["f1"] for x in r) / len(r), "searches": sum(len(x["queries"]) for x in r),
    "retrieval_hits": sum(bool(x["retrieval_hit"]) for x in r),
    "em_with_a_retrieval_hit": sum(x["em"] for x in r if x["retrieval_hit"]),
    "answered": sum(x["stop_reason"] == "answered" for x in r),
    "answer words": sum(len(x["answer"].split()) for x in answered(r)) / max(1, len(answered(r)))}
r = read("P_samples")
out["P samples search_r1_fewshot3_reask"] = {
    "samples": len(r), "valid_sequences": sum(is_valid_format(x["response"]) for x in r),
    "samples_with_a_real_search": sum(bool(real(x)) for x in r),
    "samples_with_a_retrieval_hit": sum(bool(x["retrieval_hit"]) for x in r),
    "searches": sum(len(x["queries"]) for x in r), "answered": sum(x["stop_reason"] == "answered" for x in r),
    "em": sum(x["em"] for x in r), "em_with_a_real_search": sum(x["em"] for x in r if real(x))}
new, old = out["S search search_r1_fewshot3_reask"]["em"], before["S search search_r1_fewshot3"]["em"]
ok_s = new >= 6 and new >= 2 * old
ok_p = out["P samples search_r1_fewshot3_reask"]["em_with_a_real_search"] >= 3
out["gate"] = "go" if ok_s and ok_p else "stop"
if not gate.exists():
    gate.write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps(out, indent=1))
PY
  exit
fi

"$PY" -c "import json, sys; sys.exit(json.load(open('$GATE'))['gate'] != 'go')" 2>/dev/null \
  || { echo "the gate has not said go ($GATE): attempt 9 stops there, as registered" >&2; exit 2; }
SET="--set data.train_files=[runs/rl_gain/P.jsonl] --set reward.read_corrective=false"
SET="$SET --set rollout.format=$FORMAT --set reward.retrieval_score=0.1"  # attempt 6, in this prompt
SET="$SET --set reward.format_requires_search=true"  # attempt 7's reward
OUT=runs/gemma3/zero9
BASE_TAR=$ROOT/docs/experiments/gemma3_zero9_base.tar.gz
if [ "$BASE_ONLY" = 1 ] && [ -e "$BASE_TAR" ]; then echo "$BASE_TAR exists already: not run again" >&2; exit 2; fi
if [ "$BASE_ONLY" = 0 ] && [ -f "$BASE_TAR" ] && [ ! -e "$OUT" ]; then
  mkdir -p "$OUT" && tar -xzf "$BASE_TAR" -C "$OUT" && echo "restored the base evaluations from $BASE_TAR"
fi
echo "== the reported run ($(date -u +%FT%TZ))"
run() { REWARD=search_r1 RL_MINUTES=120 SFT_ROUTE=0 CONFIRM=runs/rl_gain/C.jsonl SLEUTH_SET="$SET" examples/gemma3_zero.sh "$OUT"; }
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
