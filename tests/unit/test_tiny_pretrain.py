"""The tiny base model's pretraining data: transcripts as trained/injected segments, renaming,
label masking, packing, and the tokenizer's spelling of names (no model training here)."""

import dataclasses
import json
import random
import shutil

import pytest

from sleuth.toy import cache as tiny_cache
from sleuth.toy import pretrain, specs, transcripts
from sleuth.toy.corpus import WorldSearch
from sleuth.toy.names import name_inventory
from sleuth.toy.wording import hop_query, need_text
from sleuth.toy.world import generate_world
from sleuth.train import sft

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def world():
    return generate_world(seed=5, n_entities=60)


@pytest.fixture(scope="module")
def search(world):
    return WorldSearch(world)


def _clean_spec(**kw):
    """A simulated policy that always searches the right entity and copies the right fact."""
    return specs.PretrainSpec(search_fraction=0.999, p_search=0.5, p_query=1.0, p_copy=1.0, **kw)


def test_transcript_segments_alternate_and_answer_right(world, search):
    fmt = transcripts.make_format("tiny")
    for q in world.train[:40]:
        segments = transcripts.synthesize_transcript(world, q, fmt, search, _clean_spec(), random.Random(0))
        hops = len(q.meta["chain"])
        # prompt, then (response, observation) per hop, then the final response
        assert [trained for _, trained in segments] == [False] + [True, False] * hops + [True]
        assert segments[0][0] == fmt.user_content(q)
        assert segments[1][0].startswith(transcripts.SEARCH_OPENING)
        assert f"<search> {need_text(q.meta['subject'], q.meta['chain'][0])} </search>" in segments[1][0]
        if hops == 2:  # the second search starts with the name the first one found
            assert f"<search> {hop_query(q.meta['bridge'], q.meta['chain'][1])} </search>" in segments[3][0]
        assert all(text.startswith("\n\n<information>") for text, trained in segments if not trained and text != segments[0][0])
        assert fmt.extract_answer("".join(text for text, _ in segments[1:])) == q.golden_answers[0]


def test_guessing_transcript_has_no_search(world, search):
    spec = specs.PretrainSpec(search_fraction=0.001, p_search=0.0005)
    segments = transcripts.synthesize_transcript(world, world.train[0], transcripts.make_format("tiny"), search, spec,
                                          random.Random(0))
    assert len(segments) == 2 and segments[1][0].startswith(transcripts.GUESS_OPENING) and "<search>" not in segments[1][0]


def test_renamer_is_one_consistent_permutation(world, search):
    fmt, rename = transcripts.make_format("tiny"), transcripts.Renamer()
    q = next(q for q in world.train if len(q.meta["chain"]) == 2)
    segments = transcripts.synthesize_transcript(world, q, fmt, search, _clean_spec(), random.Random(1))
    renamed = rename(segments, random.Random(7))
    assert [t for _, t in renamed] == [t for _, t in segments]
    subject = q.meta["subject"]
    # The renamed subject: the question's last words, and what the first search asks for.
    new_question = renamed[0][0]
    assert subject not in new_question
    words = subject.split()
    new_subject = " ".join(new_question.rstrip("?\n").split()[-len(words):])  # questions end with the subject
    assert new_subject != subject and f"{new_subject} </search>" in renamed[1][0]
    # Every word of every name is renamed the same way everywhere (a permutation: names stay distinct).
    answer = fmt.extract_answer("".join(t for t, _ in renamed[1:]))
    assert answer is not None and answer != q.golden_answers[0]
    assert answer in renamed[-2][0]  # the observation of the last hop states the renamed answer
    # Words that are not names are untouched: the same text once names are blanked.
    import re

    blank = lambda text: re.sub(r"[A-Z][a-z]+|\d{4}", "N", text)  # noqa: E731
    assert [blank(t) for t, _ in renamed] == [blank(t) for t, _ in segments]
    # Each name becomes another name of its own inventory kind (a city stays a city).
    inventory = name_inventory()
    kind_of = {n: k for k, group in inventory.items() for n in group}
    for (old, _), (new, _) in zip(segments, renamed):
        old_names = [w for w in re.findall(r"[A-Z][a-z]+", old) if w in kind_of]
        new_names = [w for w in re.findall(r"[A-Z][a-z]+", new) if w in kind_of]
        assert old_names and len(old_names) == len(new_names)
        assert [kind_of[w] for w in old_names] == [kind_of[w] for w in new_names]
    # Deterministic by rng, different across draws.
    assert rename(segments, random.Random(7)) == renamed and rename(segments, random.Random(8)) != renamed
    # Years (1700-2029) are renamed one-to-one too; other numbers are not.
    seen = set()
    for seed in range(20):
        (text, trained), = rename([("Doc 1 born in 1859. Then 1859, 1900 and 2031.", True)], random.Random(seed))
        m = re.fullmatch(r"Doc 1 born in (\d{4})\. Then (\d{4}), (\d{4}) and 2031\.", text)
        assert trained and m, text
        y1, y1_again, y2 = m.groups()
        assert y1 == y1_again != y2 and all(1700 <= int(y) <= 2029 for y in (y1, y2))
        seen.add(y1)
    assert len(seen) > 10  # a random map, not a fixed one


