"""``rollout.backend: hf_static``: the HF decode loop with static shapes, device sampling and fewer
host synchronisations (a subclass of :class:`sleuth.rollout.hf_backend.HFBackend`).

What changes against ``hf`` (everything else, prefill and prefix reuse included, is shared):

* **Static KV cache.** The prefill sizes every layer's buffer for the whole call
  (``P + N + max_cap`` slots); each decode step writes its key/value at a slot given as a device
  tensor and attends over the whole buffer under a ``(B, 1, 1, W)`` mask, so every step has the
  same shapes and no Python integer changes inside the model: the step can be compiled
  (``compile=True``, ``torch.compile``; on CUDA the buffers are marked static for CUDA graphs).
* **Sampling on the device, per-row seeds without generators.** A row's uniform number for its
  k-th token is a counter-based hash of ``(seed, k)`` (``uniforms``), computed for all rows in
  one op: no per-row ``torch.Generator`` call per token, and a row's sample still does not
  depend on which rows share its batch. Sampled outputs differ from ``hf``'s (another random
  stream) and are reproducible per seed; greedy outputs are the same.
* **Host synchronisation every ``sync_every`` tokens** (default: 8 on CUDA, 1 on CPU, where a
  sync costs nothing and every extra step costs compute). Tokens and logprobs gather in a device
  buffer; at each sync the rows are checked on the host in order (eos, stop strings, caps) and a
  row that finished inside the chunk keeps exactly the tokens up to its end. Finished rows leave
  the batch at a sync once a quarter has finished (eager steps only: a compiled step keeps its
  batch, so its shapes never change).

Stop reasons, kept tokens and logprobs follow the same rules as ``hf``: greedy outputs are equal
(tested on the test models and SmolLM2). Measured on a 2-core CPU this path is not faster than
``hf`` (docs/benchmarks.md, ``bench/decode.py``); it is meant for GPUs, where per-token launches
and synchronisations dominate a small model's decode, and is not the default until measured there.
"""

from __future__ import annotations

import torch

from sleuth.rollout.backends import SamplingParams
from sleuth.rollout.hf_backend import COMPACT_AT, HFBackend, sample_next
from sleuth.rollout.hf_cache import SlotLayer

M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2**32`` for ``0 <= x < 2**32`` in int64 without overflow (16-bit halves)."""
    return ((x & 0xFFFF) * c + (((x >> 16) * (c & 0xFFFF)) << 16)) & M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (``lowbias32``: xorshift-multiply rounds) on int64 values < 2**32."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniforms(seed_B: torch.Tensor, counter_B: torch.Tensor) -> torch.Tensor:
    """One uniform number in ``[0, 1)`` per row from ``(seed, counter)`` (int64 tensors, seeds < 2**63):
    a pure function of the pair, computed on the tensors' device, 24 bits of resolution."""
    x = _mix32((seed_B & M32) ^ _mul32((seed_B >> 32) & M32, 0x9E3779B1))
    x = _mix32(x ^ _mul32(counter_B & M32, 0x85EBCA77))
    return (x >> 8).to(torch.float32) / float(1 << 24)


