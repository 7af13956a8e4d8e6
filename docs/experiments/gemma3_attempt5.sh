#!/usr/bin/env bash
# Issue #36, attempt 5, as registered in docs/results.md ("Pre-registered: RL from zero on Gemma-3-270M, attempt
# 5"): the answer judged by its token F1 (reward.answer_metric f1) in attempt 3's setting. Two phases, each run from
# the checkout's root on an otherwise idle machine:
#   nohup bash docs/experiments/gemma3_attempt5.sh select > runs/gemma3/attempt5_sel.log 2>&1 &   # (~45 min)
#   nohup bash docs/experiments/gemma3_attempt5.sh report > runs/gemma3/zero5.log 2>&1 &          # (~2.4 h)
# `select`: arm K resumes attempt 3's reported run from its step-40 checkpoint (a policy that searches for its
# question) with the F1 answer term for the same 6 steps attempt 3 ran with exact match (arm L: its step-46
# checkpoint); both evaluated on the first 200 of S; the gate compares them. `report` refuses to start unless the
# gate said go: 120 minutes of RL from the base model with the F1 answer term, RL's evaluations into
# runs/gemma3/zero5, the base rows restored from attempt 3's (the same prompt and model).
# Both run at the registered code (REG below): from this checkout where its sleuth/, configs/ and examples/ (but the
# summary script) equal REG's, else from a worktree at REG beside it (as attempt 4's script).
set -euo pipefail
usage() { echo "usage: $0 select|report" >&2; exit 2; }
[ $# -eq 1 ] || usage
MODE=$1
case "$MODE" in select|report) ;; *) usage ;; esac
cd "$(dirname "$0")/../.."
ROOT=$PWD
REG=8156721  # the code attempt 5 is registered at (docs/results.md)
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
# attempt 3's arm F (its settings as its script gave them), and the F1 answer term
SET="--set data.train_files=[runs/rl_gain/P.jsonl] --set reward.read_corrective=false --set rollout.format=search_r1_fewshot"
SET="$SET --set reward.retrieval_score=0.1 --set reward.answer_metric=f1"
SEL=runs/gemma3/attempt5_sel
GATE=$ROOT/docs/experiments/gemma3_attempt5_gate.json

if [ "$MODE" = select ]; then
  Z3=runs/gemma3/zero3/rl
  [ -f "$Z3/checkpoints/step_000040/trainer_state.pt" ] && [ -f "$Z3/checkpoints/step_000046/policy/model.safetensors" ] \
    || { echo "attempt 3's step-40 and step-46 checkpoints are needed in $Z3/checkpoints" >&2; exit 2; }
  K=$SEL/K/rl
  if [ ! -e "$K/checkpoints/latest" ]; then  # attempt 3's run as it stood after step 40 (checkpoint linked, not copied)
    mkdir -p "$K/checkpoints"
    cp -al "$Z3/checkpoints/step_000040" "$K/checkpoints/step_000040"
    echo step_000040 > "$K/checkpoints/latest"
    "$PY" - "$Z3" "$K" <<'PY'
import json, sys
from pathlib import Path
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
for name in ("metrics.jsonl", "samples.jsonl"):
    rows = [l for l in (src / name).read_text().splitlines() if l.strip() and json.loads(l)["step"] <= 40]
    (dst / name).write_text("".join(l + "\n" for l in rows))
PY
  fi
  echo "== arm K: steps 41-46 with the F1 answer term ($(date -u +%FT%TZ))"
  # shellcheck disable=SC2086  # SET is word-split on purpose
  [ -e "$SEL/K/done" ] || { "$SLEUTH" train --config "$Z3/config.yaml" $SET --set train.total_steps=46 \
    --set train.time_limit_minutes=null --set "data.eval_files=[runs/rl_gain/S.jsonl]" --set train.eval_limit=1 \
    --out "$K" --resume --json && touch "$SEL/K/done"; }
  FLAGS=(--data runs/rl_gain/S.jsonl --limit 200 --format search_r1_fewshot --corpus ../shared/data/corpus/wiki_dev.jsonl
         --topk 3 --max-turns 2 --max-tokens-per-turn 128 --max-context-tokens 1024 --set rollout.max_obs_tokens=300
         --no-compare --json)  # attempt 3's selection evaluation (sel_F/eval_S)
  for arm in L K; do
    model=$K/checkpoints/step_000046/policy
    [ "$arm" = L ] && model=$Z3/checkpoints/step_000046/policy
    echo "== arm $arm: evaluation on S ($(date -u +%FT%TZ))"
    [ -e "$SEL/$arm/eval_S/report.md" ] || "$SLEUTH" eval --model "$model" "${FLAGS[@]}" --out "$SEL/$arm/eval_S"
  done
  "$PY" - "$SEL" "$GATE" <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, "examples")
from recipe_summary import paired_bootstrap
sel, gate = Path(sys.argv[1]), Path(sys.argv[2])
rows = {arm: {r["id"]: r for r in map(json.loads, (sel / arm / "eval_S" / "trajectories.jsonl").read_text().splitlines())}
        for arm in ("L", "K")}
ids = sorted(rows["L"])
assert sorted(rows["K"]) == ids, "the two evaluations hold different questions"
out = {}
for arm in ("L", "K"):
    r = [rows[arm][i] for i in ids]
    out[arm] = {"questions": len(r), "em": sum(x["em"] for x in r) / len(r), "f1": sum(x["f1"] for x in r) / len(r),
                "cover_em": sum(x["cover_em"] for x in r) / len(r), "searches": sum(x["searches"] for x in r) / len(r),
                "retrieval_hit": sum(x["retrieval_hit"] for x in r) / len(r),
                "answered": sum(x["stop_reason"] == "answered" for x in r) / len(r)}
for metric in ("f1", "em"):
    d, lo, hi = paired_bootstrap([rows["L"][i][metric] for i in ids], [rows["K"][i][metric] for i in ids])
    out[f"K-L {metric} (paired bootstrap 95%, 10,000 resamples, seed 0)"] = [d, lo, hi]
go = out["K"]["f1"] > out["L"]["f1"] and out["K"]["em"] >= out["L"]["em"]
out["gate"] = "go" if go else "stop"
if not gate.exists():
    gate.write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps(out, indent=1))
PY
  exit
fi

"$PY" -c "import json, sys; sys.exit(json.load(open('$GATE'))['gate'] != 'go')" 2>/dev/null \
  || { echo "the selection has not passed its gate ($GATE): attempt 5 stops there, as registered" >&2; exit 2; }
OUT=runs/gemma3/zero5
if [ ! -e "$OUT" ]; then  # attempt 3's base rows: the same model, prompt and evaluation setting
  mkdir -p "$OUT" && tar -xzf "$ROOT/docs/experiments/gemma3_zero3_base.tar.gz" -C "$OUT"
  echo "restored the base evaluations from docs/experiments/gemma3_zero3_base.tar.gz"
fi
echo "== the reported run ($(date -u +%FT%TZ))"
REWARD=search_r1 RL_MINUTES=120 SFT_ROUTE=0 CONFIRM=runs/rl_gain/C.jsonl SLEUTH_SET="$SET" examples/gemma3_zero.sh "$OUT"
echo "== done ($(date -u +%FT%TZ))"
