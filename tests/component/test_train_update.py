"""The update step against a straightforward reference, advantages glue, and checkpoints."""

import copy

import pytest
import torch

from sleuth.config import AlgoConfig
from sleuth.train.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint
from sleuth.train.forward import batched_logprobs, length_buckets, padding_share, token_logprobs
from sleuth.train.update import UpdateBatch, compute_advantages, policy_update
from sleuth.train.layout import RowLayout
from tests.helpers.tiny import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.component


def _batch(tok, seed=0):
    """4 right-padded rows of different lengths; the last 3-5 tokens of each are 'sampled'."""
    g = torch.Generator().manual_seed(seed)
    lengths = [9, 6, 12, 7]
    B, T = len(lengths), max(lengths)
    ids = torch.full((B, T), tok.pad_token_id)
    att = torch.zeros(B, T, dtype=torch.long)
    loss_mask = torch.zeros(B, T, dtype=torch.long)
    for b, L in enumerate(lengths):
        ids[b, :L] = torch.randint(5, len(tok), (L,), generator=g)
        att[b, :L] = 1
        loss_mask[b, L - 3 - b % 3 : L] = 1
    return ids, att, loss_mask


def _reference_loss(model, ids, att, loss_mask, adv_BT, old_BT, ref_BT, algo):
    """Token-mean clipped loss + k3 KL, written plainly over the full batch (no buckets)."""
    logits = model(input_ids=ids, attention_mask=att).logits.float()
    logp_all = torch.log_softmax(logits[:, :-1], dim=-1)
    lp = torch.zeros(ids.shape)
    lp[:, 1:] = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    total, count = 0.0, 0
    for b in range(ids.shape[0]):
        for t in range(ids.shape[1]):
            if not loss_mask[b, t]:
                continue
            ratio = torch.exp(lp[b, t] - old_BT[b, t])
            a = adv_BT[b, t]
            surrogate = torch.maximum(-a * ratio, -a * ratio.clamp(1 - algo.clip_low, 1 + algo.clip_high))
            d = ref_BT[b, t] - lp[b, t]
            k3 = torch.exp(d) - d - 1
            total = total + surrogate + algo.kl_coef * k3
            count += 1
    return total / count


def test_update_matches_reference_and_is_micro_batch_invariant():
    tok = tiny_tokenizer()
    ids, att, loss_mask = _batch(tok)
    base = tiny_model(tok, seed=1).train()
    ref_model = tiny_model(tok, seed=2)
    algo = AlgoConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.05, kl_mode="loss")
    old = batched_logprobs(base, ids, att, micro_batch_size=4)
    ref = batched_logprobs(ref_model, ids, att, micro_batch_size=4)
    # perturb old logprobs so some ratios sit outside the clip range
    old = old + 0.3 * torch.tensor([[(-1) ** (b + t) for t in range(ids.shape[1])] for b in range(4)]) * loss_mask
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv, _ = compute_advantages(algo, scores, ["q1", "q1", "q2", "q2"], loss_mask)
    batch = UpdateBatch(ids, att, loss_mask, adv, old, ref_logprobs_BT=ref)

    # reference gradient step with plain SGD
    ref_policy = copy.deepcopy(base)
    loss_ref = _reference_loss(ref_policy, ids, att, loss_mask, adv, old, ref, algo)
    loss_ref.backward()
    with torch.no_grad():
        for p in ref_policy.parameters():
            p -= 0.1 * p.grad

    results = []
    for mbs, max_tokens in ((1, None), (3, None), (4, None), (4, 20), (4, 1)):  # token budgets: 3 and 4 buckets
        pol = copy.deepcopy(base)
        opt = torch.optim.SGD(pol.parameters(), lr=0.1)
        metrics = policy_update(pol, opt, batch, algo, RowLayout("padded", mbs, max_tokens), grad_clip=None)
        results.append((pol, metrics))
        assert metrics["algo/optimizer_steps"] == 1 and metrics["algo/skipped_steps"] == 0
    # the loss reported is the reference loss, whatever the micro-batch size
    for _, metrics in results:
        assert abs(metrics["algo/loss"] - float(loss_ref.detach())) < 1e-6
    for pol, _ in results:
        for p, q in zip(pol.parameters(), ref_policy.parameters()):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)


