"""``sleuth sft``'s parts: transcripts tokenise exactly as a rollout of the same actions, the
synthesizer keeps only grounded transcripts (counted per reason), the trajectories source filters
by reward, the step order is a per-epoch permutation, and the supervised step is the plain loss."""

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from sleuth.config import Config, RolloutConfig
from sleuth.errors import UserError
from sleuth.retrieval.memory import InMemoryRetriever
from sleuth.rollout.batching import trajectories_to_batch
from sleuth.rollout.chat import ChatRenderer
from sleuth.rollout.formats import get_format
from sleuth.rollout.loop import run_rollouts
from sleuth.sft.loop import epoch_order, step_indices
from sleuth.sft.synthesize import synthesize
from sleuth.data.transcripts import Transcript, encode, load_transcripts, read_transcripts, write_transcripts
from sleuth.train.logging import trajectory_record
from sleuth.train.sft import supervised_step
from sleuth.types import Passage, Question
from tests.helpers.tiny import ScriptedBackend, tiny_model, tiny_tokenizer

pytestmark = pytest.mark.component

PASSAGES = [
    Passage("p1", "Vonsen", "Vonsen was born at Tazenton. Vonsen was born in 1916."),
    Passage("p2", "Tazenton", "Tazenton is a city in Kirland, on the river Mo."),
    Passage("p3", "Lukon", "Lukon founded Sire Labs in 1950."),
    Passage("p4", "Sire Labs", "Sire Labs makes lamps."),
]
QUESTIONS = [
    Question("q/1", "Where was Vonsen born?", ("Tazenton",), "nq"),
    Question("q/2", "Which country holds the birthplace of Vonsen?", ("Kirland",), "hotpotqa"),
    Question("q/3", "Is Lukon older than Vonsen?", ("no",), "hotpotqa"),
    Question("q/4", "Who painted the Zorbo mural?", ("Quillan",), "nq"),
]


def _cfg(fmt="search_r1", max_turns=2, obs=64, nudge="", context=1200):
    cfg = Config()
    cfg.rollout = RolloutConfig(format=fmt, max_turns=max_turns, max_obs_tokens=obs, max_tokens_per_turn=200,
                                max_context_tokens=context, final_nudge=nudge, group_size=1)
    cfg.retrieval = replace(cfg.retrieval, topk=1)
    return cfg


def _synth(tok, cfg, questions=QUESTIONS):
    fmt = get_format(cfg.rollout.format)
    render = ChatRenderer(tok, fmt, cfg.rollout.use_chat_template)
    transcripts, counts = synthesize(questions, InMemoryRetriever(PASSAGES), fmt, render, cfg)
    return transcripts, counts, fmt, render


@pytest.mark.parametrize("chat,fmt_name,nudge", [(False, "search_r1", ""), (True, "search_r1", "Answer now."),
                                                 (True, "tool_call", ""), (False, "search_r1_fewshot3_reask", "")])
def test_a_transcript_tokenises_as_a_rollout_of_its_actions(chat, fmt_name, nudge):
    """The rollout loop, driven by a scripted policy that plays each synthesized transcript's turns
    against the same retriever, yields the same token ids and the same loss mask as ``encode`` (a re-asking
    format's observations holding the question, as the rollout's do)."""
    tok = tiny_tokenizer(chat_template=chat)
    cfg = _cfg(fmt_name, nudge=nudge, obs=200, context=4000 if "fewshot" in fmt_name else 1200)  # 3 examples
    transcripts, counts, fmt, render = _synth(tok, cfg)
    assert counts["kept: one search"] == 1 and counts["kept: two searches"] == 1
    for t in transcripts:
        observations = [text for text, trained in t.segments[1:] if not trained]
        reasked = [o.endswith(f"Question: {t.question.text}</information>\n\n") for o in observations]
        assert reasked == [fmt_name.endswith("reask")] * len(observations)
        turns = [text for text, trained in t.segments if trained]
        trajs, _ = run_rollouts([t.question], ScriptedBackend(tok, turns), tok, fmt, InMemoryRetriever(PASSAGES),
                                cfg.rollout, k=1, group_size=1)
        rb = trajectories_to_batch(trajs, tok.pad_token_id)
        ids, labels = encode(t, render)
        assert rb.input_ids_BT[0, :rb.lengths_B[0]].tolist() == ids
        assert rb.loss_mask_BT[0, :rb.lengths_B[0]].tolist() == [int(y != -100) for y in labels]
        assert [y for y in labels if y != -100] == [x for x, y in zip(ids, labels) if y != -100]
        assert trajs[0].answer == t.question.golden_answers[0]


