"""A tiny model trains for a few steps through `sleuth train`: every parameter changes, the loss is
finite, metrics and samples are logged, and a run stopped at step k and resumed matches an
uninterrupted run."""

import json
from pathlib import Path

import pytest
import torch

from sleuth.cli import main
from sleuth.rollout.formats import TinySearchR1Format
from sleuth.types import Question
from tests.helpers.tiny import teach, tiny_model, tiny_tokenizer

pytestmark = pytest.mark.e2e

ANSWERS = ["Paris", "Rome", "Berlin", "Madrid"]
# model.device is auto: on a GPU machine these runs train on CUDA, where kernels (SDPA's backward,
# cuBLAS split-K) are not bit-reproducible by default; two runs that should agree are compared to
# CUDA's rounding there, and bit for bit (or to float32 rounding) on CPU.
ON_CUDA = torch.cuda.is_available()


def _rel(cpu_rel: float) -> float:
    return max(cpu_rel, 1e-4) if ON_CUDA else cpu_rel


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A taught tiny model (emits a search, then one of several answers) + questions + corpus."""
    root = tmp_path_factory.mktemp("world")
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0, hidden=48)
    prompt = TinySearchR1Format().user_content(Question("x", "What is the capital of France", ["Paris"]))
    texts = [prompt + f"<answer> {a} </answer>" for a in ANSWERS]
    teach(model, tok, texts, steps=80)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    write_world_files(root, lambda i: "What is the capital of France", [ANSWERS[i % 2] for i in range(8)])
    return root


def write_world_files(root, question, answers):
    """``corpus.jsonl`` (one passage per capital) and ``train.jsonl`` (question ``question(i)``, gold ``answers[i]``)."""
    with open(root / "corpus.jsonl", "w") as f:
        for i, a in enumerate(ANSWERS):
            f.write(json.dumps({"id": str(i), "contents": f'"{a}"\n{a} is a capital city.'}) + "\n")
    with open(root / "train.jsonl", "w") as f:
        for i, a in enumerate(answers):
            f.write(json.dumps({"id": str(i), "question": question(i), "golden_answers": [a],
                                "data_source": "toy"}) + "\n")


def _args(world, out, steps, extra=()):
    sets = [
        f"model.name_or_path={world / 'model'}",
        f"data.train_files=[{world / 'train.jsonl'}]",
        f"data.eval_files=[{world / 'train.jsonl'}]",
        f"retrieval.corpus={world / 'corpus.jsonl'}",
        "retrieval.kind=memory",
        "rollout.group_size=4",
        "rollout.max_turns=1",
        "rollout.max_tokens_per_turn=24",
        "rollout.max_context_tokens=1024",
        "rollout.use_chat_template=false",
        "rollout.format=search_r1_tiny",
        "reward.kind=em",
        "algo.kl_coef=0.01",
        "algo.kl_mode=loss",
        "train.questions_per_step=2",
        "train.lr=0.01",
        "train.micro_batch_size=3",
        "train.eval_limit=2",
        f"train.total_steps={steps}",
        *extra,
    ]
    return ["train", "--out", str(out), "--json"] + [x for s in sets for x in ("--set", s)]


def _metrics(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # timing-dependent figures differ between any two runs; so do, on CUDA, device-memory peaks (offload
    # changes them by design) and the sampler-vs-trainer gap (a measure of rounding noise)
    return [{k: v for k, v in r.items() if not k.startswith(("perf/", "mem/", "rollout/sampler_gap",
                                                              "rollout/sampler_ratio"))
             and "time" not in k and "per_s" not in k} for r in rows]


def test_train_changes_every_parameter_and_logs(world, tmp_path):
    from transformers import AutoModelForCausalLM

    from sleuth.models import load_policy

    out = tmp_path / "run"
    assert main(_args(world, out, 2, ["train.save_every=1", "train.log_samples=5"])) == 0
    rows = _metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert all(v is None or isinstance(v, (int, float)) for v in r.values())
        assert r["algo/optimizer_steps"] == 1 and r["algo/skipped_steps"] == 0
        assert torch.isfinite(torch.tensor(r["algo/loss"]))
    assert "eval/em" in rows[-1]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [x["step"] for x in samples] == [1] * 5 + [2] * 5  # train.log_samples a step
    assert samples and {"sampled", "injected"} >= {s["kind"] for x in samples for s in x["segments"]}
    for x in samples:  # what `sleuth view` shows: scores, the prompt, segment roles, searches with passage texts
        assert x["data_source"] and x["em"] in (0.0, 1.0) and x["searches"] == len(x["queries"])
        assert x["prompt"]["n_tokens"] > 0 and x["prompt"]["text"]
        assert [s["role"] == "sampled" for s in x["segments"]] == [s["kind"] == "sampled" for s in x["segments"]]
        searched = [t for t in x["turns_detail"] if t.get("searches")]
        assert len(searched) == x["searches"]
        assert sum(s["role"] == "information" for s in x["segments"]) == x["searches"]
        assert all(p["text"] and p["id"] for t in searched for q in t["searches"] for p in q["passages"])
    before = AutoModelForCausalLM.from_pretrained(world / "model")
    after, _ = load_policy(str(out), device="cpu")  # a run dir resolves to its latest policy
    changed = [not torch.equal(p, q) for p, q in zip(before.parameters(), after.parameters())]
    assert all(changed), f"{changed.count(False)} parameter tensors did not change"


@pytest.mark.parametrize("extra", [[], ["algo.advantage=gae", "train.critic_lr_warmup_steps=3", "train.critic_lr=0.01",
                                    "train.offload_optimizer=true"],
                                   ["train.dynamic_sampling=true", "train.max_sampling_rounds=3"]],
                         ids=["grpo", "ppo", "dynamic_sampling"])
def test_resume_matches_uninterrupted_run(world, tmp_path, extra):
    """(ppo: the critic's optimizer and learning-rate warm-up resume too; dynamic sampling: the question
    cursor covers every round's draws.)"""
    full, part = tmp_path / "full", tmp_path / "part"
    extra = ["train.eval_every=0", *extra]
    assert main(_args(world, full, 4, extra)) == 0
    assert main(_args(world, part, 2, extra)) == 0  # stopped at step 2 (checkpoint)
    assert main(_args(world, part, 4, extra) + ["--resume"]) == 0
    a, b = _metrics(full), _metrics(part)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b):
        # the stopped run also evaluated at its last step (2); evaluation does not touch training state
        ra = {k: v for k, v in ra.items() if not k.startswith("eval/")}
        rb = {k: v for k, v in rb.items() if not k.startswith("eval/")}
        assert ra.keys() == rb.keys()
        for k in ra:
            assert ra[k] == pytest.approx(rb[k], rel=_rel(1e-6), abs=1e-7), (ra["step"], k)