def test_non_finite_loss_skips_the_step():
    tok = tiny_tokenizer()
    ids, att, loss_mask = _batch(tok)
    pol = tiny_model(tok, seed=1).train()
    before = [p.detach().clone() for p in pol.parameters()]
    old = batched_logprobs(pol, ids, att, micro_batch_size=4)
    adv = torch.where(loss_mask.bool(), torch.tensor(float("nan")), torch.tensor(0.0))
    algo = AlgoConfig(kl_coef=0.0)
    opt = torch.optim.SGD(pol.parameters(), lr=0.1)
    m = policy_update(pol, opt, UpdateBatch(ids, att, loss_mask, adv, old), algo, RowLayout("padded", 2))
    assert m["algo/skipped_steps"] == 1 and m["algo/optimizer_steps"] == 0
    for p, q in zip(pol.parameters(), before):
        assert torch.equal(p, q)


def test_logged_lr_is_the_rate_the_update_used():
    """With a scheduler, algo/lr is the rate of this update, not the next one's: a rate that doubles
    per update (0.1, 0.2, 0.4) logs 0.1, 0.2, 0.4 (it logged 0.2, 0.4, 0.8 before the fix)."""
    tok = tiny_tokenizer()
    ids, att, loss_mask = _batch(tok)
    pol = tiny_model(tok, seed=1).train()
    adv = loss_mask.float()
    opt = torch.optim.SGD(pol.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 2.0 ** step)
    logged = []
    for _ in range(3):
        batch = UpdateBatch(ids, att, loss_mask, adv, batched_logprobs(pol, ids, att, micro_batch_size=4))
        logged.append(policy_update(pol, opt, batch, AlgoConfig(kl_coef=0.0), RowLayout("padded", 4), grad_clip=None,
                                    scheduler=sched)["algo/lr"])
    assert logged == pytest.approx([0.1, 0.2, 0.4])
    assert opt.param_groups[0]["lr"] == pytest.approx(0.8)  # the next update's rate


def test_bucketed_logprobs_equal_full_batch():
    tok = tiny_tokenizer()
    ids, att, _ = _batch(tok)
    model = tiny_model(tok, seed=3)
    full, _ = token_logprobs(model, ids, att)
    bucketed = batched_logprobs(model, ids, att, micro_batch_size=3)
    torch.testing.assert_close(bucketed * att, full.detach() * att, atol=1e-5, rtol=1e-5)


def test_length_buckets_and_padding_share():
    lengths = [9, 6, 12, 7]
    buckets = length_buckets(lengths, 2)
    assert buckets == [[2, 0], [3, 1]]  # longest first
    # computed slots: 2*12 + 2*7 = 38; real tokens 34 -> padding 4/38
    assert abs(padding_share(lengths, buckets) - 4 / 38) < 1e-12
    # one unsorted batch would compute 4*12 = 48 slots
    assert abs(padding_share(lengths, [[0, 1, 2, 3]]) - 14 / 48) < 1e-12


def test_a_token_budget_bounds_each_micro_batch():
    lengths = [9, 6, 12, 7, 3, 3]
    # longest first (12, 9, 7, 6, 3, 3); a bucket's rows x its first (longest) row stay <= 20:
    # 12 | 9+7 (2*9 = 18; a third row: 27) | 6+3+3 (3*6 = 18)
    assert length_buckets(lengths, 8, max_tokens=20) == [[2], [0, 3], [1, 4, 5]]
    assert length_buckets(lengths, 2, max_tokens=20) == [[2], [0, 3], [1, 4], [5]]  # the row cap still holds
    assert length_buckets(lengths, 8, max_tokens=5) == [[2], [0], [3], [1], [4], [5]]  # too long rows go alone
    assert length_buckets(lengths, 8, max_tokens=None) == [[2, 0, 3, 1, 4, 5]]
    for budget in (1, 7, 13, 24, 100):
        buckets = length_buckets(lengths, 8, max_tokens=budget)
        assert sorted(i for b in buckets for i in b) == list(range(6))  # every row once
        assert all(len(b) == 1 or len(b) * max(lengths[i] for i in b) <= budget for b in buckets)
    with pytest.raises(ValueError, match="max_tokens"):
        length_buckets(lengths, 8, max_tokens=0)