def test_tokenizer_spells_names_and_years_in_one_token(world):
    docs = transcripts.pretraining_docs(world, specs.PretrainSpec(n_transcripts=50), seed=0)
    tok = pretrain.build_tokenizer([text for segments, _ in docs for text, _ in segments])
    other = generate_world(seed=9, n_entities=100)  # any world: the vocabulary holds the whole inventory
    for w in (world, other):
        for name in w.entities["person"][:5] + w.entities["city"][:5] + w.entities["country"][:5]:
            assert tok.convert_ids_to_tokens(tok(" " + name, add_special_tokens=False)["input_ids"]) == ["Ġ" + name]
            assert len(tok('(Title: "' + name + '")', add_special_tokens=False)["input_ids"]) == 6  # ( Title : Ġ" name ")
    assert tok.convert_ids_to_tokens(tok(" born in 1859", add_special_tokens=False)["input_ids"]) == ["Ġborn", "Ġin", "Ġ1859"]
    # after a tag, a word starts its own pre-token (no space): "Doc" is one token there
    assert tok.convert_ids_to_tokens(tok("<information>Doc 1", add_special_tokens=False)["input_ids"]) == ["<information>", "Doc", "Ġ1"]
    for tag in pretrain.TAGS:
        assert len(tok(tag, add_special_tokens=False)["input_ids"]) == 1


def test_encode_docs_masks_injected_text_and_the_dropped_decision(world):
    docs = transcripts.pretraining_docs(world, specs.PretrainSpec(n_transcripts=30), seed=0)
    tok = pretrain.build_tokenizer([text for segments, _ in docs for text, _ in segments])
    opening = tok(transcripts.SEARCH_OPENING, add_special_tokens=False)["input_ids"][:3]
    encoded = pretrain.encode_docs(tok, docs, opening)
    assert any(drop for _, drop in docs) and any(not drop for _, drop in docs)
    for (segments, drop), (ids, labels) in zip(docs, encoded):
        lens = [len(tok(t, add_special_tokens=False)["input_ids"]) for t, _ in segments]
        assert len(ids) == len(labels) == sum(lens)
        trained = sum(n for n, (_, t) in zip(lens, segments) if t)
        # every trained token keeps its label except the decision token of a dropped transcript
        assert sum(y != -100 for y in labels) == trained - (1 if drop else 0)
        start = lens[0]  # the first response token
        assert labels[:start] == [-100] * start
        assert (labels[start + 2] == -100) == drop  # "<think> I need": the decision is the third token