def test_a_packed_run_logs_what_the_padded_run_logs(world, tmp_path):
    """train.remove_padding: the reference, critic and update passes run packed rows; the first
    step's figures (measured before its one optimizer step) equal the padded run's, float rounding
    apart, and no padding is computed. (Rounding-level gradients, which AdamW scales up to a full
    step, make later figures differ.)"""
    runs = {}
    for packed in (False, True):
        out = tmp_path / f"packed_{packed}"
        extra = ["algo.advantage=gae", "train.eval_every=0", "train.eval_limit=1", "train.lr=0.1",
                 "train.max_tokens_per_micro_batch=200", f"train.remove_padding={str(packed).lower()}"]
        assert main(_args(world, out, 1, extra)) == 0
        runs[packed] = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    padded, packed = runs[False], runs[True]
    assert padded["perf/padding_share"] > 0 and packed["perf/padding_share"] == 0.0
    for k in ("algo/loss", "algo/value_loss", "algo/kl", "algo/entropy", "algo/ratio_max", "reward/mean"):
        assert packed[k] == pytest.approx(padded[k], rel=_rel(1e-5), abs=1e-6), k


def test_a_shared_prefix_run_logs_what_the_whole_rows_run_logs(world, tmp_path, capsys):
    """train.share_prefix: the reference and update passes run each micro-batch's common leading tokens
    once; the first step's figures equal the plain run's, float rounding apart, and fewer token slots
    are computed than the rows hold. Settings it cannot run with are refused by name."""
    runs = {}
    for shared in (False, True):
        out = tmp_path / f"shared_{shared}"
        extra = ["train.eval_every=0", "train.eval_limit=1", "train.lr=0.1", "train.micro_batch_size=4",
                 f"train.share_prefix={str(shared).lower()}"]
        assert main(_args(world, out, 1, extra)) == 0
        runs[shared] = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    whole, shared = runs[False], runs[True]
    assert "perf/padding_share" in whole and 0 < shared["perf/computed_token_share"] < 1
    for k in ("algo/loss", "algo/kl", "algo/entropy", "algo/ratio_max", "algo/grad_norm", "reward/mean"):
        assert shared[k] == pytest.approx(whole[k], rel=_rel(1e-5), abs=1e-6), k
    capsys.readouterr()
    assert main(_args(world, tmp_path / "clash", 1, ["train.share_prefix=true", "train.remove_padding=true"])) != 0
    err = capsys.readouterr().err
    assert "train.share_prefix cannot run with train.remove_padding" in err and "Loading weights" not in err