def test_grpo_advantages_glue_and_kl_reward_mode():
    mask = torch.tensor([[0, 1, 1], [0, 1, 0], [1, 1, 1], [0, 0, 1]])
    algo = AlgoConfig(advantage="drgrpo", kl_mode="none")
    adv, ret = compute_advantages(algo, torch.tensor([1.0, 0.0, 2.0, 2.0]), ["a", "a", "b", "b"], mask)
    # group a: mean 0.5 -> +0.5 / -0.5 ; group b: mean 2 -> 0, 0 (Dr.GRPO: no std division)
    assert ret is None
    assert torch.equal(adv, torch.tensor([[0, 0.5, 0.5], [0, -0.5, 0], [0, 0, 0], [0, 0, 0]]))
    # reward-mode KL: k1 = old - ref summed over masked tokens is subtracted from the score first
    algo = AlgoConfig(advantage="drgrpo", kl_mode="reward", kl_coef=0.5, kl_estimator="k1")
    old = torch.tensor([[0.0, -1.0, -1.0], [0.0, -1.0, 0.0], [0.0] * 3, [0.0] * 3])
    ref = torch.tensor([[0.0, -2.0, -2.0], [0.0, -1.0, 0.0], [0.0] * 3, [0.0] * 3])
    adv, _ = compute_advantages(
        algo, torch.tensor([1.0, 0.0, 2.0, 2.0]), ["a", "a", "b", "b"], mask, old_logprobs_BT=old, ref_logprobs_BT=ref
    )
    # row 0: kl sum = 1 + 1 = 2 -> score 1 - 0.5*2 = 0; row 1: 0 -> group a mean 0 -> advantages 0, 0
    assert torch.equal(adv[:2], torch.zeros(2, 3))
    with pytest.raises(ValueError, match="advantage"):
        compute_advantages(AlgoConfig(advantage="ppo"), torch.zeros(4), list("aabb"), mask)


def test_checkpoint_atomic_latest_and_reload(tmp_path):
    from transformers import AutoModelForCausalLM

    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=4)
    save_checkpoint(tmp_path, 1, policy=model, tokenizer=tok, trainer_state={"cursor": {"epoch": 0, "pos": 3}})
    # a save killed midway leaves a .tmp directory; latest still names the complete one
    (tmp_path / "checkpoints" / "step_000002.tmp-999").mkdir()
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt.name == "step_000001"
    state = load_trainer_state(ckpt)
    assert state["step"] == 1 and state["cursor"] == {"epoch": 0, "pos": 3} and "rng" in state
    loaded = AutoModelForCausalLM.from_pretrained(ckpt / "policy")
    for p, q in zip(loaded.parameters(), model.parameters()):
        assert torch.equal(p, q)
    for step in (2, 3, 4):
        save_checkpoint(tmp_path, step, policy=model, tokenizer=tok, trainer_state={}, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["latest", "step_000003", "step_000004"]  # stale tmp removed, 2 kept
    assert latest_checkpoint(tmp_path).name == "step_000004"


def test_entropy_as_a_metric_is_computed_outside_the_graph():
    """At ``entropy_coef == 0`` the entropy is a metric: the same values, no autograd graph (its
    [B, T, V] softmax is not kept for the backward pass); with a coefficient it keeps its gradient."""
    tok = tiny_tokenizer()
    ids, att, _ = _batch(tok)
    model = tiny_model(tok, seed=1).train()
    lp_a, ent_a = token_logprobs(model, ids, att, temperature=0.7, with_entropy=True)
    lp_b, ent_b = token_logprobs(model, ids, att, temperature=0.7, with_entropy=True, entropy_grad=False)
    torch.testing.assert_close(ent_b, ent_a.detach(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lp_b, lp_a, atol=0, rtol=0)
    assert ent_a.requires_grad and not ent_b.requires_grad and lp_b.requires_grad


def test_output_layer_runs_only_at_needed_positions():
    """``needed_BT`` (the loss mask): the output layer sees one row per needed token (counted with a
    hook on ``lm_head``), the needed columns' logprobs, entropies and gradients equal those of the
    full forward, and the other columns hold 0."""
    tok = tiny_tokenizer()
    ids, att, loss_mask = _batch(tok)
    full_model, part_model = tiny_model(tok, seed=1).train(), tiny_model(tok, seed=1).train()
    from sleuth.train.forward import _keeps_masked_logits

    seen = []
    part_model.lm_head.register_forward_hook(lambda mod, args, out: seen.append((args[0].shape, out.shape)))
    lp_a, ent_a = token_logprobs(full_model, ids, att, temperature=0.7, with_entropy=True)
    lp_b, ent_b = token_logprobs(part_model, ids, att, temperature=0.7, with_entropy=True, needed_BT=loss_mask)
    N, H = int(loss_mask.sum()), full_model.config.hidden_size
    # transformers >= 5.20 gives the layer the needed positions; before, every position, and the
    # layer keeps the needed ones itself: either way it outputs (logprob, entropy) for N positions
    given = torch.Size([N, H]) if _keeps_masked_logits() else ids.shape + (H,)
    assert seen == [(given, torch.Size([N, 2]))]
    keep = loss_mask.bool()
    torch.testing.assert_close(lp_b[keep], lp_a[keep], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent_b[keep], ent_a[keep], atol=1e-6, rtol=1e-6)
    assert not lp_b[~keep].any() and not ent_b[~keep].any()
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))
    ((lp_a * keep * weights).sum() + (ent_a * keep).sum()).backward()
    ((lp_b * keep * weights).sum() + (ent_b * keep).sum()).backward()
    for (name, p_a), p_b in zip(full_model.named_parameters(), part_model.parameters()):
        torch.testing.assert_close(p_b.grad, p_a.grad, atol=1e-5, rtol=1e-4, msg=name)
    bucketed = batched_logprobs(part_model, ids, att, micro_batch_size=3, temperature=0.7, needed_BT=loss_mask)
    torch.testing.assert_close(bucketed[keep], lp_a[keep].detach(), atol=1e-6, rtol=1e-6)
    assert not bucketed[~keep].any()
    # nothing needed (a micro-batch of rows left out of the loss): zeros that still have a graph, so
    # the masked loss backpropagates (zero gradients) as it did through the full forward
    part_model.zero_grad()
    lp_c, ent_c = token_logprobs(part_model, ids, att, with_entropy=True, needed_BT=torch.zeros_like(loss_mask))
    assert lp_c.requires_grad and not lp_c.any() and not ent_c.any()
    (lp_c.sum() + ent_c.sum()).backward()
    assert all(p.grad is not None and not p.grad.any() for p in part_model.parameters())


