#!/usr/bin/env bash
# Issue #36, attempt 10, as registered in docs/results.md ("Pre-registered: RL from zero on Gemma-3-270M, attempt
# 10"): attempt 9's run (observations that ask the question again after the passages, rollout.format
# search_r1_fewshot3_reask; Search-R1's shaped terms paid only after a search answered by passages) sampled at a
# lower temperature (rollout.temperature, chosen by the gate). From the checkout's root, on an otherwise idle machine:
#   bash docs/experiments/gemma3_attempt10.sh gate    # the base model sampled on 32 questions of P at 0.7, then, if
#                                                     # that fails, at 0.5 (~13 min each)
#   nohup bash docs/experiments/gemma3_attempt10.sh report [--base-only] > runs/gemma3/zero10.log 2>&1 &
# `report` refuses to start unless the gate said go: the base model's four evaluations in this prompt (greedy: the
# temperature does not change them), 120 minutes of RL from the base model at the gate's temperature and RL's
# evaluations, into runs/gemma3/zero10. `--base-only` stops as the RL stage begins, keeping the base rows in
# docs/experiments/gemma3_zero10_base.tar.gz (never overwritten), which `report` restores where runs/gemma3/zero10
# does not exist.
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
REG=ed8786f  # the code attempt 10 is registered at (attempt 9's) (docs/results.md)
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
G=runs/gemma3/attempt10_gate
GATE=$ROOT/docs/experiments/gemma3_attempt10_gate.json

if [ "$MODE" = gate ]; then
  [ -e "$GATE" ] && { cat "$GATE"; exit; }  # the gate said go or stop already: not run again
  BEFORE=$ROOT/docs/experiments/gemma3_attempt9_gate.json  # (a): the base model greedy with search on S, measured
  for T in 0.7 0.5; do  # the base model sampled in this prompt on attempt 3's pilot questions of P at T
    [ -e "$G/P_samples_$T/report.md" ] || "$SLEUTH" eval --model gemma3-270m --data runs/rl_gain/P.jsonl --limit 16 \
      --samples 8 --temperature "$T" --format "$FORMAT" "${FLAGS[@]}" --out "$G/P_samples_$T" --no-cache >/dev/null
    "$PY" - "$G" "$GATE" "$BEFORE" "$T" <<'PY' && break
import json, sys
from pathlib import Path
from sleuth.reward import is_valid_format
g, gate, before, t = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text()), sys.argv[4]
copies = {"query", "timbuktu city country", "girl with a pearl earring painter", "penicillin discovered year"}
real = lambda x: [q for q in x["queries"] if q.strip().lower() not in copies]
out = json.loads(gate.with_suffix(".partial").read_text()) if gate.with_suffix(".partial").exists() else {
    "S search search_r1_fewshot3_reask (attempt 9's gate)": before["S search search_r1_fewshot3_reask"]}
r = [json.loads(l) for l in (g / f"P_samples_{t}" / "trajectories.jsonl").read_text().splitlines() if l.strip()]
out[f"P samples search_r1_fewshot3_reask at temperature {t}"] = {
    "samples": len(r), "valid_sequences": sum(is_valid_format(x["response"]) for x in r),
    "samples_with_a_real_search": sum(bool(real(x)) for x in r),
    "samples_with_a_retrieval_hit": sum(bool(x["retrieval_hit"]) for x in r),
    "searches": sum(len(x["queries"]) for x in r), "answered": sum(x["stop_reason"] == "answered" for x in r),
    "em": sum(x["em"] for x in r), "em_with_a_real_search": sum(x["em"] for x in r if real(x))}
ok = out[f"P samples search_r1_fewshot3_reask at temperature {t}"]["em_with_a_real_search"] >= 3
last = t == "0.5"
if ok or last:
    out["gate"] = "go" if ok else "stop"
    if ok:
        out["temperature"] = float(t)
    gate.write_text(json.dumps(out, indent=1) + "\n")
    gate.with_suffix(".partial").unlink(missing_ok=True)
else:
    gate.with_suffix(".partial").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps(out, indent=1))
sys.exit(0 if ok or last else 1)
PY
  done
  exit
fi

"$PY" -c "import json, sys; sys.exit(json.load(open('$GATE'))['gate'] != 'go')" 2>/dev/null \
  || { echo "the gate has not said go ($GATE): attempt 10 stops there, as registered" >&2; exit 2; }
SET="--set data.train_files=[runs/rl_gain/P.jsonl] --set reward.read_corrective=false"
SET="$SET --set rollout.format=$FORMAT --set reward.retrieval_score=0.1"  # attempt 6, in this prompt
SET="$SET --set reward.format_requires_search=true"  # attempt 7's reward
T=$("$PY" -c "import json; print(json.load(open('$GATE'))['temperature'])")
SET="$SET --set rollout.temperature=$T"  # attempt 10's change: the gate's temperature
OUT=runs/gemma3/zero10
BASE_TAR=$ROOT/docs/experiments/gemma3_zero10_base.tar.gz
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
