"""Hugging Face transformers backend: our own batched decode loop with a KV cache.

Why not ``model.generate``: we need exact per-row stopping on stop *strings* (the kept tokens end
with the token that completed the string), the logprob of every sampled token under the
distribution we sampled from, and one random generator per row so that a row's sample does not
depend on which other rows share its batch. The loop is short:

1. prefill: left-pad the new part of every prompt, positions = each row's own token count, one
   forward into a cache that may already hold the row's earlier tokens (below);
2. each step: sample one token per active row (``sample_next``), check eos / stop string / cap;
3. feed the new tokens with their positions and the grown attention mask. Finished rows idle
   until a quarter of the batch has finished (``COMPACT_AT``); then they leave the batch and the
   cache (``batch_select_indices``, one copy of the cache rather than one per finished row).

Prefix reuse (``reuse_prefix=True``; models with plain full-attention caches, or full and sliding-window
layers under sdpa/eager attention with a mask per layer kind, see ``hf_cache``):

* within one call, prompts that share a long common prefix (the instruction every question
  starts with, the G copies of a prompt) prefill it once, batch size 1;
* inside ``with backend.session():`` (the agent loop opens one per ``run_rollouts``) the
  keys/values of every row that finished a call are kept, keyed by its exact token ids, and the
  next call prefills only what follows (the last sampled token and the observation), not the
  whole context again. The store empties when the session closes, so weights that change
  between sessions (training) never meet stale keys/values.

Decode steps write keys/values in place (``hf_cache``) and decode the tail for stop strings only
after a token that can complete one. Greedy outputs equal the plain path's (``reuse_prefix=False``,
tested); logprobs agree to float rounding.

Works on CPU and CUDA (generators live on the model's device). See ``backends`` for the stop and
logprob conventions.
"""

from __future__ import annotations

import inspect
import os
from contextlib import contextmanager

import torch
from transformers import DynamicCache

from sleuth.models import base_model
from sleuth.rollout.backends import (
    GenerationResult,
    SamplingParams,
    StopStringMatcher,
    check_prompts,
    row_caps,
)
from sleuth.rollout.hf_cache import (
    KV,
    PrefixStore,
    assemble,
    decode_window_masks,
    row_kv,
    sliding_window,
    slot_cache,
    supports_slot_cache,
    window_masks,
)