def _saved_shapes(fn):
    shapes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
        out = fn()
    return out, shapes


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_chunked_output_layer_equals_the_logits_path_and_saves_no_logits(monkeypatch, dtype):
    """A Llama takes the chunked output layer (sleuth.train.chunked_head): the same logprobs,
    entropies and gradients as computing the [N, V] logits (the path other model families take),
    and no [N, V] tensor is saved for the backward pass; under bf16 autocast too."""
    import sleuth.train.forward as fwd
    from sleuth.models import compute_autocast

    tok = tiny_tokenizer()
    ids, att, loss_mask = _batch(tok)
    N, V = int(loss_mask.sum()), len(tok)
    models = {"chunked": tiny_model(tok, seed=1).train(), "logits": tiny_model(tok, seed=1).train()}
    results = {}
    for name, model in models.items():
        monkeypatch.setattr(fwd, "supports_chunked_head", lambda m, on=name == "chunked": on)
        with compute_autocast(dtype, "cpu"):
            (lp, ent), shapes = _saved_shapes(lambda: token_logprobs(
                model, ids, att, temperature=0.7, with_entropy=True, needed_BT=loss_mask))
        weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))
        ((lp * weights).sum() + ent.sum()).backward()
        results[name] = (lp.detach(), ent.detach(), shapes)
    def logits_saved(shapes):  # a saved tensor shaped like the [N, V] logits (any view of them)
        return any(N in s and V in s for s in shapes)

    assert not logits_saved(results["chunked"][2]) and logits_saved(results["logits"][2])
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == "float32" else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(results["chunked"][0], results["logits"][0], **tol)
    torch.testing.assert_close(results["chunked"][1], results["logits"][1], **tol)
    for (name, p_a), p_b in zip(models["logits"].named_parameters(), models["chunked"].parameters()):
        if dtype == "float32":
            torch.testing.assert_close(p_b.grad, p_a.grad, atol=1e-5, rtol=1e-4, msg=name)
        else:  # bf16 rounding of the same computation
            assert float((p_b.grad - p_a.grad).norm()) <= 0.05 * float(p_a.grad.norm()) + 1e-6, name


