"""How a step's rows run through the model, chosen once per run: padded, packed or shared-prefix.

The rollout gives right-padded [B, T] rows. Every forward of a step (the no-grad logprob passes, the
critic's values, the update's micro-batches) cuts them into micro-batches of at most
``train.micro_batch_size`` rows and ``train.max_tokens_per_micro_batch`` token slots, in one of three
layouts:

* ``padded``: rows of similar length together, each micro-batch trimmed to its longest row
  (:func:`sleuth.train.forward.length_buckets`);
* ``packed`` (``train.remove_padding`` where the model supports it): each micro-batch's rows run as one
  row without padding, its budget counting real tokens;
* ``shared_prefix`` (``train.share_prefix`` where the model's KV cache allows it: full attention, or full
  and sliding-window layers): micro-batches of rows with common leading tokens, the common part run once
  (:mod:`sleuth.train.prefix_share`); the critic's values run padded.

:class:`RowLayout` holds the choice and the budget, gives the micro-batches, runs the no-grad passes in
them and says what they cost (``perf/padding_share`` or ``perf/computed_token_share``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sleuth.train.forward import (batched_logprobs, batched_values, length_buckets, padding_share, supports_packing,
                                  supports_shared_prefix)
from sleuth.train.prefix_share import computed_share, prefix_buckets

KINDS = ("padded", "packed", "shared_prefix")


@dataclass(frozen=True)
class RowLayout:
    kind: str = "padded"
    micro_batch_size: int = 1
    max_tokens: int | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"row layout must be one of {KINDS}, got {self.kind!r}")

    @property
    def packed(self) -> bool:
        return self.kind == "packed"

    @property
    def shared_prefix(self) -> bool:
        return self.kind == "shared_prefix"

    @classmethod
    def choose(cls, train, model, *, warn: bool = True) -> RowLayout:
        """``train.share_prefix`` / ``train.remove_padding`` where ``model`` supports them (else a
        warning, printed when ``warn``, and the micro-batches run padded or whole)."""
        kind = "padded"
        config = getattr(model, "config", None)
        if train.share_prefix:  # settings it cannot run with at all are refused before loading (state.py)
            if supports_shared_prefix(model):
                kind = "shared_prefix"
            elif warn:
                print(f"warning: train.share_prefix is set but {type(model).__name__}'s KV cache is neither plain "
                      "full attention nor full and sliding-window layers under sdpa or eager attention "
                      "(sleuth.train.forward.supports_shared_prefix); the micro-batches run whole", flush=True)
        elif train.remove_padding:
            if supports_packing(model):
                kind = "packed"
            elif warn:
                print(f"warning: train.remove_padding is set but "
                      f"{getattr(config, 'model_type', type(model).__name__)!r} with attention "
                      f"{getattr(config, '_attn_implementation', None)!r} cannot run packed rows "
                      "(sleuth.train.forward.supports_packing); the micro-batches run padded", flush=True)
        return cls(kind, train.micro_batch_size, train.max_tokens_per_micro_batch)

    def buckets(self, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> list[list[int]]:
        """The micro-batches of these rows: lists of row indices, every row in exactly one."""
        if self.shared_prefix:
            return prefix_buckets(input_ids_BT, attention_mask_BT, self.micro_batch_size, self.max_tokens)
        return length_buckets(attention_mask_BT.sum(-1).tolist(), self.micro_batch_size, self.max_tokens,
                              packed=self.packed)

    def logprobs(self, model, input_ids_BT, attention_mask_BT, *, temperature: float,
                 needed_BT: torch.Tensor | None = None) -> torch.Tensor:
        """No-grad logprobs [B, T] of every row (0 outside ``needed_BT``), micro-batch by micro-batch."""
        return batched_logprobs(model, input_ids_BT, attention_mask_BT, micro_batch_size=self.micro_batch_size,
                                max_tokens=self.max_tokens, temperature=temperature, needed_BT=needed_BT,
                                packed=self.packed, shared_prefix=self.shared_prefix)

    def values(self, critic, input_ids_BT, attention_mask_BT) -> torch.Tensor:
        """The critic's no-grad values [B, T] (whole rows under shared_prefix: the critic never shares)."""
        return batched_values(critic, input_ids_BT, attention_mask_BT, micro_batch_size=self.micro_batch_size,
                              max_tokens=self.max_tokens, packed=self.packed)

    def cost(self, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> dict[str, float]:
        """``perf/computed_token_share`` (shared prefixes) or ``perf/padding_share`` of these rows."""
        if self.shared_prefix:
            return {"perf/computed_token_share": computed_share(input_ids_BT, attention_mask_BT,
                                                                self.buckets(input_ids_BT, attention_mask_BT))}
        lengths = attention_mask_BT.sum(-1).tolist()
        return {"perf/padding_share": padding_share(lengths, self.buckets(input_ids_BT, attention_mask_BT),
                                                    packed=self.packed)}