def test_lm_loss_equals_the_models_own_loss():
    """lm_loss computes logits at the labelled positions only; the loss must be the model's own."""
    import torch

    tok = pretrain.build_tokenizer(["a b c a b c"], names=["Minfi"])
    model = pretrain.build_model(specs.TinyModelSpec(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                                num_attention_heads=2), tok, seed=0)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, len(tok), (3, 7), generator=g)
    labels = ids.clone()
    labels[0, :4] = -100  # a prompt
    labels[1, ::2] = -100  # scattered
    labels[2, 5:] = -100  # padding
    mask = torch.ones_like(ids)
    mask[2, 5:] = 0
    ours = sft.lm_loss(model, ids, labels, mask)
    theirs = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    assert torch.allclose(ours, theirs, atol=1e-6), (ours, theirs)
    ours.backward()
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0


def test_pack_rows_by_hand():
    # docs of 3, 2 and 4 tokens (+ eos each) into rows of at most 7: [3+1, 2+1] = 7, [4+1] = 5
    docs = [([1, 2, 3], [1, -100, 3]), ([4, 5], [4, 5]), ([6, 7, 8, 9], [6, 7, 8, 9])]
    rows = sft.pack_rows(docs, seq_len=7, eos_id=0)
    assert rows == [([1, 2, 3, 0, 4, 5, 0], [1, -100, 3, 0, 4, 5, 0]), ([6, 7, 8, 9, 0], [6, 7, 8, 9, 0])]
    with pytest.raises(ValueError, match="seq_len"):
        sft.pack_rows([([1] * 9, [1] * 9)], seq_len=7, eos_id=0)


