"""The training loop with ``rollout.backend: vllm``, on CPU, against a stub ``vllm`` module
(``tests/helpers/vllm_stub.py``; the 2-rank torchrun run is in ``tests/e2e/test_train_vllm_torchrun.py``).

The stub (``sys.modules["vllm"]``) builds its model from the saved config with random weights (as
``load_format="dummy"`` does), records every ``load_weights`` push, and generates with our HF
backend on its own copy of the weights. Its logprobs are the true ones minus ``OFFSET``: a sampler
that disagrees with the trainer by a known amount, so the truncated importance weights must be
``exp(OFFSET)`` on every trained token, which holds only if the stub's weights equal the
trainer's (a stub still holding its random weights would give ratios far from that).
"""

import contextlib
import json
import math
import sys

import pytest
import torch

from sleuth.config import Config
from sleuth.rollout import vllm_backend
from sleuth.rollout.backends import SamplingParams
from sleuth.rollout.hf_backend import HFBackend
from sleuth.train.engine import trainer_weights
from tests.helpers.tiny import tiny_model, tiny_tokenizer
from tests.helpers.vllm_stub import OFFSET, StubLLM, stub_vllm_module

pytestmark = pytest.mark.component

STEPS = 2


def make_config(root, **overrides) -> Config:
    cfg = Config()
    cfg.model.name_or_path, cfg.model.device = str(root / "model"), "cpu"
    cfg.data.train_files, cfg.data.eval_files = [str(root / "train.jsonl")], []
    cfg.retrieval.kind, cfg.retrieval.corpus = "memory", str(root / "corpus.jsonl")
    r = cfg.rollout
    r.format, r.group_size, r.max_turns, r.max_tokens_per_turn = "search_r1_tiny", 2, 1, 8
    r.max_context_tokens, r.use_chat_template, r.backend = 512, False, "vllm"
    cfg.algo.kl_coef, cfg.algo.kl_mode, cfg.algo.tis_cap = 0.0, "none", 2.0
    cfg.algo.entropy_coef = 0.01  # a gradient even when every reward is equal (zero advantages)
    t = cfg.train
    t.total_steps, t.questions_per_step, t.lr, t.micro_batch_size, t.cpu_threads = STEPS, 2, 0.01, 2, 1
    for k, v in overrides.items():
        section, key = k.split("__")
        setattr(getattr(cfg, section), key, v)
    return cfg


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_world")
    tok = tiny_tokenizer()
    tiny_model(tok, seed=0, hidden=48).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    (root / "corpus.jsonl").write_text("".join(
        json.dumps({"id": str(i), "contents": f'"{a}"\n{a} is a capital city.'}) + "\n"
        for i, a in enumerate(["Paris", "Rome"])))
    (root / "train.jsonl").write_text("".join(
        json.dumps({"id": str(i), "question": "What is the capital of France", "golden_answers": ["Paris"]}) + "\n"
        for i in range(4)))
    return root


@contextlib.contextmanager
def _stubbed_vllm(recording_update, recording_tis):
    """The stub vLLM module in place (a CUDA device pretended), the update and TIS weights recorded."""
    import sleuth.train.learn as learn
    import sleuth.train.update as update

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "vllm", stub_vllm_module())
        mp.setattr(vllm_backend, "cuda_available", lambda: True)
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        mp.setattr(learn, "policy_update", recording_update)
        mp.setattr(update, "tis_weights", recording_tis)
        yield