def sample_next(
    logits_BV: torch.Tensor, params: SamplingParams, generators: list[torch.Generator] | None,
    uniforms_B: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its logprob (``log_softmax(logits / T)``, before top-k/top-p).

    Sampling draws one uniform number per row from that row's generator (or takes ``uniforms_B``)
    and inverts the CDF of the filtered distribution (top-k, then top-p on what is left, then
    renormalised).
    """
    logits_BV = logits_BV.float()
    temp = params.temperature if params.temperature > 0 and not params.greedy else 1.0
    logp_BV = torch.log_softmax(logits_BV / temp, dim=-1)
    if params.is_greedy:
        tokens_B = logp_BV.argmax(dim=-1)
        return tokens_B, logp_BV.gather(1, tokens_B[:, None]).squeeze(1)
    filt_BV = logp_BV
    if params.top_k > 0 and params.top_k < filt_BV.shape[-1]:
        kth_B1 = torch.topk(filt_BV, params.top_k, dim=-1).values[:, -1:]
        filt_BV = filt_BV.masked_fill(filt_BV < kth_B1, float("-inf"))
    if params.top_p < 1.0:
        sorted_BV, order_BV = torch.sort(filt_BV, dim=-1, descending=True)
        probs_BV = torch.softmax(sorted_BV, dim=-1)
        mass_before_BV = probs_BV.cumsum(dim=-1) - probs_BV  # probability mass strictly above
        drop_BV = mass_before_BV >= params.top_p  # keeps the smallest prefix reaching top_p
        drop_BV[:, 0] = False
        filt_BV = filt_BV.masked_fill(torch.zeros_like(drop_BV).scatter(1, order_BV, drop_BV), float("-inf"))
    probs_BV = torch.softmax(filt_BV, dim=-1)
    cdf_BV = probs_BV.cumsum(dim=-1)
    if uniforms_B is not None:
        u_B = uniforms_B.to(cdf_BV.device, cdf_BV.dtype)
    elif generators is None:
        u_B = torch.rand(cdf_BV.shape[0], device=cdf_BV.device)
    else:
        u_B = torch.stack([torch.rand((), generator=g, device=cdf_BV.device) for g in generators])
    target_B1 = (u_B * cdf_BV[:, -1]).unsqueeze(1)
    tokens_B = torch.searchsorted(cdf_BV, target_B1, right=True).squeeze(1)
    tokens_B = tokens_B.clamp(max=cdf_BV.shape[-1] - 1)
    return tokens_B, logp_BV.gather(1, tokens_B[:, None]).squeeze(1)


COMPACT_AT = 0.75  # drop finished rows from the batch once at most this share of it still generates
MIN_SHARED_PREFIX = 16  # tokens: a shorter common prompt prefix is not worth its own forward call


class HFBackend:
    """Batched sampling from a ``transformers`` causal LM (any model that takes position ids and a
    ``DynamicCache``). ``tokenizer`` is used to decode tails for stop strings and for pad/eos ids.
    ``reuse_prefix=False`` turns prefix reuse off (it is off anyway for caches it cannot handle)."""

    def __init__(self, model, tokenizer, eos_token_ids: list[int] | None = None, reuse_prefix: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        if eos_token_ids is None:
            eos_token_ids = eos_ids(model, tokenizer)
        self.eos_token_ids = list(eos_token_ids)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (self.eos_token_ids[0] if self.eos_token_ids else 0)
        self.reuse_prefix = reuse_prefix and supports_slot_cache(model)
        self._store: PrefixStore | None = None
        attn = getattr(model.config, "_attn_implementation", None)
        # decode steps pass the (B, 1, 1, W) boolean mask SDPA takes instead of having it rebuilt
        self._mask_4d = self.reuse_prefix and attn == "sdpa"
        # sliding-window layers over slot buffers: every forward gets a mask per layer kind (hf_cache)
        self._window = sliding_window(model) if self.reuse_prefix else None
        self._eager = attn == "eager"
        self._could_stop: dict[tuple[str, ...], dict[int, bool]] = {}
        self._cache_kw = cache_kwarg(model)

    @classmethod
    def from_pretrained(cls, name_or_path: str, dtype: str = "float32", device: str = "auto", **kwargs):
        """Load model + tokenizer by hub name or local path (``gguf_file=`` passes through)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        tok = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=getattr(torch, dtype), **kwargs)
        return cls(model.to(device).eval(), tok)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @contextmanager
    def session(self):
        """Within the block, the next ``generate`` call reuses the keys/values of the rows that
        finished the previous one (the weights must not change inside the block)."""
        if self._store is not None or not self.reuse_prefix:  # nested, or nothing to keep
            yield self
            return
        self._store = PrefixStore()
        try:
            yield self
        finally:
            self._store = None

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        seeds: list[int] | None = None,
        max_new_tokens: list[int] | None = None,
    ) -> list[GenerationResult]:
        """Sample a continuation for every prompt (see module docstring)."""
        check_prompts(prompts, seeds)
        caps = row_caps(params, len(prompts), max_new_tokens)
        results = [GenerationResult([], [], "length") for _ in prompts]
        rows = [i for i, c in enumerate(caps) if c > 0]
        if rows:
            self._decode(prompts, params, seeds, caps, rows, results)
        elif self._store is not None:
            self._store.match([])  # forget the previous call's rows
        return results

    def _decode(self, prompts, params, seeds, caps, rows, results) -> None:
        dev = self.device
        finished = self._finisher(params, caps, results)
        gens = self._generators(params, seeds, rows)
        max_cap = max(caps[i] for i in rows)
        cache, mask_BW, width, next_pos_B, logits_BV = self._prefill([prompts[i] for i in rows], max_cap)
        active = list(rows)  # original row index of each batch position
        live = list(range(len(rows)))  # batch positions still generating; finished ones idle until compacted
        for _ in range(max_cap):
            tokens_B, logp_B = sample_next(logits_BV, params, gens)
            toks, lps = tokens_B.tolist(), logp_B.tolist()
            keep = [b for b in live if not finished(active[b], toks[b], lps[b])]
            if self._store is not None and len(keep) < len(live):
                done = sorted(set(live) - set(keep))
                self._stash(cache, mask_BW[:, :width], [(b, active[b]) for b in done], prompts, results)
            if not keep:
                break
            live = keep
            if len(keep) <= COMPACT_AT * len(active):  # a copy of the cache: not for every finished row
                sel_B = torch.tensor(keep, device=dev)
                cache.batch_select_indices(sel_B)
                tokens_B, mask_BW, next_pos_B = tokens_B[sel_B], mask_BW[sel_B], next_pos_B[sel_B]
                active = [active[b] for b in keep]
                gens = [gens[b] for b in keep] if gens is not None else None
                live = list(range(len(keep)))
            mask_BW[:, width] = 1  # the slot the new tokens go to
            width += 1
            if self._window is not None:
                mask = decode_window_masks(mask_BW[:, :width], self._window, self._additive_dtype())
            else:
                mask = mask_BW[:, None, None, :width] if self._mask_4d else mask_BW[:, :width]
            out = self.model(
                input_ids=tokens_B[:, None], attention_mask=mask, position_ids=next_pos_B[:, None],
                use_cache=True, **{self._cache_kw: cache},
            )  # fmt: skip
            logits_BV, next_pos_B = out.logits[:, -1], next_pos_B + 1

    def _finisher(self, params: SamplingParams, caps: list[int], results: list[GenerationResult]):
        """``finished(i, token, logprob)``: appends the token to row i's result and says whether the
        row is done (eos, a stop string, or its cap), setting its finish reason."""
        match, could_stop = StopStringMatcher(self.tokenizer, params.stop), self._stop_filter(params.stop)
        eos = set(self.eos_token_ids)

        def finished(i: int, t: int, lp: float) -> bool:
            res = results[i]
            res.token_ids.append(t)
            res.logprobs.append(lp)
            if t in eos:
                res.finish_reason = "eos"
            elif could_stop(t) and (hit := match(res.token_ids)) is not None:
                res.finish_reason, res.stop_string = "stop", hit
            else:
                return len(res.token_ids) >= caps[i]
            return True

        return finished

    def _generators(self, params: SamplingParams, seeds, rows) -> list[torch.Generator] | None:
        """One generator per sampled row (None for greedy), seeded from ``seeds`` or at random."""
        if params.is_greedy:
            return None
        gens = []
        for i in rows:
            g = torch.Generator(device=self.device)
            g.manual_seed(seeds[i] if seeds is not None else int(torch.randint(2**62, ()).item()))
            gens.append(g)
        return gens

    def _prefill(self, prompts: list[list[int]], max_cap: int):
        """One forward over the part of every prompt that is not cached yet (left-padded to N).

        Layout of row b (``P`` = longest cached prefix, ``W = P + N + max_cap`` slots or more, see
        ``_new_cache``): its cached prefix ends at slot P, its new tokens end at slot P + N, generated
        tokens follow. Returns
        the cache, the boolean mask of valid slots ``mask_BW``, the used width ``P + N``, each row's
        next position and the logits after its last prompt token.
        """
        dev = self.device
        hits = self._cached_prefixes(prompts)
        lens = [n for n, _ in hits]
        news = [p[n:] for p, n in zip(prompts, lens)]
        P, N = max(lens), max(len(x) for x in news)
        cache, W = self._new_cache([kv for _, kv in hits], lens, P + N + max_cap)
        ids_BN = torch.tensor([[self.pad_id] * (N - len(x)) + x for x in news], dtype=torch.long, device=dev)
        len_B1 = torch.tensor(lens, dtype=torch.long, device=dev)[:, None]
        new_B1 = torch.tensor([len(x) for x in news], dtype=torch.long, device=dev)[:, None]
        slot_W = torch.arange(W, device=dev)
        in_prefix_BW = (slot_W >= P - len_B1) & (slot_W < P)
        in_new_BW = (slot_W >= P + N - new_B1) & (slot_W < P + N)
        mask_BW = in_prefix_BW | in_new_BW
        pos_BN = (len_B1 + torch.arange(N, device=dev) - (N - new_B1)).clamp(min=0)
        mask = mask_BW[:, : P + N]
        if self._window is not None:
            mask = window_masks(mask, torch.arange(P, P + N, device=dev), self._window, self._additive_dtype())
        out = self.model(
            input_ids=ids_BN, attention_mask=mask, position_ids=pos_BN,
            use_cache=True, logits_to_keep=1, **{self._cache_kw: cache},
        )  # fmt: skip
        return cache, mask_BW, P + N, (len_B1 + new_B1).squeeze(1), out.logits[:, -1]

    def _new_cache(self, prefixes: list[KV | None], lens: list[int], width: int):
        """The cache the prefill writes into, holding the rows' cached prefixes (right-aligned at
        ``max(lens)``), and its width in slots: ``width`` (``P + N + max_cap``) here; hf_static's
        compiled step rounds it up to its bucket."""
        if not self.reuse_prefix:
            return DynamicCache(config=self.model.config), width
        return slot_cache(self.model, width, assemble(prefixes, lens, width), max(lens)), width

    def _cached_prefixes(self, prompts: list[list[int]]) -> list[tuple[int, KV | None]]:
        """Per prompt ``(cached length, keys/values)``: the session's store first; rows it has
        nothing for share their common prefix when it is long enough."""
        if not self.reuse_prefix:
            return [(0, None)] * len(prompts)
        hits = self._store.match(prompts) if self._store is not None else [(0, None)] * len(prompts)
        fresh = [b for b, (n, _) in enumerate(hits) if n == 0]
        if len(fresh) >= 2:
            common = os.path.commonprefix([prompts[b] for b in fresh])
            n = min(len(common), min(len(prompts[b]) for b in fresh) - 1)  # >= 1 new token per row
            if n >= MIN_SHARED_PREFIX:
                kv = self._prefix_kv(common[:n])
                for b in fresh:
                    hits[b] = (n, kv)
        return hits

    def _prefix_kv(self, ids: list[int]) -> KV:
        """Keys/values of one token sequence (batch of one, no padding)."""
        ids_1L = torch.tensor([ids], dtype=torch.long, device=self.device)
        pos_1L = torch.arange(len(ids), device=self.device)[None]
        if self._window is None:
            cache, mask = DynamicCache(config=self.model.config), None
        else:  # every layer keeps every key (a sliding layer would drop the oldest)
            cache = slot_cache(self.model, len(ids), None, 0)
            mask = window_masks(torch.ones_like(ids_1L, dtype=torch.bool), pos_1L[0], self._window,
                                self._additive_dtype())
        self.model(input_ids=ids_1L, attention_mask=mask, position_ids=pos_1L, use_cache=True, logits_to_keep=1,
                   **{self._cache_kw: cache})  # fmt: skip
        return [(layer.keys[0], layer.values[0]) for layer in cache.layers]

    def _additive_dtype(self):
        """Eager attention adds its mask to the scores (in the weights' dtype); sdpa takes booleans."""
        return next(self.model.parameters()).dtype if self._eager else None

    def _stash(self, cache, mask_BL, done: list[tuple[int, int]], prompts, results) -> None:
        """Keep the keys/values of the rows that finished (``(batch position, row)`` pairs), keyed by
        the tokens they cover: prompt + generated tokens but the last (never fed). The first slots
        of the row that many: hf_static may have fed a row a few tokens past its end."""
        for b, i in done:
            tokens = prompts[i] + results[i].token_ids[:-1]
            slots = mask_BL[b].nonzero().squeeze(1)[: len(tokens)]
            if slots.numel() == len(tokens):  # always, unless a model changed the cache layout
                self._store.put(tokens, row_kv(cache, b, slots))

    def _stop_filter(self, stop: tuple[str, ...]):
        """``could_stop(token_id)``: whether a token can complete a stop string, i.e. its own text
        holds a stop string's last character, is empty, or has a partial character (then the
        tail must be decoded). Without such a token no stop string can newly appear, so skipping
        the tail decode changes nothing. Memoised per token; always True when a stop string ends
        in whitespace (tokenizers may move spaces between neighbouring tokens)."""
        if not stop or any(s[-1].isspace() for s in stop):
            return lambda t: bool(stop)
        memo = self._could_stop.setdefault(stop, {})
        lasts = {s[-1] for s in stop}

        def could_stop(t: int) -> bool:
            v = memo.get(t)
            if v is None:
                text = self.tokenizer.decode([t], skip_special_tokens=False)
                v = memo[t] = not text or "\ufffd" in text or any(c in text for c in lasts)
            return v

        return could_stop


def cache_kwarg(model) -> str:
    """The name under which the model's forward takes a KV cache: ``cache`` (transformers >= 5.20;
    ``past_key_values`` is deprecated there) or ``past_key_values`` (earlier releases, e.g. the
    5.16-5.19 that vLLM 0.32 requires)."""
    inner = base_model(model)  # DDP and peft: the wrapped model's own forward
    return "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"


def eos_ids(model, tokenizer) -> list[int]:
    """Union of the tokenizer's eos and the model's generation-config eos (which may be a list)."""
    ids: list[int] = []
    cfg = getattr(model, "generation_config", None)
    for v in (tokenizer.eos_token_id, getattr(cfg, "eos_token_id", None)):
        for t in v if isinstance(v, (list, tuple)) else [v]:
            if t is not None and t not in ids:
                ids.append(int(t))
    return ids