def test_offload_options_change_no_figure(world, tmp_path):
    """train.offload_optimizer / offload_reference (no-ops for memory on a CPU): the hooks and the
    checkpoint path run, and every figure equals the plain run's, bit for bit (to rounding on CUDA)."""
    runs = []
    for offload in ("false", "true"):
        out = tmp_path / f"offload_{offload}"
        extra = ["train.eval_every=0", "train.save_every=1", "train.mini_batches=2",
                 f"train.offload_optimizer={offload}", f"train.offload_reference={offload}"]
        assert main(_args(world, out, 2, extra)) == 0
        runs.append(_metrics(out))
    assert len(runs[0]) == len(runs[1]) == 2
    if not ON_CUDA:
        assert runs[0] == runs[1]
    for a, b in zip(*runs):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=_rel(0.0), abs=1e-7) for k in a), a


@pytest.mark.parametrize("advantage", ["gae", "reinforce_pp", "rloo"])
def test_other_estimators_train(world, tmp_path, advantage):
    """PPO with a critic (GAE), REINFORCE++ (KL in the reward) and RLOO each run an update."""
    out = tmp_path / advantage
    extra = [f"algo.advantage={advantage}", "train.eval_limit=1", "train.tensorboard=true"]
    if advantage != "rloo":
        extra += ["algo.kl_mode=reward", "algo.kl_estimator=k1"]
    if advantage == "gae":
        extra += ["train.critic_warmup_steps=1", "train.critic_lr_warmup_steps=2", "train.warmup_from_zero=true",
                  "train.critic_lr=0.001"]
    assert main(_args(world, out, 2, extra)) == 0
    rows = _metrics(out)
    assert [r["algo/optimizer_steps"] for r in rows] == [1, 1] and torch.isfinite(torch.tensor(rows[-1]["algo/loss"]))
    if advantage == "gae":  # step 1 trains the critic alone, step 2 both
        assert [r["algo/critic_warmup"] for r in rows] == [1.0, 0.0]
        assert [r["algo/critic_lr"] for r in rows] == pytest.approx([0.0, 0.0005])  # (k - 1) / 2 of 0.001
        assert all("algo/value_loss" in r for r in rows)
        assert (out / "checkpoints" / "step_000002" / "critic.pt").exists()
    assert any((out / "tensorboard").iterdir())


def test_lora_trains_adapters_and_resumes(world, tmp_path):
    """LoRA: only adapters change; the reference is the adapter-disabled base; the checkpoint's
    policy/ holds merged weights loadable by transformers, and a resumed run matches."""
    from transformers import AutoModelForCausalLM

    lora = ["model.lora_rank=4", "train.eval_every=0", "algo.kl_coef=0.05"]
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(_args(world, full, 3, lora)) == 0
    assert main(_args(world, part, 2, lora)) == 0
    assert main(_args(world, part, 3, lora) + ["--resume"]) == 0
    a, b = _metrics(full), _metrics(part)
    for key in ("reward/mean", "algo/loss", "algo/kl"):
        assert a[2][key] == pytest.approx(b[2][key], rel=_rel(1e-6), abs=1e-7), key
    ckpt = full / "checkpoints" / "step_000003"
    assert (ckpt / "adapter" / "adapter_model.safetensors").exists()
    merged = AutoModelForCausalLM.from_pretrained(ckpt / "policy")
    base = AutoModelForCausalLM.from_pretrained(world / "model")
    changed = {n for (n, p), q in zip(merged.named_parameters(), base.parameters()) if not torch.equal(p, q)}
    assert changed and all(any(t in n for t in ("q_proj", "k_proj", "v_proj", "o_proj")) for n in changed)


