"""What one decode step of ``bench/gpu_decode.py`` reads: the weight bytes its bandwidth floor counts,
the casts autocast makes, and the KV cache's bytes per token, measured on the model itself.

:func:`step_bytes` runs, batch 1 and under one ``ctx()`` (as a rollout runs inside one autocast
context), a prefill of ``context`` tokens into the KV cache Sleuth's ``hf`` / ``hf_static`` rollouts
use (``hf_cache.slot_cache``; transformers' ``DynamicCache`` for models it does not cover), then one
decode forward, with a ``TorchDispatchMode`` watching ``aten._to_copy`` (every dtype cast,
autocast's included):

* ``params_cast``: parameters (numel) cast during the prefill, i.e. the weights autocast runs in the
  low dtype (matmul weights, the tied output layer; not norms, not an untied embedding's lookup);
* ``autocast_weight_casts_per_step``: parameter casts in the decode forward: 0 when autocast's
  cache kept the prefill's casts (what the floor ``weight_bytes`` assumes), else the weights are cast
  again every step and ``weight_bytes_recast`` is the floor that applies;
* ``cast_bytes_per_step``: bytes read by every cast of the decode forward (weights when not cached,
  float32 keys cast for attention if the cache holds them so, activations), at ``context`` tokens;
* ``kv_bytes_per_token``, ``key_dtype``, ``value_dtype``: from the cache the prefill filled (the
  model's keys are float32 under bf16 autocast, the rotary embedding promotes them; what the cache
  stores is the cache's choice).

``weight_bytes``: every parameter once (tied ones once), at the low dtype's size if autocast casts it,
else at its own size. ``weight_bytes_recast`` (autocast only): cast parameters at
``own size + 2 · low size`` (float32 read, bf16 written, bf16 read by the matmul), others at their
own size. Without autocast both are the parameters' bytes and there is no recast figure.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache

from sleuth.models import DTYPES
from sleuth.rollout.hf_backend import cache_kwarg
from sleuth.rollout.hf_cache import slot_cache, supports_reuse


class CastWatch(TorchDispatchMode):
    """Counts dtype casts (``aten._to_copy`` to another dtype): bytes read, and which parameters."""

    def __init__(self, params: dict[int, torch.nn.Parameter]):
        super().__init__()
        self.params, self.cast_params, self.weight_casts, self.bytes = params, set(), 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") not in (None, args[0].dtype):
            x = args[0]
            self.bytes += x.numel() * x.element_size()
            p = self.params.get(x.data_ptr())
            if p is not None and p.numel() == x.numel():
                self.cast_params.add(x.data_ptr())
                self.weight_casts += 1
        return func(*args, **kwargs)


@torch.no_grad()
def step_bytes(model, ctx, autocast_dtype: str | None, context: int = 64) -> dict:
    """See the module docstring. ``ctx``: a factory of the precision context (autocast or none);
    ``autocast_dtype``: its dtype name, None without autocast."""
    params = {p.data_ptr(): p for p in model.parameters()}
    own = sum(p.numel() * p.element_size() for p in params.values())
    out: dict = {"params": sum(p.numel() for p in params.values()), "weight_bytes": own}
    ids_1L = torch.randint(0, model.config.vocab_size, (1, context + 1), device=next(model.parameters()).device)
    try:
        # the cache Sleuth's hf / hf_static rollouts decode into (SlotLayers), else transformers' own
        cache = slot_cache(model, context + 1, None, 0) if supports_reuse(model) else DynamicCache(config=model.config)
        kw = {cache_kwarg(model): cache}
        with ctx():
            with CastWatch(params) as first:
                model(input_ids=ids_1L[:, :context], use_cache=True, logits_to_keep=1, **kw)
            with CastWatch(params) as step:
                model(input_ids=ids_1L[:, context:], use_cache=True, **kw)
        layer = cache.layers[0]
        out.update(kv_bytes_per_token=sum(x[0, :, 0].numel() * x.element_size() for lay in cache.layers
                                          for x in (lay.keys, lay.values)),
                   key_dtype=str(layer.keys.dtype).removeprefix("torch."),
                   value_dtype=str(layer.values.dtype).removeprefix("torch."),
                   cast_bytes_per_step=step.bytes, probe_context=context)
        cast = first.cast_params
        if autocast_dtype is not None:
            out["autocast_weight_casts_per_step"] = step.weight_casts
    except Exception as e:  # the floor still needs a figure: assume autocast casts every matrix
        out["step_probe_error"] = f"{type(e).__name__}: {str(e).strip()[:200]}"
        cast = {k for k, p in params.items() if p.ndim >= 2} if autocast_dtype is not None else set()
    if autocast_dtype is not None:
        low = DTYPES[autocast_dtype].itemsize
        rest = own - sum(params[k].numel() * params[k].element_size() for k in cast)
        out["params_cast"] = sum(params[k].numel() for k in cast)
        out["weight_bytes"] = rest + low * out["params_cast"]
        out["weight_bytes_recast"] = rest + sum(params[k].numel() * (params[k].element_size() + 2 * low)
                                                for k in cast)
    return out
