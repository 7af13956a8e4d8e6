"""Sleuth's own trainer step on one device: the reference pass and ``policy_update``, as training runs them.

    python bench/gpu_trainer_step.py [--json] [--device auto] [--model random-smollm2|random-qwen2|FILE.gguf]
                                     [--rows 256] [--group-size 8] [--micro-batch-size 64] [--max-tokens 32768]
                                     [--repeats 2] [--arms off,on] [--peak-tflops T] [--measured-peak-tflops T]
                                     [--queries 2] [--threads N] [--tiny]

Not HF's loss loop (``bench/gpu_train.py`` times that): float32 master weights, every forward under
``compute_autocast('bfloat16', device)``, AdamW as ``sleuth/train/state.py`` makes it, the frozen
reference a bf16 deepcopy of the policy, GRPO advantages and the config of ``configs/smollm2_nq.yaml``
(clip 0.2/0.28, k3 KL in the loss, lr 1e-5) with ``micro_batch_size`` / ``max_tokens_per_micro_batch``
from the flags. Rows are the recipe's (``bench/train.py``'s ``rollout_rows``, layout ``search``):
groups of ``--group-size`` rows with one 180-token prompt, then 40 sampled, 300 observation (loss mask
0) and 60 sampled tokens; all but ``--queries - 1`` rows of a group share the first turn and its
observation (``--tiny``: a toy model and the same spans at a quarter of their length). The old
logprobs are computed once, untimed (the trainer takes the sampler's).

Each arm (``share_prefix`` off: length-bucketed whole rows; on: ``train.share_prefix``) starts from
the same weights with a fresh AdamW, runs one warm-up step, then ``--repeats`` timed steps of
(reference pass + update). Figures per arm (best of the timed steps):

* ``update_s`` / ``reference_s``: wall time of ``policy_update`` / of the reference's ``batched_logprobs``;
* ``tokens``: real tokens (attention-mask sum); ``tokens_per_s`` = tokens / update_s;
  ``computed_slots``: token slots the micro-batches compute (padding included; shared prefixes once);
* ``achieved_tflops`` = 6 N tokens / update_s (N parameters, tied embedding once), the conventional
  model-FLOPs count of the whole rows: Sleuth does less work (the output layer at trained tokens only;
  with shared prefixes, common tokens once), so its savings show as a higher figure. ``_incl_attention``
  adds ``12 L H T`` per token of a row of T tokens (PaLM, appendix B, as gpu_train.py);
  ``reference_tflops`` = 2 N tokens / reference_s (forward only);
* ``mfu`` = achieved / the spec peak (989 TFLOP/s on H100 SXM; ``--peak-tflops`` overrides);
  ``mfu_measured_peak`` = achieved / the measured peak (``--measured-peak-tflops``; default 798 on an
  H100 SXM: the bf16 8192^3 matmul measured on this project's H100; ``measured_peak_source`` says which);
* ``measured_reference_gib`` / ``measured_update_gib``: ``torch.cuda.max_memory_allocated`` of each
  phase (peak reset before each), against ``plan_update_gib``, the memory plan's update phase
  (``sleuth/train/memory_plan.make_plan`` for this config and model shape): ``update_gib_ratio``
  = measured / plan. Null on CPU;
* ``first_step_loss`` / ``first_step_kl`` (the warm-up update's ``algo/loss`` and ``algo/kl``: the KL of
  the bf16 reference at step 0) and ``params_moved_share`` (parameter tensors changed by it;
  ``params_moved`` when all did). ``first_step_loss_abs_diff``: between the arms, whose first updates
  start from the same weights and old logprobs (whole rows); bf16 rounding of the two paths only.

An arm that runs out of memory is recorded (``status: oom``) and the next arm runs; any other error is
recorded as ``status: error`` and the exit status is 1, as it is when a warm-up step moves no weights or
gives a non-finite loss. Goal (issue #32): MFU >= 0.25 for the 0.5B shape (``--model random-qwen2``).
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
import traceback
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from gpu_common import (  # noqa: E402
    add_common_args,
    add_model_arg,
    device_spec,
    partial,
    free_memory,
    load_bench_model,
    num_params,
    peak_memory_gb,
    report,
    resolve_device,
    synchronize,
)
from train import LAYOUTS, rollout_rows  # noqa: E402

from sleuth.config_file import load_config  # noqa: E402
from sleuth.models import DTYPES, compute_autocast  # noqa: E402
from sleuth.train.forward import batched_logprobs, length_buckets  # noqa: E402
from sleuth.train.prefix_share import common_prefix_len, computed_slots, prefix_buckets  # noqa: E402
from sleuth.train.update import UpdateBatch, compute_advantages, policy_update  # noqa: E402
from sleuth.train.layout import RowLayout

CONFIG = BENCH.parent / "configs" / "smollm2_nq.yaml"
DTYPE = "bfloat16"
MEASURED_PEAK = {"H100 SXM": 798.0}  # bf16 dense matmul (8192^3) measured on this project's H100
MFU_GOAL = 0.25  # issue #32: update MFU at the 0.5B shape, bf16
FULL = {"rows": 256, "group_size": 8, "micro_batch_size": 64, "max_tokens": 32768, "repeats": 2}
TINY = {"rows": 16, "group_size": 4, "micro_batch_size": 8, "max_tokens": 4096, "repeats": 1}
RECIPE = LAYOUTS["search"]  # prompt 180, sampled 40, observation 300, sampled 60
TINY_LAYOUT = [(kind, n // 4) for kind, n in RECIPE]  # --tiny: the same spans at a quarter of their length


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def build_batch(vocab: int, rows: int, group_size: int, queries: int, tiny: bool = False, seed: int = 0):
    """``(input_ids_BT, attention_mask_BT, loss_mask_BT)`` of recipe-shaped rows (``rollout_rows``)."""
    return rollout_rows(vocab, rows, TINY_LAYOUT if tiny else RECIPE, seed=seed, group_size=group_size,
                        queries=queries)


def micro_batches(ids_BT, att_BT, shared: bool, mbs: int, max_tokens: int) -> tuple[int, int]:
    """``(micro-batches, token slots computed)`` of the update's (and reference pass's) buckets."""
    lengths = att_BT.sum(-1).tolist()
    if not shared:
        buckets = length_buckets(lengths, mbs, max_tokens)
        return len(buckets), sum(len(b) * max(lengths[i] for i in b) for b in buckets)
    buckets = prefix_buckets(ids_BT, att_BT, mbs, max_tokens)
    slots = 0
    for rows in buckets:
        idx = torch.tensor(rows, device=ids_BT.device)
        lens = att_BT[idx].sum(-1)
        slots += computed_slots(len(rows), common_prefix_len(ids_BT[idx], lens), int(lens.max()))
    return len(buckets), slots


def plan_config(args):
    """configs/smollm2_nq.yaml in the GPU configuration this bench runs (the plan and the algorithm)."""
    return load_config(CONFIG, [f"model.dtype={DTYPE}", f"train.micro_batch_size={args.micro_batch_size}",
                                f"train.max_tokens_per_micro_batch={args.max_tokens}",
                                f"rollout.group_size={args.group_size}",
                                f"train.questions_per_step={args.rows // args.group_size}"])


def plan_figures(hf_config, cfg, device=None) -> dict:
    """The memory plan's update (and optimizer-step) phase for this config and the model's shape, GiB (on
    ``device``'s kind: the output layer's chunk size differs on CUDA)."""
    from sleuth.train.memory_plan import ModelShape, make_plan

    kind = "cuda" if device is not None and torch.device(device).type == "cuda" else ""
    plan = make_plan(cfg, ModelShape.from_config(hf_config), device=kind)
    return {"plan_update_gib": plan.phases["update"][0] / 2**30,
            "plan_optimizer_step_gib": plan.phases["optimizer step"][0] / 2**30}


def measured_peak(spec: dict, given: float | None) -> tuple[float | None, str | None]:
    if given is not None:
        return given, "--measured-peak-tflops"
    if spec["spec"] in MEASURED_PEAK:
        return MEASURED_PEAK[spec["spec"]], f"default for {spec['spec']}: bf16 8192^3 matmul, the project's H100"
    return None, None


class Bench:
    """The model, its frozen reference, the batch and the config, shared by the arms."""

    def __init__(self, policy, cfg, args, device, *, peak, measured, plan_update_gib):
        self.policy, self.cfg, self.args, self.device, self.algo = policy, cfg, args, device, cfg.algo
        self.peak, self.measured, self.plan_update_gib = peak, measured, plan_update_gib
        c = policy.config.get_text_config() if hasattr(policy.config, "get_text_config") else policy.config
        self.layers, self.hidden, self.vocab = c.num_hidden_layers, c.hidden_size, c.vocab_size
        self.n_params = num_params(policy)
        batch = build_batch(self.vocab, args.rows, args.group_size, args.queries, tiny=args.tiny)
        self.ids, self.att, self.mask = (t.to(device) for t in batch)
        self.init = {k: v.detach().to("cpu", copy=True) for k, v in policy.state_dict().items()}
        self.ref = copy.deepcopy(policy).eval().requires_grad_(False).to(DTYPES[DTYPE])  # as state.py makes it
        policy.eval()
        with compute_autocast(DTYPE, device):  # the old policy's logprobs: once, untimed
            self.old = batched_logprobs(policy, self.ids, self.att, micro_batch_size=args.micro_batch_size,
                                        max_tokens=args.max_tokens, needed_BT=self.mask)
        g = torch.Generator().manual_seed(1)
        scores = torch.rand(args.rows, generator=g).to(device)
        groups = [f"q{i // args.group_size}" for i in range(args.rows)]
        self.adv, _ = compute_advantages(self.algo, scores, groups, self.mask)
        self.tokens = int(self.att.sum())
        lengths = self.att.sum(-1).double()
        self.model_flops = 6 * self.n_params * self.tokens  # forward + backward of the whole rows
        self.attn_flops = float(12 * self.layers * self.hidden * (lengths**2).sum())

    def moved_share(self) -> float:
        named = list(self.policy.named_parameters())
        return sum(not torch.equal(p.detach().cpu(), self.init[n]) for n, p in named) / len(named)

    def step(self, opt, shared: bool) -> dict:
        """One reference pass + one update (the trainer's order and autocast nesting); times and peaks."""
        a, dev, out = self.args, self.device, {}
        _reset_peak(dev)
        synchronize(dev)
        t0 = time.perf_counter()
        with compute_autocast(DTYPE, dev):  # the step's context (Trainer.compute)
            ref_lp = batched_logprobs(self.ref, self.ids, self.att, micro_batch_size=a.micro_batch_size,
                                      max_tokens=a.max_tokens, needed_BT=self.mask, shared_prefix=shared)
            synchronize(dev)
            out["reference_s"], out["reference_gib"] = time.perf_counter() - t0, peak_memory_gb(dev)
            batch = UpdateBatch(self.ids, self.att, self.mask, self.adv, self.old, sampler_logprobs_BT=self.old,
                                ref_logprobs_BT=ref_lp)
            self.policy.train()
            _reset_peak(dev)
            t1 = time.perf_counter()
            with compute_autocast(DTYPE, dev):  # the update's own context, nested as in Trainer._train_step
                metrics = policy_update(self.policy, opt, batch, self.algo,
                                        RowLayout("shared_prefix" if shared else "padded", a.micro_batch_size,
                                                  a.max_tokens), grad_clip=self.cfg.train.grad_clip,
                                        norm_len=self.cfg.rollout.max_context_tokens)
            synchronize(dev)
            out["update_s"], out["update_gib"] = time.perf_counter() - t1, peak_memory_gb(dev)
        out.update(loss=metrics["algo/loss"], kl=metrics.get("algo/kl"))
        print(f"share_prefix={'on' if shared else 'off'}: reference {out['reference_s']:.3f} s, update "
              f"{out['update_s']:.3f} s, loss {out['loss']:.4g}", file=sys.stderr, flush=True)  # progress, for logs
        return out

    def profiled_step(self, opt, shared: bool, top: int = 10) -> dict:
        """One more step under torch.profiler: the ops that took the most device time and the most host
        time (with their call counts), to tell launch- or allocator-bound steps from compute-bound ones."""
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        with profile(activities=acts) as prof:
            self.step(opt, shared)
        events = prof.key_averages()

        def rows(attr):
            best = sorted(events, key=lambda e: getattr(e, attr, 0) or 0, reverse=True)[:top]
            return [{"op": e.key, "calls": e.count, "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 2),
                     "self_device_ms": round((getattr(e, "self_device_time_total", 0) or 0) / 1e3, 2)} for e in best]

        return {"by_device_time": rows("self_device_time_total") if self.device.type == "cuda" else [],
                "by_host_time": rows("self_cpu_time_total"),
                "device_ms_total": round(sum(getattr(e, "self_device_time_total", 0) or 0 for e in events) / 1e3, 1),
                "host_ms_total": round(sum(e.self_cpu_time_total for e in events) / 1e3, 1)}

    def arm(self, shared: bool, out: dict) -> None:
        """Warm-up + timed steps from the initial weights with a fresh AdamW (see the module docstring),
        their figures into ``out`` (the warm-up's as soon as it is done: a later failure keeps them)."""
        a, tc = self.args, self.cfg.train
        self.policy.load_state_dict(self.init)
        opt = torch.optim.AdamW([p for p in self.policy.parameters() if p.requires_grad], lr=tc.lr,
                                weight_decay=tc.weight_decay)
        first = self.step(opt, shared)
        moved = self.moved_share()
        out.update(first_step_loss=first["loss"], first_step_kl=first["kl"], params_moved_share=moved,
                   params_moved=moved == 1.0)
        runs = [self.step(opt, shared) for _ in range(a.repeats)]
        if a.profile:
            out["profile"] = self.profiled_step(opt, shared)
        del opt
        n_mb, slots = micro_batches(self.ids, self.att, shared, a.micro_batch_size, a.max_tokens)
        update_s, reference_s = min(r["update_s"] for r in runs), min(r["reference_s"] for r in runs)
        out.update({"status": "ok", "update_s": update_s, "reference_s": reference_s,
               "update_all_s": [r["update_s"] for r in runs], "reference_all_s": [r["reference_s"] for r in runs],
               "tokens": self.tokens, "tokens_per_s": self.tokens / update_s,
               "step_tokens_per_s": self.tokens / (update_s + reference_s),
               "micro_batches": n_mb, "computed_slots": slots, "computed_slots_per_s": slots / update_s,
               "achieved_tflops": self.model_flops / update_s / 1e12,
               "achieved_tflops_incl_attention": (self.model_flops + self.attn_flops) / update_s / 1e12,
               "reference_tflops": self.model_flops / 3 / reference_s / 1e12})  # forward only: 2 N per token
        for key, peak in (("", self.peak), ("_measured_peak", self.measured)):
            out["mfu" + key] = out["achieved_tflops"] / peak if peak else None
            out["mfu_incl_attention" + key] = out["achieved_tflops_incl_attention"] / peak if peak else None
        mem = [r["update_gib"] for r in runs]
        plan = self.plan_update_gib
        out.update(measured_reference_gib=max(r["reference_gib"] for r in runs) if self.device.type == "cuda" else None,
                   measured_update_gib=max(mem) if self.device.type == "cuda" else None, plan_update_gib=plan)
        out["update_gib_ratio"] = out["measured_update_gib"] / plan if out["measured_update_gib"] and plan else None


def run_arm(bench: Bench, name: str) -> dict:
    """``bench.arm`` with its failure recorded: out of memory (then freed) or any other error."""
    row = {"arm": name, "share_prefix": name == "on", "status": None}  # status: ok | oom | error
    try:
        bench.arm(name == "on", row)
    except torch.OutOfMemoryError as e:
        row.update(status="oom", error=f"out of memory: {(str(e).splitlines() or [''])[0]}")
    except Exception as e:  # noqa: BLE001 -- recorded, and the exit status says so
        traceback.print_exc(file=sys.stderr)
        row.update(status="error", error=f"{type(e).__name__}: {e}")
    bench.policy.zero_grad(set_to_none=True)
    torch.clear_autocast_cache()
    free_memory(bench.device)
    return row


def _setup_failed(result: dict, e: Exception, as_json: bool) -> int:
    traceback.print_exc(file=sys.stderr)
    result.update(error=f"setup: {type(e).__name__}: {e}", failed=["setup"])
    report(result, as_json)
    return 1


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap)
    add_model_arg(ap)
    ap.add_argument("--rows", type=int, help=f"rows of the batch (default {FULL['rows']}; --tiny {TINY['rows']})")
    ap.add_argument("--group-size", type=int, help="rows per GRPO group, one prompt (default 8)")
    ap.add_argument("--queries", type=int, default=2, help="distinct first turns per group (see rollout_rows)")
    ap.add_argument("--micro-batch-size", type=int, help="rows per micro-batch at most (default 64)")
    ap.add_argument("--max-tokens", type=int, help="token slots per micro-batch at most (default 32768)")
    ap.add_argument("--repeats", type=int, help="timed steps per arm after one warm-up (default 2)")
    ap.add_argument("--profile", action="store_true",
                    help="one more step per arm under torch.profiler: the top ops by device and by host time")
    ap.add_argument("--arms", default="off,on", help="share_prefix settings to run, in order: off, on or off,on")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads on a CPU run (default: 1 with --tiny, else torch's default)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="override the device's spec bf16 dense peak")
    ap.add_argument("--measured-peak-tflops", type=float, default=None,
                    help="the bf16 matmul peak measured on the machine (default: 798 on an H100 SXM, else none)")
    args = ap.parse_args(argv)
    for key, value in (TINY if args.tiny else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not args.arms or set(args.arms) - {"off", "on"}:
        ap.error(f"--arms takes off, on or off,on; got {','.join(args.arms)!r}")
    if args.rows % args.group_size or not 1 <= args.queries <= args.group_size or args.repeats < 1:
        ap.error("--rows must be a multiple of --group-size, 1 <= --queries <= --group-size, --repeats >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    t_start = time.perf_counter()
    args = parse(argv)
    device = resolve_device(args.device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # train.tf32 (default true) on a GPU run
    elif args.threads or args.tiny:  # a toy model's small matmuls run fastest on one thread (train.cpu_threads)
        torch.set_num_threads(args.threads or 1)
    spec = device_spec(device, peak_tflops=args.peak_tflops)
    measured, source = measured_peak(spec, args.measured_peak_tflops)
    result = {**spec, "measured_peak_tflops": measured, "measured_peak_source": source, "model": args.model,
              "dtype": f"float32 master weights, {DTYPE} autocast", "rows": args.rows, "group_size": args.group_size,
              "queries": args.queries, "micro_batch_size": args.micro_batch_size, "max_tokens": args.max_tokens,
              "repeats": args.repeats, "mfu_goal": MFU_GOAL}
    try:
        cfg = plan_config(args)
        policy, _, result["model"] = load_bench_model(args.model, device, tiny=args.tiny)
    except Exception as e:  # noqa: BLE001 -- nothing to measure: recorded, exit 1
        return _setup_failed(result, e, args.json)
    try:
        plan = plan_figures(policy.config, cfg, device)
    except Exception as e:  # noqa: BLE001 -- the other figures stand
        plan = {"plan_update_gib": None, "plan_error": f"{type(e).__name__}: {e}"}
    try:
        bench = Bench(policy, cfg, args, device, peak=spec["peak_tflops"], measured=measured,
                      plan_update_gib=plan["plan_update_gib"])
    except Exception as e:  # noqa: BLE001
        return _setup_failed(result, e, args.json)
    result.update(params=bench.n_params, layers=bench.layers, hidden=bench.hidden, vocab=bench.vocab,
                  layout=[n for _, n in (TINY_LAYOUT if args.tiny else RECIPE)], tokens_per_row=bench.ids.shape[1],
                  tokens=bench.tokens, trained_tokens=int(bench.mask.sum()), **plan)
    result["arms"] = []
    for name in args.arms:
        result["arms"].append(run_arm(bench, name))
        partial(result, t_start)
    losses = [r["first_step_loss"] for r in result["arms"] if r["status"] == "ok"]
    if len(losses) == 2:  # the same first update, whole rows or shared prefixes: equal to rounding
        result["first_step_loss_abs_diff"] = abs(losses[0] - losses[1])
    result["failed"] = [r["arm"] for r in result["arms"] if r["status"] == "error" or (
        r["status"] == "ok" and not (r["params_moved"] and math.isfinite(r["first_step_loss"])))]
    result["out_of_memory"] = [r["arm"] for r in result["arms"] if r["status"] == "oom"]
    result["wall_s"] = time.perf_counter() - t_start
    report(result, args.json)
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
