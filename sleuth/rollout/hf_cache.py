"""KV-cache pieces of the Hugging Face backend: an in-place cache layer and prefix reuse.

Three things make the batched decode loop of :mod:`sleuth.rollout.hf_backend` cheap on repeated,
multi-round generation (the agent loop: prompt, turn, observation, turn, ...):

* :class:`SlotLayer` -- a full-attention cache layer over a preallocated ``(B, H, W, D)`` buffer.
  A decode step writes its key/value in place instead of ``torch.cat``-ing the whole cache (the
  cost of ``DynamicLayer`` grows with the context at every token).
* :class:`PrefixStore` -- the keys/values of rows that finished a call, keyed by the exact token
  ids they cover (prompt + generated tokens but the last, which was sampled and never fed). The
  next call finds, for each prompt, the longest stored key that is a prefix of it and only
  prefills the rest (the last sampled token and the injected observation). Exact reuse: the
  cached keys/values of a prefix depend on the prefix tokens only (causal attention; positions
  are passed explicitly, keys are stored after RoPE).
* :func:`assemble` -- a batch cache from per-row prefixes of different lengths, right-aligned in
  ``[0, P)``: the new tokens follow in ``[P, P + N)``, so a row may hold padding *between* its
  prefix and its new tokens. The 2D attention mask marks every valid slot; masks are causal by
  slot, and every valid prefix slot precedes every new slot, so attention is exactly that of the
  unpadded row.

Eligible: models whose cache is all plain full-attention layers (:func:`supports_reuse`), and
models that mix full-attention and sliding-window layers (Gemma-3; :func:`sliding_window`) under sdpa
or eager attention. Their sliding layers get full slot buffers too and the backend passes each layer
kind its own mask (:func:`window_masks`): a key is seen when it is within the window by *position*,
which a slot layout with padding between a prefix and the new tokens does not give by slot distance.
Others (linear attention, other hybrids, flash attention) run the plain ``DynamicCache`` path.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values): one row's _HLD, or a batch's _BHWD


def supports_reuse(model) -> bool:
    """True when ``DynamicCache(config=model.config)`` is made of plain full-attention layers."""
    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # a config the cache cannot read: stay on the generic path
        return False
    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


def sliding_window(model) -> int | None:
    """The window of a model whose cache mixes plain full-attention and sliding-window layers and whose
    forward takes prepared masks per layer kind (``attention_mask`` as a ``{"full_attention": ...,
    "sliding_attention": ...}`` dict, transformers' convention for such models), under sdpa or eager
    attention; None for any other model (plain full attention included)."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    config = getattr(model, "config", None)
    kinds = set(getattr(config, "layer_types", None) or [])
    window = getattr(config, "sliding_window", None)
    if kinds != {"full_attention", "sliding_attention"} or not isinstance(window, int) or window < 1:
        return None
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return None
    try:
        cache = DynamicCache(config=config)
        decoder = model.get_decoder()
        takes_dict = "attention_mask, dict)" in inspect.getsource(type(decoder).forward)
    except Exception:  # noqa: BLE001 - a config or model these cannot read: stay on the generic path
        return None
    layers_ok = all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in cache.layers)
    return window if cache.layers and layers_ok and takes_dict else None


def supports_slot_cache(model) -> bool:
    """Whether the backend can run ``model`` over :class:`SlotLayer` buffers (prefix reuse, hf_static):
    plain full attention, or full and sliding-window layers with masks we build (:func:`sliding_window`)."""
    return supports_reuse(model) or sliding_window(model) is not None


def window_masks(valid_BW: torch.Tensor, q_slots_N: torch.Tensor, window: int, dtype=None) -> dict:
    """Per layer kind, the ``(B, 1, N, W)`` attention masks of queries at slots ``q_slots_N`` (the same
    for every row) over a slot layout whose valid slots ``valid_BW`` hold each row's tokens in order
    (a slot's position is the number of valid slots before it). Full attention: valid keys at or before
    the query's slot; sliding: of those, the keys less than ``window`` positions behind the query (the
    window counts the query itself, as transformers' ``sliding_window_overlay``). A query always sees its
    own slot, so a padding query is never fully masked (its output is never read; a fully masked row
    would give NaN keys/values in the next layer). Boolean (sdpa) or, with ``dtype``, additive (eager)."""
    pos_BW = valid_BW.long().cumsum(-1) - 1
    W = valid_BW.shape[1]
    slot_W = torch.arange(W, device=valid_BW.device)
    own_NW = slot_W[None, :] == q_slots_N[:, None]
    full_BNW = (valid_BW[:, None, :] & (slot_W[None, :] <= q_slots_N[:, None])[None]) | own_NW[None]
    near_BNW = pos_BW[:, None, :] > pos_BW[:, q_slots_N, None] - window
    masks = {"full_attention": full_BNW[:, None], "sliding_attention": ((full_BNW & near_BNW) | own_NW[None])[:, None]}
    return masks if dtype is None else {k: additive(m, dtype) for k, m in masks.items()}