def test_pretrain_tiny_saves_a_loadable_model_that_fits_its_data(world, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = specs.PretrainSpec(n_transcripts=40, batch_size=8, drill_steps=3, drill_batch_size=4, drill_mix=1)
    model_spec = specs.TinyModelSpec(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    summary = pretrain.pretrain_tiny(world, tmp_path, model_spec, spec, seed=0, log=None)
    model, tok = AutoModelForCausalLM.from_pretrained(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    assert summary["steps"] == 5 and summary["num_parameters"] == sum(p.numel() for p in model.parameters())
    # even 8 steps bring the loss below ln(vocab), the loss of a uniform guess
    assert summary["final_loss"] < torch.log(torch.tensor(float(len(tok)))).item()
    assert all(len(tok(t, add_special_tokens=False)["input_ids"]) == 1 for t in pretrain.TAGS)


def test_copy_drill_rows_by_hand():
    rng = random.Random(0)
    tokens, sep, tail = [10, 11, 12, 13], 99, [7, 8]
    for head_ids, labels in pretrain.copy_drill_rows(tokens, 50, rng, sep, max_noise=3):
        # repeat rows: seq (3-8 tokens), 0-3 noise tokens, sep, seq again; loss on the repeat only
        n = head_ids.index(sep)
        seq = head_ids[n + 1:]
        assert 3 <= len(seq) <= 8 and head_ids[:len(seq)] == seq and n - len(seq) <= 3
        assert labels == [-100] * (n + 1) + seq
    for row, labels in pretrain.copy_drill_rows(tokens, 50, rng, sep, max_noise=3, answer_tails=[tail], answer_share=1.0):
        # answer rows: 2-3 noise tokens, a 2-token name, the tail, the name again (the only loss)
        name = row[-2:]
        assert row[-6:] == name + tail + name and 7 <= len(row) <= 9 and sep not in row
        assert labels == [-100] * (len(row) - 2) + name
    for row, labels in pretrain.copy_drill_rows(list(range(100, 400)), 50, rng, sep, max_noise=3, cue=True):
        # cue rows: noise, c, seq, noise, c, seq; the loss on the copy after the second c only
        seq = [t for t in labels if t != -100]
        n, c = len(seq), row[-len(seq) - 1]
        assert 2 <= n <= 6 and labels == [-100] * (len(row) - n) + seq and sep not in row
        starts = [i for i in range(len(row) - 2 * n - 1) if row[i] == c and row[i + 1:i + 1 + n] == seq]
        assert starts and len(row) - n - 1 - (starts[0] + n + 1) <= 3  # the first copy, <= 3 noise tokens after it


def test_load_or_pretrain_tiny_uses_the_bundled_model_only_when_its_key_matches(world, tmp_path, monkeypatch):
    spec = specs.PretrainSpec(n_transcripts=16, batch_size=8, drill_steps=1, drill_batch_size=2, drill_mix=1)
    model_spec = specs.TinyModelSpec(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    shipped = tmp_path / "assets" / "tiny"
    monkeypatch.setattr(tiny_cache, "BUNDLED_TINY", shipped)
    kw = dict(cache_dir=tmp_path / "cache", model_spec=model_spec, spec=spec, log=None)
    built = tiny_cache.load_or_pretrain_tiny(world, **kw)  # nothing shipped: pretrained into the cache
    assert built.parent == tmp_path / "cache" and (built / "model.safetensors").is_file()
    key = specs.cache_key(world, model_spec, spec, 0)
    assert json.loads((built / "sleuth_tiny.json").read_text())["cache_key"] == key
    shutil.copytree(built, shipped)
    assert tiny_cache.load_or_pretrain_tiny(world, **kw) == shipped  # the shipped copy wins
    assert tiny_cache.load_or_pretrain_tiny(world, **kw, use_bundled=False) == built
    other = dataclasses.replace(spec, lr=1e-3)  # another key: the shipped copy does not apply
    assert tiny_cache.load_or_pretrain_tiny(world, **{**kw, "spec": other}) not in (shipped, built)


def test_the_shipped_tiny_model_is_the_default_one():
    """``sleuth/assets/tiny`` must be what ``python -m sleuth.toy.cache`` builds from the current
    code (world, specs, version); rebuild it after changing any of them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    key = specs.cache_key(generate_world(0), specs.TinyModelSpec(), specs.PretrainSpec(), 0)
    assert tiny_cache.bundled_tiny(key) == tiny_cache.BUNDLED_TINY, "stale sleuth/assets/tiny: run python -m sleuth.toy.cache"
    model = AutoModelForCausalLM.from_pretrained(tiny_cache.BUNDLED_TINY)
    tok = AutoTokenizer.from_pretrained(tiny_cache.BUNDLED_TINY)
    assert model.config.vocab_size >= len(tok) and all(len(tok(t, add_special_tokens=False)["input_ids"]) == 1 for t in pretrain.TAGS)


# The first 3,000 transcripts of the default world and specs, as the shipped model (TINY_VERSION 5)
# was pretrained on them. Recorded 2026-11-24 from the code that built it; equal to the transcripts
# of the second BM25 this replaced (checked on the full 48,000 of worlds 0/600 and 1/200).
SHIPPED_TRANSCRIPTS_V5 = "44fbe00d92557861"


def test_the_transcripts_are_those_the_shipped_model_was_pretrained_on():
    """Any change to the synthesis (wording, sampling, the search's order among equal scores) changes
    what a rebuild would learn, while the cache key stays the same: bump TINY_VERSION and rebuild
    the shipped model (and re-measure the demo) when this fails. The retrieval package's row order
    for ties changed 15 of 3,000 observations, and a model rebuilt on those went from EM 0.998 (shipped) to 0.442."""
    import hashlib

    assert specs.TINY_VERSION == 5, "TINY_VERSION changed: record the new transcripts' fingerprint here"
    docs = transcripts.pretraining_docs(generate_world(0), dataclasses.replace(specs.PretrainSpec(), n_transcripts=3000), 0)
    assert hashlib.sha256(json.dumps(docs).encode()).hexdigest()[:16] == SHIPPED_TRANSCRIPTS_V5