def _moved_share(before, after) -> float:
    moved = total = 0
    for p, q in zip(before.parameters(), after.parameters()):
        moved += int((p.detach().float().cpu() != q.detach().float().cpu()).sum())  # the run's may be on CUDA
        total += p.numel()
    return moved / total


def test_bf16_training_keeps_float32_master_weights(world, tmp_path):
    """``model.dtype: bfloat16`` at Search-R1's lr 1e-6: the parameters and AdamW state stay
    float32 and the forwards (rollout included) run in bf16 under autocast; one step moves about
    as many weights as the float32 step (bf16 parameters moved 0.4% of them: bf16 keeps 8 bits of
    mantissa, so a 1e-6 step on a weight of 0.02 rounds away). The checkpoint holds the float32
    master weights."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    def trainer(dtype, out):
        return _trainer(world, out, [f"model.dtype={dtype}", "train.lr=1e-6", "algo.kl_coef=0"])

    base = AutoModelForCausalLM.from_pretrained(world / "model")
    f32 = trainer("float32", tmp_path / "f32")
    f32.train_step()
    bf16 = trainer("bfloat16", tmp_path / "bf16")
    seen = set()
    hook = bf16.policy.lm_head.register_forward_hook(  # logits; the chunked head (an [N, 2] float32 score) is tested apart
        lambda m, i, o: seen.add(o.dtype) if o.shape[-1] != 2 else None)
    metrics, _ = bf16.train_step()
    hook.remove()
    assert seen == {torch.bfloat16}  # rollout, logprobs and the update computed in bf16
    assert {p.dtype for p in bf16.policy.parameters()} == {torch.float32}
    state = bf16.optimizer.state[next(iter(bf16.policy.parameters()))]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    assert metrics["algo/optimizer_steps"] == 1
    share_f32, share_bf16 = _moved_share(base, f32.policy), _moved_share(base, bf16.policy)
    assert share_f32 > 0.5
    assert share_bf16 > 0.8 * share_f32, (share_bf16, share_f32)
    ckpt = bf16.save()
    with safe_open(str(ckpt / "policy" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}


def test_the_reference_computes_what_the_policy_computes_at_step_0(world, tmp_path):
    """bf16 compute over float32 master weights: the reference held in float32 (the default) gives a KL
    of exactly 0 at the first step; held in bf16 it rounds otherwise (the GPU check measured k3 0.0028 on
    SmolLM2), which ``model.reference_dtype=bfloat16`` accepts for half the memory."""
    sets = ["model.dtype=bfloat16", "train.total_steps=1", "algo.kl_coef=0.01", "algo.kl_mode=loss"]
    same = _trainer(world, tmp_path / "f32ref", sets)
    assert {p.dtype for p in same.state.ref.parameters()} == {torch.float32}
    assert same.train_step()[0]["algo/kl"] == 0.0
    half = _trainer(world, tmp_path / "bf16ref", [*sets, "model.reference_dtype=bfloat16"])
    assert {p.dtype for p in half.state.ref.parameters()} == {torch.bfloat16}
    assert half.train_step()[0]["algo/kl"] > 0.0


def test_out_of_memory_in_a_step_keeps_its_error_and_says_which_step(world, tmp_path, monkeypatch):
    trainer = _trainer(world, tmp_path / "oom")

    def boom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 22.00 MiB.")

    monkeypatch.setattr(trainer, "collect", boom)
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate") as info:
        trainer.train_step()
    assert any("step 1 ran out of device memory" in n for n in info.value.__notes__)


def test_dynamic_sampling_keeps_groups_whose_rewards_differ_and_counts_the_rest(world, tmp_path, monkeypatch):
    """Rounds of draws until the step holds questions_per_step groups with reward variance; the others are
    dropped before any logprob pass (or fill the step when the rounds run out), and every draw moves the
    question cursor. Every draw is scored with the run's reward settings (reward.read_corrective reached
    only the path without dynamic sampling once)."""
    import sleuth.reward.trajectory as scoring

    read = []
    text = scoring.reward_text
    monkeypatch.setattr(scoring, "reward_text", lambda t, *, read_corrective=True: (
        read.append(read_corrective), text(t, read_corrective=read_corrective))[1])
    trainer = _trainer(world, tmp_path / "run", ["train.dynamic_sampling=true", "train.max_sampling_rounds=4",
                                                  "reward.read_corrective=false"])
    start = trainer.sampler.state()["pos"]
    batch = trainer.collect()
    m = batch.metrics
    assert read and set(read) == {False} and len(read) == m["sampling/drawn_groups"] * trainer.cfg.rollout.group_size
    q = trainer.cfg.train.questions_per_step
    assert trainer.sampler.state()["pos"] - start == m["sampling/rounds"] * q  # every round's draw counted
    assert m["sampling/drawn_groups"] == m["sampling/rounds"] * q
    assert m["sampling/kept_groups"] == q and m["sampling/dropped_groups"] == m["sampling/drawn_groups"] - q
    groups: dict = {}
    for t, r in zip(batch.trajectories, batch.scores_B.tolist()):
        groups.setdefault(t.group_id, []).append(r)
    assert len(groups) == q and len({b.id for b in batch.questions}) == q
    with_variance = sum(len(set(rs)) > 1 for rs in groups.values())
    assert with_variance == q - m["sampling/filled_groups"]
    assert m["sampling/filled_groups"] == 0 or m["sampling/rounds"] == 4  # filled only when the rounds ran out
    assert 0 <= m["groups/reward_variance_share"] <= 1 and m["groups/count"] == m["sampling/drawn_groups"]


@pytest.mark.parametrize("mode", ["mask", "penalty"])
def test_overlong_trajectories_are_masked_or_penalised(world, tmp_path, mode):
    """A per-turn cap of 3 tokens cuts most trajectories: mask leaves them out of the loss, penalty lowers
    their reward by train.overlong_penalty; the others are untouched."""
    sets = ["rollout.max_tokens_per_turn=3", f"train.overlong={mode}", "train.overlong_penalty=0.25"]
    keep = _trainer(world, tmp_path / "keep", ["rollout.max_tokens_per_turn=3"]).collect()
    batch = _trainer(world, tmp_path / mode, sets).collect()
    cut = torch.tensor([t.stop_reason.value in ("max_tokens", "context_full") for t in batch.trajectories])
    assert cut.any() and batch.metrics["rollout/overlong_trajectories"] == float(cut.sum())
    kept_cut = sum(t.stop_reason.value in ("max_tokens", "context_full") for t in keep.trajectories)
    assert kept_cut > 0 and keep.metrics["rollout/overlong_trajectories"] == float(kept_cut)
    if mode == "mask":
        assert batch.loss_mask_BT[cut].sum() == 0
        assert torch.equal(batch.loss_mask_BT[~cut], keep.loss_mask_BT[~cut])
    else:
        assert torch.equal(batch.loss_mask_BT, keep.loss_mask_BT)
        assert torch.allclose(batch.scores_B, keep.scores_B - 0.25 * cut.float())


def test_guidance_adds_the_transcripts_of_the_groups_that_all_failed(world, tmp_path):
    """algo.guide_coef: every question has a gold transcript; the step trains on those of the groups
    whose every sample is wrong, and on no other; no transcripts at all is a one-line error."""
    from sleuth.config_file import ConfigError
    from sleuth.data.transcripts import Transcript, write_transcripts
    from sleuth.reward.trajectory import answer_scores

    from sleuth.data.qa import load_questions

    gold = [Transcript(q, [(f"<answer> {q.golden_answers[0]} </answer>", True)])  # ids as the run loads them
            for q in load_questions(str(world / "train.jsonl"))]
    write_transcripts(tmp_path / "gold.jsonl", gold)
    trainer = _trainer(world, tmp_path / "run", ["algo.guide_coef=0.5", f"algo.guide_files=[{tmp_path / 'gold.jsonl'}]",
                                                 "algo.kl_coef=0"])
    metrics, trajs = trainer.train_step()
    groups: dict = {}
    for t in trajs:
        groups.setdefault(t.question.id, []).append(answer_scores(t).em)
    failed = sum(all(e == 0.0 for e in ems) for ems in groups.values())
    assert metrics.get("guide/rows", 0.0) == failed
    if failed:
        assert metrics["guide/loss"] > 0
    with pytest.raises(ConfigError, match="algo.guide_coef > 0 needs algo.guide_files"):
        _trainer(world, tmp_path / "none", ["algo.guide_coef=0.5"])
    # with dynamic sampling: the transcripts of every drawn group that all failed (the groups it drops)
    trainer = _trainer(world, tmp_path / "ds", ["algo.guide_coef=0.5", f"algo.guide_files=[{tmp_path / 'gold.jsonl'}]",
                                                "algo.kl_coef=0", "train.dynamic_sampling=true",
                                                "train.max_sampling_rounds=3"])
    metrics, trajs = trainer.train_step()
    drawn_failed = round(metrics["groups/count"] * (1 - metrics["groups/pass_at_g"]))
    assert metrics.get("guide/rows", 0.0) == drawn_failed
    kept_failed = sum(all(answer_scores(t).em == 0.0 for t in trajs if t.question.id == q)
                      for q in {t.question.id for t in trajs})
    assert drawn_failed > kept_failed, (drawn_failed, kept_failed)  # some dropped groups guided


def _trainer(world, out, extra=()):
    from sleuth.config_file import load_config
    from sleuth.train.loop import Trainer

    return Trainer(load_config(None, _args(world, out, 2, list(extra))[5::2]), out, progress=False)


def test_trajectories_whose_search_failed_are_left_out_of_the_loss(world, tmp_path, monkeypatch, capsys):
    """Rows that read 'the search failed' instead of passages train nothing: their loss mask is
    cleared, they join no group's baseline, and the step counts them."""
    import sleuth.train.learn as learn

    trainer = _trainer(world, tmp_path / "run", ["algo.advantage=grpo", "algo.kl_coef=0"])
    real_rollout, seen = trainer.engine.rollout, {}

    def rollout(questions, *args, **kw):  # the first question's rows: as if their search had failed
        trajs, metrics = real_rollout(questions, *args, **kw)
        for t in trajs:
            t.num_retrieval_errors = int(t.question.id == questions[0].id)
            t.num_searches = 1 - t.num_retrieval_errors  # the other question's searches went through
        return trajs, metrics

    def update(model, opt, batch, algo, **kw):
        seen["batch"] = batch
        return real_update(model, opt, batch, algo, **kw)

    real_update = learn.policy_update
    monkeypatch.setattr(trainer.engine, "rollout", rollout)
    monkeypatch.setattr(learn, "policy_update", update)
    metrics, trajs = trainer.train_step()
    failed = torch.tensor([t.num_retrieval_errors > 0 for t in trajs])
    assert metrics["rollout/failed_search_trajectories"] == int(failed.sum()) == 4
    batch = seen["batch"]
    assert batch.loss_mask_BT[failed].sum() == 0 and batch.advantages_BT[failed].abs().sum() == 0
    assert batch.loss_mask_BT[~failed].sum() > 0
    # the other question's advantages are its own group's GRPO figures
    from sleuth.algo.advantages import grpo_advantages

    kept = [t for t in trajs if not t.num_retrieval_errors]
    expected = grpo_advantages(torch.tensor([t.reward for t in kept]), [t.group_id for t in kept])
    last = batch.loss_mask_BT[~failed].float().cumsum(-1).argmax(-1)
    got = batch.advantages_BT[~failed].gather(1, last[:, None]).squeeze(1)
    torch.testing.assert_close(got, expected)
    trainer.logger.log(1, metrics)  # the terminal says so (stderr without the progress bar)
    assert "step 1: 4 of 8 trajectories had a failed search" in capsys.readouterr().err


