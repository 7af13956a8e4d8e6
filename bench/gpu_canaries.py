"""Correctness canaries of Sleuth's training path in the training configuration: float32 master
weights, bf16 compute under ``sleuth.models.compute_autocast("bfloat16", device)``. The GPU check's
first step (issue #32; review items 2, 3, 5, 6 of reviews/gpu-readiness.md).

    python bench/gpu_canaries.py [--model PATH.gguf | random-smollm2] [--device auto] [--tiny] [--json]

Each canary runs on its own (an exception is recorded as ``error`` with ``pass: false``) and reports
``{name, pass, figures...}``; ``all_pass`` is true when no canary has ``pass: false``:

1. ``linear_grads``: the trainer's nesting (``loop.py``: an outer autocast with its cache on around
   the rollout with Sleuth's HF backend, the no-grad ``batched_logprobs`` pass, then ``policy_update``
   inside a nested autocast). At the optimizer step (a step pre-hook; lr 0, so nothing moves) every
   ``nn.Linear`` weight and every parameter that requires grad must hold a non-zero gradient.
   ``torch_autocast_cache_drops_grad`` is torch's own behaviour, no Sleuth code: a plain ``nn.Linear``
   run under ``no_grad`` then with grad in one autocast context; true = its weight got no gradient
   (torch builds without pytorch#165068; ``policy_update`` clears the cache first, so Sleuth is safe).
2. ``master_weights_move``: one ``policy_update`` (AdamW, lr 1e-6) on the float32 master weights under
   bf16 autocast, and the same on a bf16-parameter copy: the share of parameter elements that changed.
   Pass: float32 share >= 0.8 (bf16 parameters round most of such a step away).
3. ``kv_dtypes``: the dtypes of the keys and values the HF backend keeps in its cache while generating
   under the autocast, their bytes per token per layer, against what ``memory_plan.make_plan`` counts
   (its ``KV cache`` item per row, token and layer). Pass: measured <= plan x 1.05 (float32 keys
   make it 1.5).
4. ``sampler_vs_trainer``: at lr 0 the sampler's logprob of each sampled token (temperature 1) against
   ``token_logprobs`` of the same rows under the same autocast: mean/max |delta|, mean exp(delta),
   the share of tokens with |ratio - 1| above 0.2 / 0.28 (PPO clip fractions). Pass: mean |delta| <
   1e-2 and clipfrac(0.2) == 0. ``f32_*``: the same in float32 compute (no autocast), a control.
5. ``reference_kl_step0``: the reference made as ``state.py`` makes it (a bf16 deepcopy) against the
   policy under autocast on sampled rows: mean |delta| and the mean k3 estimate
   (``sleuth.algo.kl``) at step 0. Pass: k3 mean < 1e-3.

Random-weight models have no tokenizer: the backend gets a stand-in carrying only ``pad_token_id``
(no stop strings, ``eos_token_ids=[]``, so every row runs to its cap; a real tokenizer is used as is,
eos ignored likewise). Prompts are random token ids from a seeded generator.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import (  # noqa: E402
    add_common_args,
    add_model_arg,
    free_memory,
    load_bench_model,
    partial,
    report,
    resolve_device,
    synchronize,
)

from sleuth.algo.aggregate import masked_mean  # noqa: E402
from sleuth.algo.kl import kl_estimate  # noqa: E402
from sleuth.config import AlgoConfig, Config  # noqa: E402
from sleuth.models import DTYPES, compute_autocast, reference_dtype  # noqa: E402
from sleuth.rollout.backends import SamplingParams  # noqa: E402
from sleuth.rollout.hf_backend import HFBackend  # noqa: E402
from sleuth.rollout.hf_static import StaticHFBackend  # noqa: E402
from sleuth.train.forward import batched_logprobs, token_logprobs  # noqa: E402
from sleuth.train.memory_plan import ModelShape, make_plan  # noqa: E402
from sleuth.train.sampler_gap import SamplerGap  # noqa: E402
from sleuth.train.update import UpdateBatch, policy_update  # noqa: E402
from sleuth.train.layout import RowLayout

DT = "bfloat16"
# (prompts, group size, prompt tokens, new tokens): the update's rows, the sampled rows of canaries 3-5
SIZES = {"full": {"update": (8, 8, 100, 60), "sample": (8, 4, 100, 40), "micro": 16},
         "tiny": {"update": (2, 2, 12, 8), "sample": (2, 2, 12, 6), "micro": 2}}
CLIP, CLIP_HIGH = 0.2, 0.28


def backend(model, tokenizer, kind: str) -> HFBackend:
    """Sleuth's HF backend as ``rollout.backend`` names it (``hf``, or ``hf_static`` uncompiled)."""
    tok = tokenizer if tokenizer is not None else types.SimpleNamespace(pad_token_id=0)  # ids only
    if kind == "hf_static":
        return StaticHFBackend(model, tok, eos_token_ids=[], compile=False)
    return HFBackend(model, tok, eos_token_ids=[])