def test_synthesize_keeps_grounded_transcripts_and_counts_the_rest():
    tok = tiny_tokenizer()
    transcripts, counts, _, _ = _synth(tok, _cfg())
    assert counts == {"kept: one search": 1, "kept: two searches": 1,
                      "dropped: yes/no, fewer than two passages to compare": 1, "dropped: answer not retrieved": 1}
    one, two = transcripts
    assert [s for s, trained in one.segments if trained][-1].endswith("<answer> Tazenton </answer>")
    searches = [s for s, trained in two.segments if trained][:2]
    # the second hop looks up the bridge entity read in the first observation, never the answer
    assert "<search> Tazenton </search>" in searches[1] and "Kirland" not in "".join(searches)
    assert "Kirland" in two.segments[3][0]  # the follow-up observation holds the answer
    # with one search allowed the two-hop transcript is not one a rollout could produce
    _, counts, _, _ = _synth(tok, _cfg(max_turns=1))
    assert counts["dropped: more searches than rollout.max_turns"] == 1
    cfg = _cfg()
    cfg.sft.follow_up = False
    _, counts, _, _ = _synth(tok, cfg)
    assert counts["dropped: answer not in the observation"] == 2 and "kept: two searches" not in counts


def test_a_yes_no_question_gets_a_comparison_then_its_answer_and_replays_as_a_rollout():
    """Yes/no questions (12 of the first 100 HotpotQA dev questions) are kept: one search, then a short
    comparison of the two passages read, then the gold answer; the transcript is one a rollout produces."""
    tok = tiny_tokenizer()
    cfg = _cfg(obs=200)
    cfg.retrieval = replace(cfg.retrieval, topk=2)
    transcripts, counts, fmt, render = _synth(tok, cfg, [QUESTIONS[2]])
    assert counts == {"kept: yes/no, one search": 1}
    (t,) = transcripts
    last = [s for s, trained in t.segments if trained][-1]
    assert "Comparing them, the answer is no." in last and last.endswith("<answer> no </answer>")
    assert "Doc 1 is about Vonsen and Doc 2 about Lukon." in last
    turns = [text for text, trained in t.segments if trained]
    trajs, _ = run_rollouts([t.question], ScriptedBackend(tok, turns), tok, fmt, InMemoryRetriever(PASSAGES),
                            cfg.rollout, k=2, group_size=1)
    rb = trajectories_to_batch(trajs, tok.pad_token_id)
    ids, labels = encode(t, render)
    assert rb.input_ids_BT[0, :rb.lengths_B[0]].tolist() == ids and trajs[0].answer == "no"


def test_synthesize_refuses_a_format_it_cannot_write():
    with pytest.raises(ValueError, match="r1_searcher"):
        _synth(tiny_tokenizer(), _cfg("r1_searcher"))


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_trajectories_source_filters_by_reward_and_reads_run_samples(tmp_path):
    tok = tiny_tokenizer()
    cfg = _cfg()
    transcripts, _, fmt, render = _synth(tok, cfg)
    trajs, _ = run_rollouts([transcripts[0].question], ScriptedBackend(tok, [transcripts[0].segments[0][0],
                                                                           transcripts[0].segments[2][0]]),
                            tok, fmt, InMemoryRetriever(PASSAGES), cfg.rollout, k=1, group_size=1)
    trajs[0].reward = 1.0
    good = {"step": 3, **trajectory_record(trajs[0])}  # a row of a run's samples.jsonl
    bad = {**good, "reward": 0.2}
    unscored = {k: v for k, v in good.items() if k != "reward"}
    path = _write(tmp_path / "samples.jsonl", [good, bad, unscored, good])
    kept, counts = read_transcripts([path], min_reward=1.0)
    assert counts == {"kept": 1, "dropped: reward < 1": 1, "dropped: no reward": 1, "dropped: duplicate": 1}
    assert encode(kept[0], render) == encode(transcripts[0], render)  # the rollout's tokens back
    kept, counts = read_transcripts([path])  # no threshold: the same transcript is still kept once
    assert len(kept) == 1 and counts == {"kept": 1, "dropped: duplicate": 3}
    # what sleuth sft writes reads back as written (a resumed run needs the same rows, duplicates too)
    write_transcripts(tmp_path / "t.jsonl", transcripts + transcripts[:1])
    back = load_transcripts(tmp_path / "t.jsonl")
    assert [encode(t, render) for t in back] == [encode(t, render) for t in transcripts + transcripts[:1]]
    # only a sample log's row (segments with n_tokens) counts as cut at the log's limit
    long = {"question": "q", "golden_answers": ["a"], "segments": [{"kind": "sampled", "text": "x" * 5000}]}
    logged = {**long, "segments": [{**long["segments"][0], "n_tokens": 900}]}
    kept, counts = read_transcripts([_write(tmp_path / "long.jsonl", [long, logged])])
    assert len(kept) == 1 and counts["dropped: a segment cut at 4000 characters in the log"] == 1


