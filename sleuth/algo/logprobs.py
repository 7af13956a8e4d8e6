"""Per-token log-probabilities and entropy from logits, chunked over tokens.

``logits_BTV[:, t]`` is the distribution that produced ``tokens_BT[:, t]`` (already aligned; see
:func:`next_token_logprobs` for the usual one-position shift of a causal LM's output).

Memory: the full ``log_softmax`` ``[B, T, V]`` tensor is never built. Each chunk of ``C`` tokens
is upcast to float32 (a no-op view for float32 logits), divided by the temperature (a copy only
when ``temperature != 1``), reduced with ``logsumexp`` and indexed with ``gather``. Under
``torch.no_grad()`` (old / reference logprobs) the extra memory is one ``[B, C, V]`` chunk. With
autograd on, each chunk's scaled copy is saved for the backward pass, so chunking bounds the
*forward* transient only; it saves the log-softmax output either way.

Temperature is applied exactly as the sampler applies it: the sampler draws from
``softmax(logits / temperature)``, so the logprob of a sampled token is
``log_softmax(logits / temperature)[token]``. Use the same temperature for the trainer's old,
current and reference logprobs so that ratios against the sampler's logprobs are consistent.
Greedy decoding (temperature 0) has no finite logprobs and is refused.

Entropy per token is ``H = logsumexp(z) - sum_v softmax(z)_v * z_v`` with ``z = logits / temperature``,
the entropy of the distribution actually sampled from.

Departure from torchtune's ``rlhf.get_batch_log_probs`` / TRL's ``selective_log_softmax``: both
compute in the logits' dtype; here each chunk is upcast to at least float32 (bf16 log-softmax
over a 150k vocabulary loses about two digits).
"""

from __future__ import annotations

import math

import torch

__all__ = ["entropy_from_logits", "logprobs_and_entropy", "logprobs_from_logits", "next_token_logprobs"]

DEFAULT_CHUNK_TOKENS = 4096  # B*C rows of V logits processed at once


def _check_inputs(logits_BTV: torch.Tensor, tokens_BT: torch.Tensor | None, temperature: float) -> None:
    """Validate shapes, dtypes, token range and temperature with messages that name the argument.

    The token-range check reads two scalars back from the device (one sync per call).
    """
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(
            f"temperature must be a finite number > 0 (the sampler's temperature), got {temperature!r}; "
            "greedy decoding has no finite logprobs"
        )
    if logits_BTV.dim() != 3:
        raise ValueError(f"logits_BTV must have shape [B, T, V], got {list(logits_BTV.shape)}")
    if tokens_BT is None:
        return
    if tokens_BT.shape != logits_BTV.shape[:2]:
        raise ValueError(
            f"tokens_BT shape {list(tokens_BT.shape)} does not match logits_BTV [B, T] = {list(logits_BTV.shape[:2])}"
        )
    if tokens_BT.dtype.is_floating_point or tokens_BT.dtype == torch.bool:
        raise ValueError(f"tokens_BT must hold integer token ids, got dtype {tokens_BT.dtype}")
    if tokens_BT.numel() and (tokens_BT.min() < 0 or tokens_BT.max() >= logits_BTV.shape[-1]):
        raise ValueError(
            f"tokens_BT holds ids in [{int(tokens_BT.min())}, {int(tokens_BT.max())}] but the vocabulary "
            f"has V={logits_BTV.shape[-1]} entries; replace padding ids (e.g. -100) by a valid id before calling"
        )


def _scaled(logits_BCV: torch.Tensor, temperature: float) -> torch.Tensor:
    """Upcast a chunk to >= float32 and divide by the temperature (copies only when needed)."""
    z_BCV = logits_BCV.to(torch.promote_types(logits_BCV.dtype, torch.float32))  # [B, C, V]
    return z_BCV if temperature == 1.0 else z_BCV / temperature  # [B, C, V]