@pytest.fixture(scope="module")
def run(world, tmp_path_factory):
    """One 2-step run; records the policy after each update, the pushes, and every TIS call."""
    import sleuth.train.learn as learn
    import sleuth.train.loop as loop
    import sleuth.train.update as update

    rec = {"after_update": [], "tis": [], "emitted_before_update": []}  # per step
    real_update, real_tis = learn.policy_update, update.tis_weights

    def recording_update(model, *args, **kwargs):
        rec["emitted_before_update"].append(len(StubLLM.last.emitted))
        rec["tis"].append([])
        out = real_update(model, *args, **kwargs)
        rec["after_update"].append({n: t.detach().clone() for n, t in model.state_dict().items()})
        return out

    def recording_tis(old_BT, sampler_BT, mask_BT, *, cap):
        w_BT = real_tis(old_BT, sampler_BT, mask_BT, cap=cap)
        rec["tis"][-1].append((sampler_BT.clone(), mask_BT.clone(), w_BT.clone()))
        return w_BT

    with _stubbed_vllm(recording_update, recording_tis):
        trainer = loop.Trainer(make_config(world), tmp_path_factory.mktemp("run"), progress=False)
        rec["initial"] = {n: t.detach().clone() for n, t in trainer.policy.state_dict().items()}
        rec["metrics"] = trainer.run()
    rec["llm"] = StubLLM.last
    return rec


def test_engine_built_from_config_with_dummy_weights(run):
    kw = run["llm"].kwargs
    assert kw["load_format"] == "dummy" and kw["dtype"] == "float32" and kw["max_model_len"] == 512
    assert kw["gpu_memory_utilization"] == 0.3 and kw["logprobs_mode"] == "processed_logprobs"


def test_engine_sleeps_through_every_update_and_wakes_weights_first(run):
    kw = run["llm"].kwargs
    assert kw["enable_sleep_mode"] is True and "distributed_executor_backend" not in kw  # one process
    kinds = [(k, d if k == "wake" else None) for k, d in run["llm"].events if k != "generate"]
    per_step = [("sleep", None), ("wake", ["weights"]), ("push", None), ("wake", ["kv_cache"])]
    assert kinds == [("build", None), ("push", None)] + per_step * STEPS
    gens = [i for i, (k, _) in enumerate(run["llm"].events) if k == "generate"]
    sleeps = [i for i, (k, _) in enumerate(run["llm"].events) if k == "sleep"]
    assert gens and max(gens) < sleeps[-1] and min(gens) > 1  # every rollout between a push and a sleep


def test_building_the_engine_keeps_the_run_rng(tmp_path, monkeypatch):
    from sleuth.config import RolloutConfig

    monkeypatch.setitem(sys.modules, "vllm", stub_vllm_module())
    monkeypatch.setattr(vllm_backend, "cuda_available", lambda: True)
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0, hidden=32)
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    engine = vllm_backend.VLLMBackend.from_trainer(model, tok, tmp_path / "e", RolloutConfig(), dtype="float32")
    assert torch.equal(torch.rand(3), expected)  # the stub reseeds at build, as vLLM does
    engine.sleep()
    with pytest.raises(RuntimeError, match="asleep: load_weights"):
        engine.generate([[1, 2]], SamplingParams(max_new_tokens=2, greedy=True))
    engine.load_weights(trainer_weights(model))
    assert len(engine.generate([[1, 2]], SamplingParams(max_new_tokens=2, greedy=True))[0].token_ids) == 2
    engine.close()
    assert StubLLM.last.shut_down
    with pytest.raises(RuntimeError, match="closed"):
        engine.generate([[1, 2]], SamplingParams(max_new_tokens=2, greedy=True))


def test_weights_pushed_at_start_and_after_every_update(run):
    pushes = run["llm"].engine_model.pushes
    assert len(pushes) == STEPS + 1 and run["llm"].resets == STEPS + 1
    for pushed, expected in zip(pushes, [run["initial"]] + run["after_update"]):
        assert pushed.keys() == expected.keys()
        for name, t in expected.items():
            assert torch.equal(pushed[name], t), name
    changed = [n for n in pushes[0] if not torch.equal(pushes[0][n], pushes[1][n])]
    assert changed, "the update changed no weight, so the test could not tell pushes apart"
    assert run["metrics"]["perf/weight_sync_s"] >= 0


