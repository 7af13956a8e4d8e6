"""The PPO critic's value of action token t is the value of the state *before* token t.

verl (``dp_critic.py``: ``values[:, -response_length - 1 : -1]``) and Search-R1 read the critic one
position earlier than the token whose baseline it is. A critic that has seen the action fits the
reward itself, and the advantage ``r - V`` vanishes once it is trained.
"""

import pytest
import torch

from sleuth.algo.advantages import gae_advantages, token_rewards
from sleuth.algo.losses import value_loss
from sleuth.config import AlgoConfig
from sleuth.models import ValueHead
from sleuth.train.update import UpdateBatch, _critic_loss
from sleuth.train.layout import RowLayout
from tests.helpers.tiny import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.component


def _critic(seed=0):
    tok = tiny_tokenizer()
    body = tiny_model(tok, seed=seed, hidden=32, layers=1)
    critic = ValueHead(body, body.config.hidden_size)
    torch.nn.init.normal_(critic.head.weight, std=0.5, generator=torch.Generator().manual_seed(seed))
    return tok, critic


def test_value_column_t_is_the_state_before_token_t():
    tok, critic = _critic()
    ids = torch.tensor([[5, 17, 23, 41, 9, 30]])
    att = torch.ones_like(ids)
    with torch.no_grad():
        values = critic(ids, att)[0]
        hidden = critic.body(input_ids=ids, attention_mask=att, output_hidden_states=True).hidden_states[-1]
        after = critic.head(hidden).squeeze(-1)[0]  # the value read *at* each position
    assert values[0] == 0  # no state precedes the first (prompt) token
    for t in range(1, ids.shape[1]):
        # the value of a prefix: a forward on ids[:, :t] alone, read at its last position
        with torch.no_grad():
            prefix = critic(ids[:, :t + 1], att[:, :t + 1])[0, t]
        assert torch.allclose(values[t], after[t - 1], atol=1e-6)
        assert torch.allclose(values[t], prefix, atol=1e-6)
    # changing token t leaves column t alone (it has not seen it) and moves column t + 1
    changed = ids.clone()
    changed[0, 3] = 77
    with torch.no_grad():
        v2 = critic(changed, att)[0]
    assert torch.allclose(v2[:4], values[:4], atol=1e-6)
    assert not torch.allclose(v2[4], values[4], atol=1e-4)


def test_one_step_bandit_keeps_its_advantage_after_the_critic_fits():
    """Prompt [5, 17], one action token: 12 (reward 1, 6 rows) or 19 (reward 0, 4 rows). The
    critic, trained by our own value loss through the update's critic path, must learn the prompt's
    value (0.6), so the GAE advantages stay near +0.4 / -0.6 instead of collapsing to 0."""
    torch.manual_seed(0)
    _, critic = _critic(seed=3)
    ids = torch.tensor([[5, 17, 12]] * 6 + [[5, 17, 19]] * 4)
    att = torch.ones_like(ids)
    mask = torch.zeros_like(ids)
    mask[:, 2] = 1
    scores = torch.tensor([1.0] * 6 + [0.0] * 4)
    rewards = token_rewards(scores, mask)
    algo = AlgoConfig(advantage="gae", value_clip=1e9, gamma=1.0, lam=1.0)
    opt = torch.optim.AdamW(critic.parameters(), lr=3e-3)
    for _ in range(300):
        with torch.no_grad():
            old = critic(ids, att)
        _, returns = gae_advantages(rewards, old, mask)
        batch = UpdateBatch(ids, att, mask, torch.zeros(ids.shape), torch.zeros(ids.shape), returns_BT=returns,
                            old_values_BT=old)
        opt.zero_grad()
        _critic_loss(critic, batch, list(range(10)), algo, float(mask.sum()), None, {}, RowLayout()).backward()
        opt.step()
    with torch.no_grad():
        values = critic(ids, att)
    adv, _ = gae_advantages(rewards, values, mask)
    adv_B = adv[:, 2]
    assert values[:, 2].sub(0.6).abs().max() < 0.05  # V(prompt) = P(rewarded action)
    assert adv_B[:6].sub(0.4).abs().max() < 0.05 and adv_B[6:].add(0.6).abs().max() < 0.05
    # the loss the critic was trained on is the squared error at the action column
    loss, _ = value_loss(values, values, returns, mask, clip=1e9)
    assert abs(float(loss) - 0.5 * 0.24) < 0.02  # 0.5 * Var(r) = 0.5 * 0.6 * 0.4