def test_only_plain_linear_heads_of_known_families_take_the_chunked_path():
    from sleuth.train.chunked_head import supports_chunked_head

    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=1)
    assert supports_chunked_head(model)
    model.config.model_type = "gemma2"  # soft-caps its logits after the output layer
    assert not supports_chunked_head(model)
    model.config.model_type = "llama"
    model.lm_head = torch.nn.Sequential(model.lm_head)  # e.g. an adapter around the output layer
    assert not supports_chunked_head(model)


def test_under_bf16_autocast_every_mini_batch_runs_on_the_updated_weights():
    """Autocast keeps its bf16 copy of each weight until its context exits, blind to in-place
    optimizer steps: the second mini-batch (and anything after the update in the same step) ran on
    the rollout's weights, so PPO ratios stayed 1. After the fix, a forward inside the context
    equals one in a fresh context, and differs from the forward before the update."""
    from sleuth.models import compute_autocast

    tok = tiny_tokenizer()
    ids, att, loss_mask = _batch(tok)
    pol = tiny_model(tok, seed=1).train()
    opt = torch.optim.SGD(pol.parameters(), lr=0.5)
    adv = loss_mask.float() * torch.tensor([[1.0], [-1.0], [1.0], [-1.0]])
    with compute_autocast("bfloat16", "cpu"):
        before = token_logprobs(pol, ids, att)[0].detach()
        batch = UpdateBatch(ids, att, loss_mask, adv, before.float())
        metrics = policy_update(pol, opt, batch, AlgoConfig(kl_coef=0.0), RowLayout("padded", 4), mini_batches=2,
                                grad_clip=None)
        inside = token_logprobs(pol, ids, att)[0].detach()
    with compute_autocast("bfloat16", "cpu"):
        fresh = token_logprobs(pol, ids, att)[0].detach()
    assert metrics["algo/optimizer_steps"] == 2 and metrics["algo/ratio_max"] > 1.0  # mini-batch 2 saw step 1
    assert torch.equal(inside, fresh) and not torch.equal(inside, before)


def test_a_grad_pass_after_no_grad_passes_under_one_autocast_trains_every_linear(monkeypatch):
    """The trainer's nesting: the step's autocast (cache on) holds the rollout and the no-grad
    logprob pass, then the update's grad pass. On torch builds before pytorch#165068 a cast made
    under no_grad was cached without its graph and the first mini-batch gave no nn.Linear a
    gradient; policy_update clears the cache where its grad pass begins (spied here, since torch
    2.13 no longer shows the failure), and every Linear weight gets a non-zero gradient."""
    from sleuth.models import compute_autocast

    tok = tiny_tokenizer()
    ids, att, loss_mask = _batch(tok)
    pol = tiny_model(tok, seed=1).train()
    opt = torch.optim.SGD(pol.parameters(), lr=0.0)
    grads = {}
    real_step = opt.step

    def step(*a, **k):  # the gradients as the optimizer sees them
        grads.update({n: p.grad for n, p in pol.named_parameters()})
        return real_step(*a, **k)

    monkeypatch.setattr(opt, "step", step)
    cleared = []
    real_clear = torch.clear_autocast_cache
    monkeypatch.setattr(torch, "clear_autocast_cache", lambda: (cleared.append(len(grads)), real_clear()))
    adv = loss_mask.float() * torch.tensor([[1.0], [-1.0], [1.0], [-1.0]])
    with compute_autocast("bfloat16", "cpu"):
        with torch.no_grad():
            old = batched_logprobs(pol, ids, att, micro_batch_size=4)
        with compute_autocast("bfloat16", "cpu"):
            policy_update(pol, opt, UpdateBatch(ids, att, loss_mask, adv, old), AlgoConfig(kl_coef=0.0),
                          RowLayout("padded", 2), grad_clip=None)
    assert cleared and cleared[0] == 0  # cleared before the first forward with grad (no step yet)
    linears = [n for n, m in pol.named_modules() if isinstance(m, torch.nn.Linear)]
    assert linears
    for name in linears:
        g = grads.get(f"{name}.weight")
        if g is None and name == "lm_head" and pol.config.tie_word_embeddings:
            g = grads["model.embed_tokens.weight"]
        assert g is not None and bool(g.abs().sum() > 0), name