class StaticHFBackend(HFBackend):
    """See the module docstring. ``compile``: run the decode step through ``torch.compile``
    (``compile_mode``; None: reduce-overhead, i.e. CUDA graphs, on a GPU, the default mode elsewhere);
    ``sync_every``: tokens decoded between host synchronisations (None: 8 on CUDA, 1 on CPU)."""

    def __init__(self, model, tokenizer, eos_token_ids=None, *, compile: bool = False, sync_every: int | None = None,
                 compile_mode: str | None = None):  # fmt: skip
        super().__init__(model, tokenizer, eos_token_ids, reuse_prefix=True)
        if not self.reuse_prefix:
            raise ValueError(f"rollout.backend=hf_static needs a model whose cache is plain full-attention layers; "
                             f"{type(model).__name__} has another kind: use rollout.backend=hf")
        attn = getattr(model.config, "_attn_implementation", None)
        if attn not in ("sdpa", "eager"):
            raise ValueError(f"rollout.backend=hf_static runs sdpa or eager attention; this model uses {attn!r}: "
                             "use rollout.backend=hf")
        self._float_mask = attn == "eager"  # eager attention adds the mask to its scores
        if sync_every is None:
            sync_every = 8 if self.device.type == "cuda" else 1
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every}")
        self.sync_every, self.compiled = sync_every, compile
        self._step = self._forward_step
        if compile:
            if compile_mode is None:  # CUDA graphs on a GPU
                compile_mode = "reduce-overhead" if self.device.type == "cuda" else None
            self._step = torch.compile(self._forward_step, dynamic=False, mode=compile_mode)

    def _forward_step(self, tokens_B1, mask_B11W, pos_B1, cache):
        out = self.model(input_ids=tokens_B1, attention_mask=mask_B11W, position_ids=pos_B1, use_cache=True,
                         **{self._cache_kw: cache})  # fmt: skip
        return out.logits[:, -1]

    def _mask(self, mask_BW: torch.Tensor) -> torch.Tensor:
        m = mask_BW[:, None, None, :]
        if not self._float_mask:
            return m
        dtype = next(self.model.parameters()).dtype
        return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(~m, torch.finfo(dtype).min)

    def _decode(self, prompts, params: SamplingParams, seeds, caps, rows, results) -> None:
        dev = self.device
        finished = self._finisher(params, caps, results)
        max_cap = max(caps[i] for i in rows)
        cache, mask_BW, width, next_pos_B, logits_BV = self._prefill([prompts[i] for i in rows], max_cap)
        slot_1 = torch.full((1,), width, dtype=torch.long, device=dev)  # where the next token's key/value goes
        for layer in cache.layers:
            layer.static_slot = slot_1
            if self.compiled and dev.type == "cuda":  # CUDA graphs need the buffers at fixed addresses
                torch._dynamo.mark_static_address(layer.k_buf)
                torch._dynamo.mark_static_address(layer.v_buf)
        seed_B = None
        if not params.is_greedy:
            seed_B = torch.tensor([seeds[i] if seeds is not None else int(torch.randint(2**62, ()).item()) for i in rows],
                                  dtype=torch.long, device=dev)  # fmt: skip
        active = list(rows)  # original row index of each batch position
        live = list(range(len(rows)))  # batch positions still generating
        tok_BK = torch.empty((len(rows), self.sync_every), dtype=torch.long, device=dev)
        lp_BK = torch.empty((len(rows), self.sync_every), dtype=torch.float32, device=dev)
        step, k, stashed = 0, 0, set()
        while True:
            u_B = None if seed_B is None else uniforms(seed_B, torch.full_like(seed_B, step))
            tokens_B, logp_B = sample_next(logits_BV, params, None, uniforms_B=u_B)
            tok_BK[:, k], lp_BK[:, k] = tokens_B, logp_B
            step, k = step + 1, k + 1
            if k == self.sync_every or step == max_cap:  # read the chunk on the host; check rows in order
                toks, lps = tok_BK[:, :k].tolist(), lp_BK[:, :k].tolist()
                live = [b for b in live if not any(finished(active[b], t, lp) for t, lp in zip(toks[b], lps[b]))]
                if self._store is not None:
                    self._stash_finished(cache, mask_BW, active, live, stashed, prompts, results)
                k = 0
                if not live or step == max_cap:
                    break
                if not self.compiled and len(live) <= COMPACT_AT * len(active):
                    sel_B = torch.tensor(live, device=dev)
                    cache.batch_select_indices(sel_B)
                    tokens_B, mask_BW, next_pos_B = tokens_B[sel_B], mask_BW[sel_B], next_pos_B[sel_B]
                    seed_B = seed_B[sel_B] if seed_B is not None else None
                    active = [active[b] for b in live]
                    live = list(range(len(active)))
                    tok_BK, lp_BK = tok_BK[sel_B], lp_BK[sel_B]
            mask_BW.index_fill_(1, slot_1, True)
            logits_BV = self._step(tokens_B[:, None], self._mask(mask_BW), next_pos_B[:, None], cache)
            slot_1.add_(1)
            next_pos_B = next_pos_B + 1

    def _stash_finished(self, cache, mask_BW, active, live, stashed: set[int], prompts, results) -> None:
        """Keep the keys/values of rows that finished since the last sync (``stashed``: the rows
        already kept) in the session's store, as ``hf`` does (:meth:`HFBackend._stash`)."""
        still = set(live)
        done = [(b, i) for b, i in enumerate(active) if b not in still and i not in stashed]
        stashed.update(i for _, i in done)
        self._stash(cache, mask_BW, done, prompts, results)


def hf_backend(model, tokenizer, rollout) -> HFBackend:
    """The HF-family backend ``rollout.backend`` names (``hf`` or ``hf_static``, with its settings)."""
    if rollout.backend == "hf_static":
        return StaticHFBackend(model, tokenizer, compile=rollout.hf_compile, sync_every=rollout.hf_sync_every)
    return HFBackend(model, tokenizer)