def sample(model, tokenizer, sizes, spec, seed: int):
    """Sample ``spec = (prompts, group, prompt_len, new)`` under whatever context the caller holds:
    ``(ids_BT, att_BT, mask_BT, sampler_logprobs_BT)``, right-padded, column t = token t (as
    ``sleuth.train.forward``), the mask on the sampled tokens."""
    n, group, plen, new = spec
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for i in range(n):  # lengths vary a little: the sampler left-pads, the trainer right-pads
        p = torch.randint(1, vocab, (max(plen - 3 * i, 2),), generator=g).tolist()
        prompts += [p] * group
    seeds = [seed * 1000 + i for i in range(len(prompts))]
    model.eval()
    params = SamplingParams(max_new_tokens=new, temperature=1.0)
    out = backend(model, tokenizer, sizes["backend"]).generate(prompts, params, seeds)
    T = max(len(p) + len(r.token_ids) for p, r in zip(prompts, out))
    ids, att, mask = (torch.zeros(len(prompts), T, dtype=torch.long) for _ in range(3))
    lp = torch.zeros(len(prompts), T)
    for b, (p, r) in enumerate(zip(prompts, out)):
        row, k = p + r.token_ids, len(p)
        ids[b, : len(row)], att[b, : len(row)] = torch.tensor(row), 1
        mask[b, k : len(row)] = 1
        lp[b, k : len(row)] = torch.tensor(r.logprobs)
    dev = next(model.parameters()).device
    return ids.to(dev), att.to(dev), mask.to(dev), lp.to(dev)


def update_batch(ids, att, mask, old, seed: int) -> UpdateBatch:
    """Advantages +-1 per row (never zero) on the sampled tokens; old = reference logprobs (KL 0)."""
    sign = torch.randint(0, 2, (ids.shape[0],), generator=torch.Generator().manual_seed(seed)) * 2.0 - 1.0
    adv = sign.to(ids.device)[:, None] * mask.float()
    return UpdateBatch(ids, att, mask, adv, old, sampler_logprobs_BT=old, ref_logprobs_BT=old)