def test_sampler_logprobs_reach_tis(run):
    emitted = run["llm"].emitted
    bounds = [0] + run["emitted_before_update"]  # step s rolled out emitted[bounds[s]:bounds[s + 1]]
    for step, calls in enumerate(run["tis"]):
        assert calls, "algo.tis_cap is set but tis_weights was never called"
        # the masked sampler logprobs handed to TIS are exactly those the engine returned this step
        seen = sorted(float(v) for s_BT, m_BT, _ in calls for v in s_BT[m_BT.bool()])
        step_emitted = emitted[bounds[step] : bounds[step + 1]]
        assert seen == pytest.approx(sorted(step_emitted), abs=1e-6)
        for _, m_BT, w_BT in calls:  # synced weights: trainer/sampler ratio exp(OFFSET) on trained tokens
            assert w_BT[m_BT.bool()] == pytest.approx(math.exp(OFFSET), abs=1e-3)
            assert torch.all(w_BT[~m_BT.bool()] == 0)


def test_missing_vllm_is_a_clear_user_error(world, tmp_path, monkeypatch, capsys):
    from sleuth.cli import main
    from sleuth.errors import UserError

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(UserError, match=r"rollout.backend=vllm needs vllm.*sleuth\[gpu\].*rollout.backend=hf"):
        from sleuth.train.loop import Trainer

        Trainer(make_config(world), tmp_path / "a", progress=False)
    sets = ["model.name_or_path=" + str(world / "model"), "model.device=cpu", "rollout.backend=vllm",
            "data.train_files=[" + str(world / "train.jsonl") + "]", "retrieval.kind=memory",
            "retrieval.corpus=" + str(world / "corpus.jsonl"), "rollout.format=search_r1_tiny",
            "train.questions_per_step=2"]  # the world file holds 4 questions
    assert main(["train", "--out", str(tmp_path / "b")] + [x for s in sets for x in ("--set", s)]) == 2
    assert "needs vllm" in capsys.readouterr().err


def test_no_cuda_and_unknown_backend_errors(world, tmp_path, monkeypatch):
    from sleuth.errors import UserError
    from sleuth.train.loop import Trainer

    monkeypatch.setitem(sys.modules, "vllm", stub_vllm_module())
    monkeypatch.setattr(vllm_backend, "cuda_available", lambda: False)
    with pytest.raises(UserError, match="needs a CUDA GPU"):
        Trainer(make_config(world), tmp_path / "a", progress=False)
    with pytest.raises(ValueError, match=r"rollout.backend: 'sglang' is not one of \['hf', 'hf_static', 'vllm'\]"):
        Trainer(make_config(world, rollout__backend="sglang"), tmp_path / "b", progress=False)
    monkeypatch.setattr(vllm_backend, "cuda_available", lambda: True)
    with pytest.raises(UserError, match=r"rollout.temperature=2.5: vLLM samples at temperatures up to 2.0"):
        Trainer(make_config(world, rollout__temperature=2.5), tmp_path / "c", progress=False)


def test_eval_backend_vllm_matches_hf(world, tmp_path, monkeypatch, capsys):
    """``sleuth eval --backend vllm``: the engine loads the checkpoint itself (no HF model built), and
    the stub engine, greedy on the same weights, gives the HF backend's trajectories."""
    from sleuth.cli import main

    monkeypatch.setitem(sys.modules, "vllm", stub_vllm_module())
    monkeypatch.setattr(vllm_backend, "cuda_available", lambda: True)
    base = ["eval", "--model", str(world / "model"), "--data", str(world / "train.jsonl"), "--corpus",
            str(world / "corpus.jsonl"), "--format", "search_r1_tiny", "--max-turns", "1", "--max-tokens-per-turn", "8",
            "--no-cache", "--no-compare", "--set", "rollout.use_chat_template=false",
            "--set", "rollout.vllm_gpu_memory_utilization=0.85"]
    assert main(base + ["--out", str(tmp_path / "hf")]) == 0
    assert main(base + ["--backend", "vllm", "--out", str(tmp_path / "vllm")]) == 0
    engine = StubLLM.last
    assert "load_format" not in engine.kwargs and engine.kwargs["gpu_memory_utilization"] == 0.85
    assert engine.kwargs["dtype"] == "float32" and engine.shut_down  # closed when the eval is done
    rows = {b: [json.loads(x) for x in (tmp_path / b / "trajectories.jsonl").read_text().splitlines()]
            for b in ("hf", "vllm")}
    assert len(rows["hf"]) == 4 and [r["id"] for r in rows["hf"]] == [r["id"] for r in rows["vllm"]]
    assert rows["hf"] == rows["vllm"] and any(r["response"] for r in rows["hf"])
    assert json.loads((tmp_path / "vllm" / "setting.json").read_text())["backend"] == "vllm"
    assert "backend" not in json.loads((tmp_path / "hf" / "setting.json").read_text())
    assert main(base + ["--backend", "vllm", "--model", "tiny", "--out", str(tmp_path / "t")]) == 2
    assert "'tiny' model runs on --backend hf" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif(not vllm_backend.vllm_available(), reason="needs vllm (pip install 'sleuth[gpu]')")
