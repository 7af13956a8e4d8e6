"""``rollout.backend: hf_static``: the HF decode loop with static shapes, device sampling and fewer
host synchronisations (a subclass of :class:`sleuth.rollout.hf_backend.HFBackend`).

What changes against ``hf`` (everything else, prefill and prefix reuse included, is shared):

* **Static KV cache.** The prefill sizes every layer's buffer for the whole call (``P + N + max_cap``
  slots eager; compiled, the bucket's width, below); each decode step writes its key/value at a slot
  given as a device tensor and attends over the whole buffer under a ``(B, 1, 1, W)`` mask, so every step has the
  same shapes and no Python integer changes inside the model: the step can be compiled
  (``compile=True``, ``torch.compile``, one compiled callable per backend).
* **Compiled: bucketed shapes over a persistent KV pool**, so that the calls of a training run
  (prompts, caps, row counts and agent rounds all vary) compile once per bucket, not once per
  shape (dynamo stops compiling after ``recompile_limit``, 8, recompiles and runs eager). The batch
  is rounded up to a power of two with inert dummy rows (no valid slot but those their own steps
  write; their tokens are never read, stashed or returned; seed 0), the width up to a multiple of
  ``width_multiple`` (256). The buffers are views of one flat key and one flat value tensor per
  layer (:class:`KVPool`): the prefill writes prefixes and new tokens into the first rows of the
  bucket's buffers, zeroed at each call (masked slots are multiplied by 0 in attention, and a stale
  non-finite value would give 0 * NaN = NaN). A bucket met before gets the same tensors back; on CUDA they are marked as
  static addresses once and all start at the pool's addresses, so recorded CUDA graphs replay
  instead of re-recording. The pool holds the K/V of the largest bucket met so far and is
  reallocated (the old one freed first) only when a bucket does not fit or the dtype changes.
  Eager steps keep the call's own shapes (no padding, no pool).
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
(tested on the test models and SmolLM2; compiled, padded into buckets, on the test models), and a
row's sampled tokens do not depend on its batch or the bucket's padding. Measured on a 2-core CPU
this path is not faster than ``hf`` (docs/benchmarks.md, ``bench/decode.py``); it is meant for
GPUs, where per-token launches and synchronisations dominate a small model's decode, and is not the
default until measured there. A run that meets more than ``recompile_limit`` buckets runs the
further ones eager (dynamo keeps serving the buckets it compiled).
Not done: sampling stays outside the compiled step (its ~45 small kernels per step), and under
autocast the compiled step re-casts float32 weights every step (dynamo turns the autocast cache off).
"""

from __future__ import annotations

import torch

from sleuth.errors import ConfigError
from sleuth.rollout.backends import SamplingParams
from sleuth.rollout.hf_backend import COMPACT_AT, HFBackend, sample_next
from sleuth.rollout.hf_cache import KV, additive, assemble, decode_window_masks, slot_cache

M32 = 0xFFFFFFFF
WIDTH_MULTIPLE = 256  # compiled: the KV width is rounded up to a multiple of this many slots


