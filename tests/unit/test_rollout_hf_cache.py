"""Pieces of the HF backend's fast path on tiny inputs: the prefix store, the in-place cache layer
against ``DynamicLayer``, the batch layout of prefixes, and the stop-string pre-filter against the
plain matcher."""

import random

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from sleuth.rollout.backends import StopStringMatcher
from sleuth.rollout.hf_backend import HFBackend
from sleuth.rollout.hf_cache import PrefixStore, SlotLayer, assemble
from tests.helpers.tiny import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.unit


def kv(tag: float, n: int):
    """One layer's (keys, values) for one row: H=1, D=2, every entry ``tag``."""
    return [(torch.full((1, n, 2), tag), torch.full((1, n, 2), -tag))]


def test_prefix_store_finds_the_longest_strict_prefix_then_forgets():
    store = PrefixStore()
    short, long_ = kv(1.0, 3), kv(2.0, 5)
    store.put([1, 2, 3], short)
    store.put([1, 2, 3, 4, 5], long_)
    hits = store.match([[1, 2, 3, 4, 5, 6], [1, 2, 3, 9], [1, 2, 3], [1, 2, 3, 4, 5], [7, 1, 2, 3]])
    # [1,2,3,4,5,6] -> the 5-token key; [1,2,3,9] -> the 3-token key; [1,2,3] and [1,2,3,4,5] equal a
    # key (no new token would be left to feed) -> the shorter key / nothing; [7,...] -> nothing
    assert [n for n, _ in hits] == [5, 3, 0, 3, 0]
    assert hits[0][1] is long_ and hits[1][1] is short
    assert len(store) == 0 and store.match([[1, 2, 3, 4]]) == [(0, None)]


def test_assemble_right_aligns_prefixes_and_writes_shared_ones_once():
    shared, own = kv(1.0, 2), kv(3.0, 3)
    (k_BHWD, v_BHWD), = assemble([shared, None, own, shared], [2, 0, 3, 2], capacity=5)  # fmt: skip
    # P = 3: rows 0 and 3 hold 1.0 in slots 1..2, row 2 holds 3.0 in slots 0..2, row 1 nothing
    assert k_BHWD.shape == (4, 1, 5, 2)
    assert k_BHWD[:, 0, :, 0].tolist() == [[0, 1, 1, 0, 0], [0, 0, 0, 0, 0], [3, 3, 3, 0, 0], [0, 1, 1, 0, 0]]
    assert torch.equal(v_BHWD, -k_BHWD)
    assert assemble([None, None], [0, 0], capacity=4) is None


def test_assemble_and_slot_layers_keep_keys_in_the_values_dtype():
    """Under bf16 autocast with float32 weights a layer's keys leave the rotary embedding in float32
    and its values leave v_proj in bf16; attention casts the keys to bf16 anyway, so the cache keeps
    them in bf16: half the bytes of float32 keys, and no cast of the whole key cache per decode step
    (the memory plan counts K and V in the compute dtype)."""
    prefix = [(torch.ones(1, 2, 2), torch.ones(1, 2, 2, dtype=torch.bfloat16))]
    (k_BHWD, v_BHWD), = assemble([prefix, prefix, None], [2, 2, 0], capacity=4)  # fmt: skip
    assert k_BHWD.dtype == v_BHWD.dtype == torch.bfloat16
    assert v_BHWD[:2, 0, :2].float().eq(1).all() and not v_BHWD[2].any() and k_BHWD[:2, 0, :2].float().eq(1).all()
    layer = SlotLayer(capacity=4)
    keys = torch.randn(2, 1, 3, 4)
    k, v = layer.update(keys, torch.randn(2, 1, 3, 4).bfloat16())
    assert layer.k_buf.dtype == layer.v_buf.dtype == k.dtype == torch.bfloat16
    assert torch.equal(k, keys.bfloat16())  # the cast attention would make
    layer.static_slot = torch.tensor([3])  # hf_static's in-place write casts too
    layer.update(torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4).bfloat16())
    assert layer.k_buf[:, :, 3].float().eq(1).all()


def test_slot_layer_equals_dynamic_layer():
    torch.manual_seed(0)
    slot, ref = SlotLayer(capacity=6), DynamicLayer()
    chunks = [torch.randn(3, 2, n, 4) for n in (4, 1, 1)]
    for c in chunks:  # prefill 4 slots, then two decode steps
        out_s, out_r = slot.update(c, -c), ref.update(c, -c)
        assert torch.equal(out_s[0], out_r[0]) and torch.equal(out_s[1], out_r[1])
    idx = torch.tensor([2, 0])
    slot.batch_select_indices(idx)
    ref.batch_select_indices(idx)
    extra = torch.randn(2, 2, 3, 4)  # past the capacity of 6 slots: grows
    out_s, out_r = slot.update(extra, extra), ref.update(extra, extra)
    assert torch.equal(out_s[0], out_r[0]) and torch.equal(out_s[1], out_r[1])
    assert slot.get_seq_length() == ref.get_seq_length() == 9


@pytest.mark.parametrize("stop", [("</search>", "</answer>"), ("é!", "ab"), ("\n",), ("x ",)])
def test_stop_prefilter_finds_the_same_stops_as_the_plain_matcher(stop):
    tok = tiny_tokenizer()
    backend = HFBackend(tiny_model(tok), tok)
    plain, could_stop = StopStringMatcher(tok, stop), backend._stop_filter(stop)
    pieces = [tok(s, add_special_tokens=False)["input_ids"] for s in (*stop, "<search> x", "é", "Paris", " a")]
    rng = random.Random(0)

    def first_stop(ids, prefilter):
        """(length, stop string) at the first step whose check finds a stop, or None."""
        for n in range(1, len(ids) + 1):
            if (not prefilter or could_stop(ids[n - 1])) and (hit := plain(ids[:n])):
                return n, hit
        return None

    for _ in range(150):
        ids = [t for _ in range(8) for t in (rng.choice(pieces) if rng.random() < 0.5 else [rng.randrange(len(tok))])]
        assert first_stop(ids, True) == first_stop(ids, False), ids