def test_a_retriever_that_stays_down_stops_the_run_before_any_update(world, tmp_path, monkeypatch):
    from sleuth.config_file import load_config
    from sleuth.retrieval.base import RetrievalError, RetrieverDownError
    from sleuth.train.loop import Trainer

    out = tmp_path / "run"  # the shipped tiny model on its world: it searches about a third of the time
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml", ["data.eval_files=[]", "train.total_steps=2", "train.save_every=1"])
    trainer = Trainer(cfg, out, progress=False)
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}

    class Down:
        def search(self, queries, k):
            raise RetrievalError("http://127.0.0.1:9/retrieve failed after 4 attempt(s) over 120 s: cannot connect")

    trainer.retriever = Down()
    with pytest.raises(RetrieverDownError) as e:
        trainer.run()
    msg = str(e.value)
    assert "every search of step 1 failed" in msg and "cannot connect" in msg and "--resume" in msg
    assert all(torch.equal(v, trainer.policy.state_dict()[k]) for k, v in before.items())  # nothing trained
    assert trainer.optimizer.state == {}


def test_train_command_prints_a_retriever_down_error_and_exits_1(world, tmp_path, monkeypatch, capsys):
    from sleuth.retrieval.base import RetrieverDownError
    from sleuth.train.loop import Trainer

    def down(self):
        raise RetrieverDownError("every search of step 3 failed (8 searches; ...). Start or fix the retriever")

    monkeypatch.setattr(Trainer, "run", down)
    assert main(_args(world, tmp_path / "run", 2)) == 1
    assert "sleuth: error: every search of step 3 failed" in capsys.readouterr().err