@pytest.mark.parametrize("row,message", [
    ({"question": "q", "golden_answers": ["a"]}, "lacks segments"),
    ({"question": "q", "golden_answers": ["a"], "segments": [{"kind": "injected", "text": "x"}]}, "no sampled"),
    ({"question": "q", "golden_answers": ["a"], "segments": [{"kind": "policy", "text": "x"}]}, "segment 0"),
    ({"question": "q", "golden_answers": ["a"], "segments": [{"kind": "sampled", "text": "x"}], "reward": "hi"},
     "reward"),
])
def test_a_malformed_transcript_is_an_error_naming_file_and_line(tmp_path, row, message):
    ok = {"question": "q", "golden_answers": ["a"], "segments": [{"kind": "sampled", "text": "x"}]}
    path = _write(tmp_path / "t.jsonl", [ok, row])
    with pytest.raises(UserError, match=rf"t\.jsonl:2: .*{message}"):
        read_transcripts([path])
    with pytest.raises(UserError, match="not a file"):
        read_transcripts([str(tmp_path / "missing.jsonl")])


def test_steps_walk_a_fresh_permutation_each_epoch():
    n, bs = 7, 3
    taken = [i for step in range(1, 15) for i in step_indices(n, step, bs, seed=5)]  # 42 = 6 epochs
    epochs = [taken[e * n:(e + 1) * n] for e in range(6)]
    assert all(sorted(e) == list(range(n)) for e in epochs)
    assert epochs[0] == epoch_order(n, 0, 5) and epochs[1] == epoch_order(n, 1, 5) and epochs[0] != epochs[1]
    assert step_indices(n, 4, bs, seed=5) == taken[9:12]


def test_supervised_step_is_the_mean_token_loss_whatever_the_micro_batches():
    """One step's loss is the plain causal-LM cross-entropy over the labelled tokens, and its update
    is the same in one batch or in micro-batches of one row."""
    tok = tiny_tokenizer()
    g = torch.Generator().manual_seed(0)
    rows = []
    for n in (9, 14, 6):
        ids = torch.randint(5, len(tok), (n,), generator=g).tolist()
        rows.append((ids, [-100] * 3 + ids[3:]))
    model = tiny_model(tok, seed=1)
    ids = torch.full((3, 14), tok.pad_token_id)
    labels = torch.full((3, 14), -100)
    for b, (x, y) in enumerate(rows):
        ids[b, :len(x)], labels[b, :len(y)] = torch.tensor(x), torch.tensor(y)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=(labels != -100) | (torch.arange(14) < 3)).logits
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
    a, b = tiny_model(tok, seed=1), tiny_model(tok, seed=1)
    out_a = supervised_step(a, torch.optim.SGD(a.parameters(), lr=0.1), rows, tok.pad_token_id, grad_clip=None)
    out_b = supervised_step(b, torch.optim.SGD(b.parameters(), lr=0.1), rows, tok.pad_token_id, micro_batch_size=1,
                            grad_clip=None)
    assert out_a["loss"] == pytest.approx(float(expected), rel=1e-5)
    assert out_b["loss"] == pytest.approx(out_a["loss"], rel=1e-5) and out_a["tokens"] == 6 + 11 + 3
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)
    assert any((p - q).abs().max() > 1e-4 for p, q in zip(a.parameters(), tiny_model(tok, seed=1).parameters()))