def run_update(model, batch, sizes, lr: float, on_step=None) -> dict:
    """One ``policy_update`` (one mini-batch, one epoch, default algo: GRPO loss, k3 KL term) with AdamW
    at ``lr`` over the parameters that require grad; ``on_step(params)`` sees them before the step."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    if on_step is not None:
        opt.register_step_pre_hook(lambda o, args, kwargs: on_step(model))
    model.train()
    try:
        return policy_update(model, opt, batch, AlgoConfig(), RowLayout("padded", sizes["micro"]), mini_batches=1,
                             epochs=1, grad_clip=1.0, temperature=1.0)
    finally:
        model.eval()


def torch_cache_drops_grad(dev) -> bool:
    """torch alone: a float32 ``nn.Linear`` run under no_grad, then with grad, in one autocast context
    with its cache on; True when the weight then got no gradient (the pre-#165068 behaviour)."""
    lin = torch.nn.Linear(16, 16, device=dev)
    x = torch.randn(4, 16, device=dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16, cache_enabled=True):
        with torch.no_grad():
            lin(x)
        lin(x).float().sum().backward()
    return lin.weight.grad is None


def linear_grads(model, tok, dev, sizes) -> dict:
    out: dict = {}
    try:
        out["torch_autocast_cache_drops_grad"] = torch_cache_drops_grad(dev)
    except Exception as e:  # a figure, not the canary's verdict
        out["torch_autocast_cache_drops_grad"], out["torch_probe_error"] = None, f"{type(e).__name__}: {e}"
    seen: dict = {}

    def record(m):
        seen.update({id(p): p.grad is not None and bool(p.grad.ne(0).any()) for p in m.parameters()})

    with compute_autocast(DT, dev):  # the step's context (loop.py train_step), cache on
        ids, att, mask, _ = sample(model, tok, sizes, sizes["update"], seed=1)  # the rollout (no_grad)
        old = batched_logprobs(model, ids, att, micro_batch_size=sizes["micro"], needed_BT=mask)
        with compute_autocast(DT, dev, cache=True):  # the update's nested context
            metrics = run_update(model, update_batch(ids, att, mask, old, 1), sizes, lr=0.0, on_step=record)
    linears = {n + ".weight": m.weight for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    bad_lin = [n for n, p in linears.items() if not seen.get(id(p), False)]
    bad_all = [n for n, p in trainable.items() if not seen.get(id(p), False)]
    out.update(rows=int(ids.shape[0]), tokens=int(att.sum()), optimizer_step_reached=bool(seen),
               optimizer_steps=metrics.get("algo/optimizer_steps"), linear_weights=len(linears),
               linear_without_grad=len(bad_lin), trainable_params=len(trainable),
               trainable_without_grad=len(bad_all), without_grad_names=sorted(set(bad_lin + bad_all))[:8])
    out["pass"] = bool(seen) and not bad_lin and not bad_all
    return out


def master_weights_move(model, tok, dev, sizes) -> dict:
    lr = 1e-6
    g = torch.Generator().manual_seed(2)
    n, group, plen, new = sizes["update"]
    ids = torch.randint(1, model.config.vocab_size, (n * group, plen + new), generator=g).to(dev)
    att, mask = torch.ones_like(ids), torch.zeros_like(ids)
    mask[:, plen:] = 1
    out = {"lr": lr}
    for label, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        copy_ = copy.deepcopy(model).to(dtype)
        before = [p.detach().clone() for p in copy_.parameters()]
        with compute_autocast(DT, dev):  # a bf16 copy computes in bf16 with or without it
            old = batched_logprobs(copy_, ids, att, micro_batch_size=sizes["micro"], needed_BT=mask).float()
            run_update(copy_, update_batch(ids, att, mask, old, 2), sizes, lr=lr)
        changed = sum(int(p.detach().ne(b).sum()) for p, b in zip(copy_.parameters(), before))
        total = sum(b.numel() for b in before)
        out[f"{label}_share_changed"], out[f"{label}_elements"] = changed / total, total
        del copy_, before
        free_memory(dev)
    out["pass"] = out["f32_share_changed"] >= 0.8
    return out


def kv_dtypes(model, tok, dev, sizes) -> dict:
    caches: list = []

    def grab(module, args, kwargs):
        c = kwargs.get("cache", kwargs.get("past_key_values"))
        if c is not None and all(c is not seen for seen in caches):
            caches.append(c)

    handle = model.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with compute_autocast(DT, dev):
            sample(model, tok, sizes, sizes["sample"], seed=3)
    finally:
        handle.remove()
    layers = [layer for c in caches for layer in c.layers if getattr(layer, "keys", None) is not None]
    decode = caches[-1].layers[-1]  # the prefill's and decode's cache (a shared-prompt prefix's comes first)
    k, v = decode.keys, decode.values  # [B, H, L, D] each
    measured = k.shape[1] * k.shape[3] * k.element_size() + v.shape[1] * v.shape[3] * v.element_size()
    cfg = Config()
    cfg.model.dtype, cfg.train.questions_per_step, cfg.rollout.group_size = DT, 1, 1
    cfg.rollout.max_concurrent_rows, cfg.rollout.max_context_tokens = None, 1024
    shape = ModelShape.from_config(model.config)
    plan = make_plan(cfg, shape).items["KV cache"] / (1024 * shape.layers)  # one row, per token and layer
    return {"k_dtype": str(k.dtype), "v_dtype": str(v.dtype), "cache_layer": type(decode).__name__,
            "caches_seen": len(caches), "all_k_dtypes": sorted({str(x.keys.dtype) for x in layers}),
            "measured_bytes_per_token": measured, "plan_bytes_per_token": plan, "ratio": measured / plan,
            "pass": measured <= plan * 1.05}


def gap_figures(a_BT, b_BT, mask_BT) -> dict:
    """|a - b| over the masked tokens and PPO's ratio exp(a - b) there."""
    d = (a_BT - b_BT).float()[mask_BT.bool()]
    r = d.exp()
    return {"tokens": int(d.numel()), "mean_abs_delta": float(d.abs().mean()), "max_abs_delta": float(d.abs().max()),
            "mean_ratio": float(r.mean()), "clipfrac_0.2": float(((r - 1).abs() > CLIP).float().mean()),
            "clipfrac_0.28": float(((r - 1).abs() > CLIP_HIGH).float().mean())}


def sampler_vs_trainer(model, tok, dev, sizes) -> dict:
    out = {"clip_threshold": CLIP, "mean_abs_delta_limit": Config().train.sampler_max_gap}
    for prefix, dtype in (("f32_", "float32"), ("", DT)):
        with compute_autocast(dtype, dev):
            ids, att, mask, sampler = sample(model, tok, sizes, sizes["sample"], seed=4)
            torch.clear_autocast_cache()  # as policy_update does before its forward
            with torch.no_grad():
                trainer, _ = token_logprobs(model, ids, att, temperature=1.0, needed_BT=mask)
        out.update({prefix + k: v for k, v in gap_figures(trainer, sampler, mask).items()})
    # In bf16 the decode and the full forward round differently (mean 0.046 on an H100, 2026-11-27): the
    # sampler's logprobs cannot stand for the old policy's. The canary passes when the gap is small, or when
    # the trainer's own check (sleuth/train/sampler_gap.py) sees it on this very batch and recomputes.
    check = SamplerGap(1, out["mean_abs_delta_limit"], device=dev, dtype=DT)
    check.compare(sampler, trainer, mask, step=1)
    out["trainer_recomputes"] = check.recompute
    small = out["mean_abs_delta"] < out["mean_abs_delta_limit"] and out["clipfrac_0.2"] == 0.0
    out["pass"] = small or check.recompute
    return out


def reference_kl_step0(model, tok, dev, sizes) -> dict:
    """The reference as state.py holds it by default (``model.reference_dtype: auto``), and in bfloat16."""
    out: dict = {"reference_dtype": reference_dtype(Config().model), "k3_limit": 1e-3}
    with compute_autocast(DT, dev):
        ids, att, mask, _ = sample(model, tok, sizes, sizes["sample"], seed=5)
        policy_lp = batched_logprobs(model, ids, att, micro_batch_size=sizes["micro"], needed_BT=mask)
        for prefix, dtype in (("", out["reference_dtype"]), ("bf16_", "bfloat16")):
            ref = copy.deepcopy(model).eval().requires_grad_(False).to(DTYPES[dtype])
            ref_lp = batched_logprobs(ref, ids, att, micro_batch_size=sizes["micro"], needed_BT=mask)
            del ref
            k3 = float(masked_mean(kl_estimate(policy_lp.float(), ref_lp.float(), estimator="k3"), mask.float()))
            d = (policy_lp - ref_lp).float()[mask.bool()]
            out.update({prefix + "tokens": int(d.numel()), prefix + "mean_abs_delta": float(d.abs().mean()),
                        prefix + "max_abs_delta": float(d.abs().max()), prefix + "k3_mean": k3})
    out["pass"] = out["k3_mean"] < out["k3_limit"]
    return out


CANARIES = [linear_grads, master_weights_move, kv_dtypes, sampler_vs_trainer, reference_kl_step0]


def env_facts(dev) -> dict:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


def run_canary(fn, model, tok, dev, sizes) -> dict:
    """One canary's row: name first, pass, figures; an exception is a failure with its message."""
    t0 = time.perf_counter()
    try:
        figures = fn(model, tok, dev, sizes)
        row = {"name": fn.__name__, "pass": figures.pop("pass")}
        row.update(figures)
    except Exception as e:  # recorded, never hidden: the canary fails
        row = {"name": fn.__name__, "pass": False, "error": f"{type(e).__name__}: {e}"[:500]}
    synchronize(dev)
    row["seconds"] = round(time.perf_counter() - t0, 2)
    free_memory(dev)
    if dev.type == "cuda":  # device memory beyond PyTorch's allocator after the canary (a leak shows here)
        free, total = torch.cuda.mem_get_info(dev)
        row["outside_torch_gib"] = round((total - free - torch.cuda.memory_reserved(dev)) / 2**30, 3)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap)
    add_model_arg(ap)
    ap.add_argument("--backend", default="hf", choices=["hf", "hf_static"], help="the rollout backend (uncompiled)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    dev = resolve_device(args.device)
    result = env_facts(dev)
    model, tok, label = load_bench_model(args.model, dev, tiny=args.tiny)
    result["load_s"] = round(time.perf_counter() - t_start, 2)
    model.eval()
    sizes = dict(SIZES["tiny" if args.tiny else "full"], backend=args.backend)
    result.update(model=label, backend=args.backend, compute_dtype=DT, param_dtype=str(next(model.parameters()).dtype))
    result["canaries"] = []
    partial(result, t_start)  # loaded: a hang after this names the canary that started next
    for fn in CANARIES:
        print(f"gpu_canaries: {fn.__name__} starts at {time.perf_counter() - t_start:.1f} s", file=sys.stderr,
              flush=True)
        result["canaries"].append(run_canary(fn, model, tok, dev, sizes))
        partial(result, t_start)
    result["all_pass"] = all(c["pass"] is not False for c in result["canaries"])
    report(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