def bucket_shape(rows: int, width: int, width_multiple: int = WIDTH_MULTIPLE) -> tuple[int, int]:
    """The compiled step's ``(batch, width)`` for a call of ``rows`` rows needing ``width`` slots: the
    batch rounded up to a power of two, the width up to a multiple of ``width_multiple`` (the memory
    plan sizes the pool with it too)."""
    return 1 << max(rows - 1, 0).bit_length(), -(-width // width_multiple) * width_multiple


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


class KVPool:
    """The compiled step's keys/values: per layer one flat key and one flat value tensor, and every
    bucket ``(B, W)`` views its ``(B, H, W, D)`` buffers from their start. A bucket met before gets the
    same tensors back (so the same compiled graph; on CUDA they are marked static once, and every
    bucket's buffers start at the same addresses, so recorded CUDA graphs replay). A bucket that does
    not fit (or another dtype: autocast on or off) frees the pool and allocates one of its own size:
    the memory held is the K/V of the largest bucket met so far, one pool per backend."""

    def __init__(self) -> None:
        self._flat: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._views: dict[tuple[int, int], KV] = {}

    def buffers(self, B: int, W: int, spec: list[tuple[int, int, int, torch.dtype]], device) -> KV:
        """Per layer ``(k_BHWD, v_BHWD)`` for the bucket; ``spec``: per layer ``(H, Dk, Dv, dtype)``."""
        if (views := self._views.get((B, W))) is not None and views[0][1].dtype == spec[0][3]:
            return views
        need = [(B * H * W * dk, B * H * W * dv, dtype) for H, dk, dv, dtype in spec]
        if not self._flat or any(k.numel() < nk or v.numel() < nv or v.dtype != dt
                                 for (k, v), (nk, nv, dt) in zip(self._flat, need)):  # fmt: skip
            self._flat, self._views = [], {}  # free first: the old pool and the new are never both held
            self._flat = [(torch.zeros(nk, dtype=dt, device=device), torch.zeros(nv, dtype=dt, device=device))
                          for nk, nv, dt in need]  # fmt: skip
        views = [(k[: B * H * W * dk].view(B, H, W, dk), v[: B * H * W * dv].view(B, H, W, dv))
                 for (k, v), (H, dk, dv, _) in zip(self._flat, spec)]  # fmt: skip
        if torch.device(device).type == "cuda":  # CUDA graphs: inputs at fixed addresses (marked once per tensor)
            for k, v in views:
                torch._dynamo.mark_static_address(k)
                torch._dynamo.mark_static_address(v)
        self._views[(B, W)] = views
        return views


class StaticHFBackend(HFBackend):
    """See the module docstring. ``compile``: run the decode step through ``torch.compile``
    (``compile_mode``; None: reduce-overhead, i.e. CUDA graphs, on a GPU, the default mode elsewhere;
    ``compile_backend``: None for inductor, or e.g. ``eager``/``aot_eager`` for cheap CPU checks) over
    batches rounded up to a power of two and widths to a multiple of ``width_multiple`` slots;
    ``sync_every``: tokens decoded between host synchronisations (None: 8 on CUDA, 1 on CPU)."""

    def __init__(self, model, tokenizer, eos_token_ids=None, *, compile: bool = False, sync_every: int | None = None,
                 compile_mode: str | None = None, compile_backend: str | None = None,
                 width_multiple: int = WIDTH_MULTIPLE):  # fmt: skip
        super().__init__(model, tokenizer, eos_token_ids, reuse_prefix=True)
        attn = getattr(model.config, "_attn_implementation", None)
        if attn not in ("sdpa", "eager"):
            raise ConfigError(f"rollout.backend=hf_static runs sdpa or eager attention; this model uses {attn!r}: "
                              "use rollout.backend=hf")
        if not self.reuse_prefix:
            raise ConfigError(f"rollout.backend=hf_static needs a model whose cache is plain full-attention layers, or "
                              f"full and sliding-window ones; {type(model).__name__} has another kind: use "
                              "rollout.backend=hf")
        if sync_every is None:
            sync_every = 8 if self.device.type == "cuda" else 1
        for name, v in (("sync_every", sync_every), ("width_multiple", width_multiple)):
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        self.sync_every, self.compiled, self.width_multiple = sync_every, compile, width_multiple
        self._step = self._forward_step
        self._pool, self._specs = KVPool(), {}
        if compile:  # one compiled callable per backend; it compiles once per bucket
            if compile_backend not in (None, "inductor"):  # mode is inductor's
                self._step = torch.compile(self._forward_step, dynamic=False, backend=compile_backend)
            else:
                if compile_mode is None:  # CUDA graphs on a GPU
                    compile_mode = "reduce-overhead" if self.device.type == "cuda" else None
                self._step = torch.compile(self._forward_step, dynamic=False, mode=compile_mode)

    def bucket(self, rows: int, width: int) -> tuple[int, int]:
        """:func:`bucket_shape` with this backend's ``width_multiple``."""
        return bucket_shape(rows, width, self.width_multiple)

    def _forward_step(self, tokens_B1, mask_B11W, pos_B1, cache):
        out = self.model(input_ids=tokens_B1, attention_mask=mask_B11W, position_ids=pos_B1, use_cache=True,
                         **{self._cache_kw: cache})  # fmt: skip
        return out.logits[:, -1]

    def _kv_spec(self) -> list[tuple[int, int, int, torch.dtype]]:
        """Per layer ``(kv heads, key dim, value dim, dtype)`` of the cache the model writes in the current
        autocast state (keys kept in the values' dtype, as ``SlotLayer`` does): one probe forward of one
        token per state, remembered."""
        dev = self.device.type
        state = (torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev), next(self.model.parameters()).dtype)
        if state not in self._specs:
            kv = self._prefix_kv([self.pad_id])
            self._specs[state] = [(k.shape[0], k.shape[-1], v.shape[-1], v.dtype) for k, v in kv]
        return self._specs[state]

    def _new_cache(self, prefixes, lens, width):
        """Compiled: the prefill's rows are the first rows of the pool's buffers for the call's bucket,
        prefixes written in place. The bucket's buffers are zeroed first: masked slots are multiplied by 0
        in attention, and a stale non-finite value (0 * NaN = NaN) would poison every later call."""
        if not self.compiled:
            return super()._new_cache(prefixes, lens, width)
        B, W = self.bucket(len(prefixes), width)
        pool = self._pool.buffers(B, W, self._kv_spec(), self.device)
        for k, v in pool:
            k.zero_()
            v.zero_()
        rows = [(k[: len(prefixes)], v[: len(prefixes)]) for k, v in pool]
        return slot_cache(self.model, W, assemble(prefixes, lens, W, out=rows), max(lens)), W

    def _pad_to_bucket(self, cache, mask_BW, next_pos_B, logits_BV):
        """Compiled: the decode state over the bucket's whole buffers, ``B_pad - B`` dummy rows after the
        real ones. A dummy row's only valid slots are those its own steps write (no attention row is all
        masked); its tokens are never read, stashed or returned."""
        B, W = mask_BW.shape
        extra = self.bucket(B, W)[0] - B
        for layer, (k, v) in zip(cache.layers, self._pool.buffers(B + extra, W, self._kv_spec(), self.device)):
            layer.k_buf, layer.v_buf = k, v
            layer._views()
        if extra:
            mask_BW = torch.cat([mask_BW, mask_BW.new_zeros((extra, W))])
            next_pos_B = torch.cat([next_pos_B, next_pos_B.new_zeros(extra)])
            logits_BV = torch.cat([logits_BV, logits_BV.new_zeros((extra, logits_BV.shape[1]))])
        return mask_BW, next_pos_B, logits_BV

    def _mask(self, mask_BW: torch.Tensor):
        dtype = self._additive_dtype()
        if self._window is not None:  # a mask per layer kind (hf_cache.window_masks)
            return decode_window_masks(mask_BW, self._window, dtype)
        m = mask_BW[:, None, None, :]
        return m if dtype is None else additive(m, dtype)

    def _decode(self, prompts, params: SamplingParams, seeds, caps, rows, results) -> None:
        dev = self.device
        finished = self._finisher(params, caps, results)
        max_cap = max(caps[i] for i in rows)
        cache, mask_BW, width, next_pos_B, logits_BV = self._prefill([prompts[i] for i in rows], max_cap)
        if self.compiled:  # the bucket's batch: dummy rows after the real ones
            mask_BW, next_pos_B, logits_BV = self._pad_to_bucket(cache, mask_BW, next_pos_B, logits_BV)
        slot_1 = torch.full((1,), width, dtype=torch.long, device=dev)  # where the next token's key/value goes
        for layer in cache.layers:
            layer.static_slot = slot_1
        seed_B = None
        if not params.is_greedy:  # dummy rows: seed 0 (a row's numbers depend on its own seed only)
            row_seeds = [seeds[i] if seeds is not None else int(torch.randint(2**62, ()).item()) for i in rows]
            seed_B = torch.tensor(row_seeds + [0] * (len(mask_BW) - len(rows)), dtype=torch.long, device=dev)
        active = list(rows)  # original row index of each (real) batch position
        live = list(range(len(rows)))  # batch positions still generating
        tok_BK = torch.empty((len(mask_BW), self.sync_every), dtype=torch.long, device=dev)
        lp_BK = torch.empty((len(mask_BW), self.sync_every), dtype=torch.float32, device=dev)
        step, k, stashed = 0, 0, set()
        while True:
            u_B = None if seed_B is None else uniforms(seed_B, torch.full_like(seed_B, step))
            tokens_B, logp_B = sample_next(logits_BV, params, None, uniforms_B=u_B)
            tok_BK[:, k], lp_BK[:, k] = tokens_B, logp_B
            step, k = step + 1, k + 1
            if k == self.sync_every or step == max_cap:  # read the chunk on the host; check rows in order
                toks, lps = tok_BK[: len(active), :k].tolist(), lp_BK[: len(active), :k].tolist()
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