def test_the_critic_runs_no_lm_head_and_its_micro_batches_equal_one_batch():
    """The value head reads the decoder's hidden states: the LM head (a [B, T, V] projection the
    value ignores) never runs; values in length buckets (micro_batch_size, token budget) equal one
    forward over the padded batch."""
    from sleuth.train.forward import batched_values

    _, critic = _critic(seed=1)
    calls = []
    critic.body.get_output_embeddings().register_forward_hook(lambda *a: calls.append(1))
    ids = torch.tensor([[5, 17, 23, 41, 9, 30], [5, 8, 9, 0, 0, 0], [7, 7, 12, 13, 0, 0]])
    att = (torch.arange(6)[None] < torch.tensor([[6], [3], [4]])).long()
    with torch.no_grad():
        whole = critic(ids, att)
    assert not calls
    for mbs, budget in ((1, None), (2, None), (8, 8)):
        got = batched_values(critic, ids, att, micro_batch_size=mbs, max_tokens=budget)
        torch.testing.assert_close(got * att, whole * att, atol=1e-6, rtol=1e-6)


def test_critic_warmup_updates_the_critic_alone():
    """``train_policy=False`` (train.critic_warmup_steps): the critic moves, the policy's weights,
    optimizer state and learning-rate schedule do not."""
    from sleuth.train.update import policy_update

    tok, critic = _critic(seed=2)
    policy = tiny_model(tok, seed=4, hidden=32, layers=1).train()
    ids = torch.tensor([[5, 17, 12, 9]] * 4)
    att, mask = torch.ones_like(ids), torch.tensor([[0, 0, 1, 1]] * 4)
    with torch.no_grad():
        old_v = critic(ids, att)
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    _, returns = gae_advantages(token_rewards(scores, mask), old_v, mask)
    batch = UpdateBatch(ids, att, mask, torch.ones(ids.shape), torch.full(ids.shape, -1.0), returns_BT=returns,
                        old_values_BT=old_v)
    algo = AlgoConfig(advantage="gae", kl_coef=0.0, kl_mode="none")
    opt, c_opt = torch.optim.AdamW(policy.parameters(), lr=1e-2), torch.optim.AdamW(critic.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    before_p = [p.detach().clone() for p in policy.parameters()]
    before_c = [p.detach().clone() for p in critic.parameters()]
    metrics = policy_update(policy, opt, batch, algo, RowLayout("padded", 2), critic=critic, critic_optimizer=c_opt,
                            scheduler=sched, train_policy=False)
    assert all(torch.equal(a, b) for a, b in zip(before_p, policy.parameters()))
    assert not opt.state and sched.last_epoch == 0 and opt.param_groups[0]["lr"] == 1e-2
    assert any(not torch.equal(a, b) for a, b in zip(before_c, critic.parameters()))
    assert metrics["algo/value_loss"] > 0
    policy_update(policy, opt, batch, algo, RowLayout("padded", 2), critic=critic, critic_optimizer=c_opt,
                  scheduler=sched, train_policy=True)  # after the warm-up both move
    assert any(not torch.equal(a, b) for a, b in zip(before_p, policy.parameters())) and sched.last_epoch == 1
    with pytest.raises(ValueError, match="critic"):
        policy_update(policy, opt, batch, algo, RowLayout("padded", 2), train_policy=False)