def _chunks(B: int, T: int, chunk_tokens: int) -> list[tuple[int, int]]:
    """[start, end) ranges over T holding about ``chunk_tokens`` rows each."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    step = max(1, chunk_tokens // max(B, 1))
    return [(s, min(s + step, T)) for s in range(0, T, step)]


def logprobs_and_entropy(
    logits_BTV: torch.Tensor,
    tokens_BT: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of each token and the entropy at each position, sharing one pass.

    Returns ``(logprobs_BT, entropy_BT)`` in float32 (float64 for float64 logits); ``entropy_BT``
    is None when ``with_entropy`` is False.
    """
    _check_inputs(logits_BTV, tokens_BT, temperature)
    B, T, _ = logits_BTV.shape
    logprob_chunks, entropy_chunks = [], []
    for start, end in _chunks(B, T, chunk_tokens):
        z_BCV = _scaled(logits_BTV[:, start:end], temperature)  # [B, C, V]
        lse_BC = torch.logsumexp(z_BCV, dim=-1)  # [B, C]
        picked_BC = z_BCV.gather(-1, tokens_BT[:, start:end, None].long()).squeeze(-1)  # [B, C]
        logprob_chunks.append(picked_BC - lse_BC)  # [B, C]
        if with_entropy:
            entropy_chunks.append(_entropy_chunk(z_BCV, lse_BC))  # [B, C]
    dtype = torch.promote_types(logits_BTV.dtype, torch.float32)
    empty_BT = logits_BTV.new_zeros((B, 0), dtype=dtype)  # T = 0 edge case
    logprobs_BT = torch.cat(logprob_chunks, dim=1) if logprob_chunks else empty_BT  # [B, T]
    if not with_entropy:
        return logprobs_BT, None
    entropy_BT = torch.cat(entropy_chunks, dim=1) if entropy_chunks else empty_BT  # [B, T]
    return logprobs_BT, entropy_BT


def _entropy_chunk(z_BCV: torch.Tensor, lse_BC: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(z) per row: lse - <softmax(z), z>, the dot product without a product copy."""
    probs_BCV = torch.softmax(z_BCV, dim=-1)  # [B, C, V]
    with torch.autocast(z_BCV.device.type, enabled=False):  # in z's dtype (autocast would run it in bf16)
        expected_z_BC = (probs_BCV.unsqueeze(-2) @ z_BCV.unsqueeze(-1)).squeeze(-1).squeeze(-1)  # [B, C]
    return lse_BC - expected_z_BC  # [B, C]


def logprobs_from_logits(
    logits_BTV: torch.Tensor,
    tokens_BT: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` at each token, shape [B, T], without the [B, T, V] output."""
    logprobs_BT, _ = logprobs_and_entropy(
        logits_BTV, tokens_BT, temperature=temperature, chunk_tokens=chunk_tokens, with_entropy=False
    )
    return logprobs_BT


def entropy_from_logits(
    logits_BTV: torch.Tensor, *, temperature: float = 1.0, chunk_tokens: int = DEFAULT_CHUNK_TOKENS
) -> torch.Tensor:
    """Entropy of ``softmax(logits / temperature)`` at each position, shape [B, T]."""
    _check_inputs(logits_BTV, None, temperature)
    B, T, _ = logits_BTV.shape
    entropy_chunks = []
    for start, end in _chunks(B, T, chunk_tokens):
        z_BCV = _scaled(logits_BTV[:, start:end], temperature)  # [B, C, V]
        entropy_chunks.append(_entropy_chunk(z_BCV, torch.logsumexp(z_BCV, dim=-1)))  # [B, C]
    if not entropy_chunks:
        return logits_BTV.new_zeros((B, 0), dtype=torch.promote_types(logits_BTV.dtype, torch.float32))
    return torch.cat(entropy_chunks, dim=1)  # [B, T]


def next_token_logprobs(
    logits_BTV: torch.Tensor,
    input_ids_BT: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """Causal-LM convenience: logprob of ``input_ids[:, t+1]`` under ``logits[:, t]``; shape [B, T-1].

    Slicing is a view, so the shift itself copies nothing. Position ``t`` of the result scores
    token ``t + 1`` of the input: shift the loss mask the same way (``mask_BT[:, 1:]``).
    """
    if input_ids_BT.shape != logits_BTV.shape[:2]:
        raise ValueError(
            f"input_ids_BT shape {list(input_ids_BT.shape)} does not match logits_BTV [B, T] = "
            f"{list(logits_BTV.shape[:2])}"
        )
    return logprobs_from_logits(
        logits_BTV[:, :-1], input_ids_BT[:, 1:], temperature=temperature, chunk_tokens=chunk_tokens
    )