def test_one_on_policy_pass_reuses_the_samplers_logprobs(world, tmp_path, monkeypatch):
    """One epoch, one mini-batch, no TIS, our HF decode: the rollout's logprobs are the old policy's
    (log_softmax(logits / T) of the same tokens from the same weights), so the trainer's no-grad
    forward that recomputed them is skipped. They agree with that forward to float rounding."""
    import sleuth.train.layout as layout
    import sleuth.train.learn as learn

    trainer = _trainer(world, tmp_path / "run", ["algo.kl_coef=0", "rollout.temperature=0.8"])
    assert trainer.sampler_logprobs_are_old()
    calls, seen = [], {}
    real_logprobs, real_update = layout.batched_logprobs, learn.policy_update
    monkeypatch.setattr(layout, "batched_logprobs", lambda *a, **kw: calls.append(1) or real_logprobs(*a, **kw))

    def update(model, opt, batch, algo, **kw):
        seen["batch"] = batch
        return real_update(model, opt, batch, algo, **kw)

    monkeypatch.setattr(learn, "policy_update", update)
    trainer.train_step()
    assert calls == []  # no recomputation of the old logprobs
    b = seen["batch"]
    mask = b.loss_mask_BT.bool()
    assert mask.sum() > 0 and torch.equal(b.old_logprobs_BT, b.sampler_logprobs_BT)
    # the same quantity: a fresh trainer's forward over its own rollout (the policy above has moved)
    fresh = _trainer(world, tmp_path / "fresh", ["algo.kl_coef=0", "rollout.temperature=0.8"])
    trajs, _ = fresh.rollout(fresh.sampler.next(2), step=1)
    from sleuth.rollout.batching import trajectories_to_batch

    rb = trajectories_to_batch(trajs, fresh.tokenizer.pad_token_id)
    again = real_logprobs(fresh.policy, rb.input_ids_BT, rb.attention_mask_BT, micro_batch_size=8, temperature=0.8)
    m = rb.loss_mask_BT.bool()
    assert (again[m] - rb.old_logprobs_BT[m]).abs().max() < 1e-4
    # two epochs (PPO-style reuse of the batch): the old policy is recomputed
    two = _trainer(world, tmp_path / "two", ["algo.kl_coef=0", "train.epochs=2"])
    assert not two.sampler_logprobs_are_old()


