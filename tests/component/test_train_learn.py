"""train/learn: when the old (proximal) logprobs may come from the update's own forward (the update's side of
it, equal to a separate pass: tests/component/test_train_update.py)."""

import pytest
import torch

from sleuth.config import Config
from sleuth.train.learn import dropout_free, old_from_update
from tests.helpers.tiny import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.component


def test_old_from_update_only_where_the_old_policy_is_the_current_one():
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=1)
    cfg = Config()
    assert dropout_free(model) and old_from_update(cfg, model)
    cfg.train.mini_batches = 2
    assert not old_from_update(cfg, model)
    cfg.train.mini_batches, cfg.train.epochs = 1, 2
    assert not old_from_update(cfg, model)
    cfg.train.epochs, cfg.algo.kl_mode, cfg.algo.kl_coef = 1, "reward", 0.01  # advantages need them first
    assert not old_from_update(cfg, model)
    cfg.algo.kl_mode = "loss"
    model.config.attention_dropout = 0.1
    assert not dropout_free(model) and not old_from_update(cfg, model)
    model.config.attention_dropout = 0.0
    model.model.layers[0].add_module("drop", torch.nn.Dropout(0.1))
    assert not dropout_free(model)