def test_guide_rows_add_their_coefficient_times_the_supervised_gradient():
    """algo.guide_coef: the update's gradient is the RL gradient plus coef x the gradient of the guide rows'
    token-mean causal-LM loss (labels -100 outside the trained segments), in any micro-batching."""
    from sleuth.train.guide import GuideRows
    from sleuth.train.sft import batch_tensors, lm_loss

    tok = tiny_tokenizer()
    ids, att, loss_mask = _batch(tok)
    base = tiny_model(tok, seed=1).train()
    algo = AlgoConfig(kl_coef=0.0)
    old = batched_logprobs(base, ids, att, micro_batch_size=4)
    adv, _ = compute_advantages(algo, torch.tensor([1.0, 0.0, 0.0, 1.0]), ["a", "a", "b", "b"], loss_mask)
    batch = UpdateBatch(ids, att, loss_mask, adv, old)
    rows = [([5, 6, 7, 8, 9, 10], [-100, -100, 7, 8, -100, 10]), ([11, 12, 13, 14], [-100, 12, 13, 14])]
    coef = 0.7

    def grads(guide, mbs):
        pol = copy.deepcopy(base)
        seen = {}
        opt = torch.optim.SGD(pol.parameters(), lr=0.0)
        opt.register_step_pre_hook(lambda o, a, k: seen.update({n: p.grad.clone() for n, p in pol.named_parameters()
                                                              if p.grad is not None}))
        metrics = policy_update(pol, opt, batch, algo, RowLayout("padded", mbs), grad_clip=None, guide=guide)
        return seen, metrics

    rl, _ = grads(None, 4)
    pol = copy.deepcopy(base)
    sft_ids, sft_labels, sft_mask = batch_tensors(rows, pad_id=0)
    (coef * lm_loss(pol, sft_ids, sft_labels, sft_mask)).backward()
    expected = {n: rl[n] + p.grad for n, p in pol.named_parameters() if n in rl}
    for mbs in (4, 1):
        got, metrics = grads(GuideRows(rows, coef), mbs)
        for n in expected:
            torch.testing.assert_close(got[n], expected[n], rtol=1e-4, atol=1e-6)
        assert metrics["guide/rows"] == 2.0
        assert metrics["guide/loss"] == pytest.approx(float(lm_loss(base, sft_ids, sft_labels, sft_mask)), rel=1e-5)


def test_old_logprobs_from_the_update_forward_equal_a_separate_no_grad_pass():
    """One epoch of one mini-batch: ``old_logprobs_BT=None`` (the update's own forward, detached) gives the same
    step as the old logprobs from a separate no-grad pass, with TIS against stale sampler logprobs, in
    micro-batches; and the ratio to the old policy is 1 (nothing clipped)."""
    tok = tiny_tokenizer()
    ids, att, loss_mask = _batch(tok, seed=4)
    base = tiny_model(tok, seed=1).train()
    algo = AlgoConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.0, tis_cap=1.5)
    old = batched_logprobs(base, ids, att, micro_batch_size=4)
    # the behaviour policy: older weights, some tokens far enough for the cap to bite
    sampler = old + 0.7 * torch.tensor([[(-1) ** (b + t) for t in range(ids.shape[1])] for b in range(4)]) * loss_mask
    adv, _ = compute_advantages(algo, torch.tensor([1.0, 0.0, 0.0, 1.0]), ["q1", "q1", "q2", "q2"], loss_mask)
    stepped = []
    for old_BT in (old, None):
        pol = copy.deepcopy(base)
        opt = torch.optim.SGD(pol.parameters(), lr=0.1)
        batch = UpdateBatch(ids, att, loss_mask, adv, old_BT, sampler_logprobs_BT=sampler)
        metrics = policy_update(pol, opt, batch, algo, RowLayout("padded", 2), grad_clip=None)
        stepped.append((pol, metrics))
    (p_sep, m_sep), (p_upd, m_upd) = stepped
    assert abs(m_sep["algo/loss"] - m_upd["algo/loss"]) < 1e-6 and m_upd["algo/clipfrac"] == 0.0
    assert abs(m_upd["algo/ratio_mean"] - 1.0) < 1e-6
    for p, q in zip(p_upd.parameters(), p_sep.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)
    assert any(not torch.equal(p, q) for p, q in zip(p_upd.parameters(), base.parameters()))  # it did step
    with pytest.raises(AssertionError, match="one epoch of one mini-batch"):
        policy_update(copy.deepcopy(base), torch.optim.SGD(base.parameters(), lr=0.1),
                      UpdateBatch(ids, att, loss_mask, adv, None), algo, RowLayout("padded", 2), mini_batches=2)