def test_the_sampler_gap_is_checked_and_a_large_one_switches_to_recomputing(world, tmp_path, capsys, monkeypatch):
    """On check steps the trainer's forward computes the old logprobs too and the gap is logged (float
    rounding on CPU); a gap above train.sampler_max_gap makes every later step take them from the trainer: the
    update's own forward where one epoch of one mini-batch allows (no separate pass), a separate forward with KL
    in the reward. CPU float32 runs check nothing by default (the test above: no forward)."""
    from sleuth.train.sampler_gap import SamplerGap

    trainer = _trainer(world, tmp_path / "check", ["algo.kl_coef=0", "train.sampler_check_every=1"])
    assert trainer.sampler_logprobs_are_old()
    metrics, _ = trainer.train_step()
    assert metrics["rollout/sampler_gap_mean"] < 1e-4 and metrics["rollout/sampler_ratio_dev_max"] < 1e-3
    assert metrics["rollout/sampler_gap_max"] >= metrics["rollout/sampler_gap_mean"]
    assert metrics["train/old_logprobs_recomputed"] == 0.0 and not trainer.sampler_gap.recompute
    strict = _trainer(world, tmp_path / "strict", ["algo.kl_coef=0", "train.sampler_check_every=5",
                                                   "train.sampler_max_gap=0"])
    strict.step = 1
    strict.train_step()  # step 1 is a check step; any gap > 0 trips it
    assert strict.sampler_gap.recompute and "logprobs are the trainer's from now on" in capsys.readouterr().err
    import sleuth.train.layout as layout

    calls, real_logprobs = [], layout.batched_logprobs
    monkeypatch.setattr(layout, "batched_logprobs", lambda *a, **kw: calls.append(1) or real_logprobs(*a, **kw))
    strict.step = 2
    metrics, _ = strict.train_step()  # not a check step: the trainer's logprobs all the same
    # one epoch of one mini-batch, no KL in the reward: from the update's own forward (no separate pass)
    assert metrics["train/old_logprobs_recomputed"] == 1.0 and calls == []
    kl = _trainer(world, tmp_path / "kl", ["algo.kl_coef=0.01", "algo.kl_mode=reward", "train.sampler_check_every=5",
                                           "train.sampler_max_gap=0"])
    kl.step = 1
    kl.train_step()
    kl.step = 2
    metrics, _ = kl.train_step()  # KL in the reward needs the old logprobs before the update: a separate pass
    assert kl.sampler_gap.recompute and metrics["train/old_logprobs_recomputed"] == 1.0
    assert "rollout/sampler_gap_mean" in metrics and calls
    strict.save()  # the switch is kept in the checkpoint: a resumed run recomputes too
    from sleuth.config_file import load_config
    from sleuth.train.loop import Trainer

    sets = _args(world, tmp_path / "strict", 2, ["algo.kl_coef=0", "train.sampler_check_every=5"])[5::2]
    resumed = Trainer(load_config(None, sets), tmp_path / "strict", resume=True, progress=False)
    resumed._resume()
    assert resumed.step == 2 and resumed.sampler_gap.recompute
    default = SamplerGap(None, 0.01, device=torch.device("cpu"), dtype="float32")
    assert default.every == 0 and not any(default.needs_forward(s) for s in range(1, 30))
    gpu = SamplerGap(None, 0.01, device=torch.device("cpu"), dtype="bfloat16")
    assert [s for s in range(1, 25) if gpu.needs_forward(s)] == [1, 11, 21]


def test_a_time_limit_stops_after_a_step_evaluates_saves_and_resume_goes_on(world, tmp_path, capsys):
    """train.time_limit_minutes (a GPU lent by the minute): the step that ends past the limit is the last
    one (evaluated and checkpointed as a final step), and --resume without the limit continues to
    total_steps."""
    out = tmp_path / "run"
    extra = ["train.eval_every=0", "train.save_every=0"]
    assert main(_args(world, out, 3, extra + ["train.time_limit_minutes=1e-9"])) == 0
    rows = _metrics(out)
    assert [r["step"] for r in rows] == [1] and "eval/em" in rows[0]
    assert (out / "checkpoints" / "step_000001").is_dir()
    assert "train.time_limit_minutes (1e-09) reached after step 1 of 3" in capsys.readouterr().err
    assert main(_args(world, out, 3, extra) + ["--resume"]) == 0
    assert [r["step"] for r in _metrics(out)] == [1, 2, 3]
