"""Supervised (causal-LM) training pieces: documents as ``(ids, labels)`` rows (labels -100 where no
loss), rows batched by length or packed, the loss and one optimizer step. The embedded tiny model's
pretraining (:mod:`sleuth.toy.pretrain`) and ``sleuth sft`` (:mod:`sleuth.sft.loop`) both train with
:func:`supervised_step`."""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F

from sleuth.train.forward import length_buckets, selected_logits


def bucket_rows(docs: list[tuple[list[int], list[int]]], batch_size: int, eos_id: int,
                rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """One document (+ eos) per row, ordered so that each run of ``batch_size`` rows holds documents
    of similar length (little padding) while the order of the batches is random. A row never shows
    another transcript's names, which would only confuse a model learning to copy them."""
    order = sorted(range(len(docs)), key=lambda i: len(docs[i][0]))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return [(docs[i][0] + [eos_id], docs[i][1] + [eos_id]) for batch in batches for i in batch]

def pack_rows(docs: list[tuple[list[int], list[int]]], seq_len: int, eos_id: int) -> list[tuple[list[int], list[int]]]:
    """Whole ``(ids, labels)`` documents, each followed by eos, packed greedily in order into rows of
    at most ``seq_len`` tokens."""
    rows, row_ids, row_labels = [], [], []
    for n, (ids, labels) in enumerate(docs):
        ids, labels = ids + [eos_id], labels + [eos_id]
        if len(ids) > seq_len:
            raise ValueError(f"pretraining document {n} has {len(ids)} tokens > seq_len={seq_len}; raise seq_len")
        if len(row_ids) + len(ids) > seq_len:
            rows.append((row_ids, row_labels))
            row_ids, row_labels = [], []
        row_ids, row_labels = row_ids + ids, row_labels + labels
    if row_ids:
        rows.append((row_ids, row_labels))
    return rows

def batch_tensors(batch: list[tuple[list[int], list[int]]], pad_id: int):
    width = max(len(ids) for ids, _ in batch)
    input_ids_BT = torch.full((len(batch), width), pad_id)
    labels_BT = torch.full((len(batch), width), -100)
    mask_BT = torch.zeros((len(batch), width), dtype=torch.long)
    for b, (ids, labels) in enumerate(batch):
        input_ids_BT[b, :len(ids)] = torch.tensor(ids)
        labels_BT[b, :len(ids)] = torch.tensor(labels)
        mask_BT[b, :len(ids)] = 1
    return input_ids_BT, labels_BT, mask_BT

def lm_loss(model, input_ids_BT, labels_BT, mask_BT, denominator: float | None = None):
    """The causal-LM loss of ``model(..., labels=labels_BT).loss`` (mean over the labelled next
    tokens; with ``denominator``, their sum divided by it), with the output layer applied to the
    labelled positions only: the prompt and the drill rows' heads cost no logits (the output layer
    is ~40% of the tiny model's compute). Through the model's forward, so wrappers (DDP, peft) apply."""
    target_Bt = labels_BT[:, 1:]
    keep_BT = torch.zeros_like(labels_BT, dtype=torch.bool)
    keep_BT[:, :-1] = target_Bt != -100
    logits_NV = selected_logits(model, input_ids_BT, mask_BT, None, keep_BT)
    if denominator is None:
        return F.cross_entropy(logits_NV.float(), target_Bt[target_Bt != -100])
    return F.cross_entropy(logits_NV.float(), target_Bt[target_Bt != -100], reduction="sum") / denominator


def supervised_step(model, optimizer, rows: list[tuple[list[int], list[int]]], pad_id: int, *,
                    micro_batch_size: int | None = None, max_tokens: int | None = None,
                    grad_clip: float | None = 1.0) -> dict[str, float]:
    """One optimizer step on ``rows``: the mean loss over their labelled tokens, accumulated over
    length-bucketed micro-batches of ``micro_batch_size`` rows and ``max_tokens`` token slots (None: one
    batch); gradients clipped
    to ``grad_clip``. Returns ``loss``, ``grad_norm``, ``tokens`` (labelled) and ``skipped`` (1 when
    the loss or gradient was not finite: no step taken)."""
    if micro_batch_size is None:
        buckets = [list(range(len(rows)))]
    else:
        buckets = length_buckets([len(ids) for ids, _ in rows], micro_batch_size, max_tokens)
    tokens = sum(sum(1 for y in labels[1:] if y != -100) for _, labels in rows)
    loss_sum = 0.0
    for bucket in buckets:
        batch = [rows[i] for i in bucket]
        input_ids_BT, labels_BT, mask_BT = batch_tensors(batch, pad_id)
        device = next(model.parameters()).device
        loss = lm_loss(model, input_ids_BT.to(device), labels_BT.to(device), mask_BT.to(device),
                       denominator=None if len(buckets) == 1 else max(tokens, 1))
        loss.backward()
        loss_sum += float(loss.detach())
    params = [p for p in model.parameters() if p.grad is not None]
    norm = float(torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip else float("inf")))
    finite = math.isfinite(loss_sum) and math.isfinite(norm)
    if finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": loss_sum, "grad_norm": norm, "tokens": float(tokens), "skipped": float(not finite)}