def test_real_vllm_engine_follows_the_trainer_weights(tmp_path):
    """Real vLLM: an engine built by ``from_trainer`` (dummy weights + push) decodes greedily like the
    HF backend on the same weights, with the same logprobs, and again after the weights change."""
    from sleuth.config import RolloutConfig

    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0, hidden=256).cuda()  # head_dim 64 for vLLM's attention kernels
    rollout = RolloutConfig(max_context_tokens=256, vllm_enforce_eager=True, vllm_gpu_memory_utilization=0.2)
    engine = vllm_backend.VLLMBackend.from_trainer(model, tok, tmp_path / "engine", rollout, dtype="float32")
    engine.load_weights(trainer_weights(model))
    prompts = [tok(t)["input_ids"] for t in ("Who sang the song?", "The river", "capital of France")]
    params = SamplingParams(max_new_tokens=16, greedy=True)
    for _ in range(2):
        ours = engine.generate(prompts, params)
        ref = HFBackend(model, tok).generate(prompts, params)
        assert [r.token_ids for r in ours] == [r.token_ids for r in ref]
        for a, b in zip(ours, ref):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)
        engine.sleep()  # level 2: the engine's weights and KV cache are freed; the push wakes it
        with torch.no_grad():  # an "update": the next round must follow it
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        engine.load_weights(trainer_weights(model))


def test_async_rollouts_push_each_weights_version_into_the_workers_engine(world, tmp_path):
    """rollout.async_steps=1 (inline worker, the same schedule as the spawned one): the worker's engine holds
    v0 for batches 1 and 2 and v1 (the weights after update 1) for batch 3; at step 1 the trainer still holds
    v0, so the truncated importance weights are exactly exp(OFFSET) there."""
    import sleuth.train.learn as learn
    import sleuth.train.loop as loop
    import sleuth.train.update as update

    after, tis = [], []
    real_update, real_tis = learn.policy_update, update.tis_weights

    def recording_update(model, *args, **kwargs):
        out = real_update(model, *args, **kwargs)
        after.append({n: t.detach().clone() for n, t in model.state_dict().items()})
        return out

    def recording_tis(old_BT, sampler_BT, mask_BT, *, cap):
        w_BT = real_tis(old_BT, sampler_BT, mask_BT, cap=cap)
        tis.append((len(after), w_BT[mask_BT.bool()].clone()))
        return w_BT

    with _stubbed_vllm(recording_update, recording_tis):
        cfg = make_config(world, train__total_steps=3, rollout__async_steps=1, rollout__async_worker="inline")
        trainer = loop.Trainer(cfg, tmp_path / "run", progress=False)
        initial = {n: t.detach().clone() for n, t in trainer.policy.state_dict().items()}
        trainer.run()
        trainer.close()
    pushes = StubLLM.last.engine_model.pushes
    assert len(pushes) == 2
    for pushed, expected in zip(pushes, [initial, after[0]]):
        assert all(torch.equal(pushed[n], t) for n, t in expected.items())
    step1 = torch.cat([w for done, w in tis if done == 0])
    assert step1.numel() and torch.allclose(step1, torch.full_like(step1, math.exp(OFFSET)), atol=1e-5)
