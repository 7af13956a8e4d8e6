"""Supervised (causal-LM) training pieces: documents as ``(ids, labels)`` rows (labels -100 where no
loss), rows batched by length or packed, and the loss. The embedded tiny model is pretrained with
them (:mod:`sleuth.toy.pretrain`); a general supervised fine-tuning loop builds on the same pieces."""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F


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

def lm_loss(model, input_ids_BT, labels_BT, mask_BT):
    """The causal-LM loss of ``model(..., labels=labels_BT).loss`` (mean over the labelled next
    tokens), with the output layer applied to the labelled positions only: the prompt and the
    drill rows' heads cost no logits (the output layer is ~40% of the tiny model's compute)."""
    hidden_BTH = model.model(input_ids=input_ids_BT, attention_mask=mask_BT).last_hidden_state
    target_BT = labels_BT[:, 1:]
    keep_BT = target_BT != -100
    logits_NV = model.lm_head(hidden_BTH[:, :-1][keep_BT])
    return F.cross_entropy(logits_NV.float(), target_BT[keep_BT])