def additive(mask: torch.Tensor, dtype) -> torch.Tensor:
    """A boolean attention mask as eager attention adds it to its scores: 0 where seen, the dtype's minimum elsewhere."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def decode_window_masks(valid_BW: torch.Tensor, window: int, dtype=None) -> dict:
    """:func:`window_masks` for one decode step whose query is each row's last valid slot (its new token,
    already marked valid), at shapes that do not depend on the slot (hf_static's compiled step)."""
    pos_BW = valid_BW.long().cumsum(-1) - 1
    last_B1 = valid_BW.long().sum(-1, keepdim=True) - 1
    masks = {"full_attention": valid_BW[:, None, None, :],
             "sliding_attention": (valid_BW & (pos_BW > last_B1 - window))[:, None, None, :]}
    return masks if dtype is None else {k: additive(m, dtype) for k, m in masks.items()}


class SlotLayer(DynamicLayer):
    """A full-attention layer over a preallocated ``(B, H, capacity, D)`` buffer: ``update`` writes
    in place and returns views ``buf[:, :, :length]`` (no copy of the past per token). Grows by
    reallocation only if a caller writes past the capacity it asked for."""

    def __init__(self, capacity: int, buffers: tuple[torch.Tensor, torch.Tensor] | None = None,
                 length: int = 0):  # fmt: skip
        super().__init__()
        self.capacity, self.length = capacity, length
        self.k_buf = self.v_buf = None
        if buffers is not None:
            self.k_buf, self.v_buf = buffers
            self.capacity = self.k_buf.shape[2]
            self.dtype, self.device, self.is_initialized = self.k_buf.dtype, self.k_buf.device, True
            self._views()

    def _allocate(self, like_BHLD: torch.Tensor, dtype: torch.dtype | None = None) -> None:
        B, H, L, D = like_BHLD.shape
        self.capacity = max(self.capacity, L)
        dtype = dtype or like_BHLD.dtype
        self.k_buf = like_BHLD.new_zeros((B, H, self.capacity, D), dtype=dtype)  # zeros: masked slots stay finite
        self.v_buf = like_BHLD.new_zeros((B, H, self.capacity, D), dtype=dtype)
        self.dtype, self.device, self.is_initialized = dtype, like_BHLD.device, True

    def _views(self) -> None:
        self.keys, self.values = self.k_buf[:, :, : self.length], self.v_buf[:, :, : self.length]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        # keys kept in the values' dtype: under bf16 autocast with float32 weights the rotary embedding
        # promotes keys to float32 while values leave v_proj in bf16; attention (autocast's SDPA or
        # matmul) casts the keys to bf16 anyway, so storing them so gives the same outputs at half the
        # bytes and no cast of the whole key cache at every decode step
        self._allocate(key_states, value_states.dtype)

    static_slot: torch.Tensor | None = None  # set by hf_static's decode: write there, attend over the whole buffer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.static_slot is not None:  # one token per row at a device index: the same shapes every step
            self.k_buf.index_copy_(2, self.static_slot, key_states.to(self.k_buf.dtype))
            self.v_buf.index_copy_(2, self.static_slot, value_states.to(self.v_buf.dtype))
            return self.k_buf, self.v_buf
        if self.k_buf is None:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:  # not expected: the backend sizes the buffer for the whole call
            old_k, old_v = self.keys, self.values
            self.capacity = max(end, 2 * self.capacity)
            self._allocate(old_k, old_v.dtype)
            self.k_buf[:, :, : self.length], self.v_buf[:, :, : self.length] = old_k, old_v
        self.k_buf[:, :, self.length : end] = key_states
        self.v_buf[:, :, self.length : end] = value_states
        self.length = end
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.k_buf is not None:
            self.k_buf, self.v_buf = self.k_buf[indices], self.v_buf[indices]
            self._views()


def slot_cache(model, capacity: int, buffers: list[tuple[torch.Tensor, torch.Tensor]] | None, length: int):
    """A ``DynamicCache`` of :class:`SlotLayer` s with ``capacity`` slots; ``buffers`` (per layer,
    from :func:`assemble`) already hold ``length`` slots of prefixes."""
    cache = DynamicCache(config=model.config)
    if buffers is None:
        cache.layers = [SlotLayer(capacity) for _ in cache.layers]
    else:
        cache.layers = [SlotLayer(capacity, kv, length) for kv in buffers]
    return cache


def assemble(prefixes: list[KV | None], lengths: list[int], capacity: int, out: KV | None = None) -> KV | None:
    """Per layer, ``(keys_BHWD, values_BHWD)`` buffers of ``capacity`` slots with row ``b``'s prefix
    in slots ``[P - len_b, P)``, ``P = max(lengths)``, zeros elsewhere (None when no row has one).
    Rows sharing one prefix object (a common prompt prefix) are written at once. ``out``: buffers
    to write the prefixes into instead (hf_static's KV pool, which zeroes them first), returned as
    they are when no row has a prefix."""
    P = max(lengths, default=0)
    if P == 0:
        return out
    groups: dict[int, list[int]] = {}
    for b, kv in enumerate(prefixes):
        if kv is not None:
            groups.setdefault(id(kv), []).append(b)
    first = next(kv for kv in prefixes if kv is not None)
    built = []
    for layer, (k_ref_HLD, v_ref_HLD) in enumerate(first):
        # keys in the values' dtype (SlotLayer): a prefix computed outside a SlotLayer may hold float32
        # keys (bf16 autocast over float32 weights: the rotary embedding promotes them)
        H, _, D = k_ref_HLD.shape
        if out is not None:
            k_BHWD, v_BHWD = out[layer]
        else:
            k_BHWD = k_ref_HLD.new_zeros((len(prefixes), H, capacity, D), dtype=v_ref_HLD.dtype)
            v_BHWD = v_ref_HLD.new_zeros((len(prefixes), H, capacity, v_ref_HLD.shape[-1]))
        for rows in groups.values():
            k_HLD, v_HLD = prefixes[rows[0]][layer]
            k_HLD, L = k_HLD.to(k_BHWD.dtype), k_HLD.shape[1]
            if len(rows) == 1:
                k_BHWD[rows[0], :, P - L : P], v_BHWD[rows[0], :, P - L : P] = k_HLD, v_HLD
            else:
                idx = torch.tensor(rows, device=k_HLD.device)
                k_BHWD[idx, :, P - L : P], v_BHWD[idx, :, P - L : P] = k_HLD, v_HLD
        built.append((k_BHWD, v_BHWD))
    return built


def row_kv(cache, b: int, slots: torch.Tensor) -> KV:
    """Copy row ``b``'s keys/values at ``slots`` (its valid cache slots, in order) out of ``cache``
    (a :class:`SlotLayer`'s whole buffer: under hf_static its ``keys`` view is not kept up to date)."""
    out = []
    for layer in cache.layers:
        keys, values = (layer.k_buf, layer.v_buf) if getattr(layer, "k_buf", None) is not None else (layer.keys,
                                                                                                    layer.values)
        out.append((keys[b].index_select(1, slots), values[b].index_select(1, slots)))
    return out


class PrefixStore:
    """Keys/values of finished rows, by the exact token ids they cover; see the module docstring.

    ``match`` returns, per prompt, the longest stored key that is a *strict* prefix of it (at least
    one new token is left to feed, for the next logits); then forgets everything (entries live from
    one call to the next, so memory stays bounded by one batch)."""

    def __init__(self) -> None:
        self._by_len: dict[int, dict[tuple[int, ...], KV]] = {}

    def __len__(self) -> int:
        return sum(len(d) for d in self._by_len.values())

    def put(self, tokens: list[int], kv: KV) -> None:
        if tokens:
            self._by_len.setdefault(len(tokens), {})[tuple(tokens)] = kv

    def match(self, prompts: list[list[int]]) -> list[tuple[int, KV | None]]:
        lengths = sorted(self._by_len, reverse=True)
        lasts = {n: {key[-1] for key in self._by_len[n]} for n in lengths}
        found: list[tuple[int, KV | None]] = []
        for p in prompts:
            hit: tuple[int, KV | None] = (0, None)
            for n in lengths:
                if n >= len(p) or p[n - 1] not in lasts[n]:  # cheap test first
                    continue
                if (kv := self._by_len[n].get(tuple(p[:n]))) is not None:
                    hit = (n, kv)
                    break
            found.append(hit)
        self._by_len = {}
        return found
