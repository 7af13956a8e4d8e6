"""Pushing trainer weights into a vLLM engine: which engine API is used, what is pushed, errors.

No vLLM here: engines are small stand-ins with the attribute paths / methods of each vLLM version.
"""

import copy
import pickle
import sys
from types import SimpleNamespace as NS

import pytest
import torch

from sleuth.config import RolloutConfig
from sleuth.errors import UserError
from sleuth.rollout import vllm_backend
from sleuth.rollout.vllm_backend import VLLMBackend, VLLMUnavailable, load_into_engine
from sleuth.train.engine import trainer_weights
from tests.helpers.tiny import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.unit


class Recorder:
    def __init__(self):
        self.calls = []

    def load_weights(self, weights):
        self.calls.append(list(weights))
        return {n for n, _ in self.calls[-1]}


def nest(path: str, leaf):
    """An object where ``path`` (dotted) leads to ``leaf``."""
    for part in reversed(path.split(".")):
        leaf = NS(**{part: leaf})
    return leaf


WEIGHTS = [("model.norm.weight", torch.ones(3)), ("lm_head.weight", torch.zeros(2, 3))]


@pytest.mark.parametrize("path", vllm_backend.MODEL_PATHS)
def test_in_process_model_is_loaded_directly(path):
    model, applied = Recorder(), []
    llm = nest(path, model)
    llm.apply_model = applied.append  # present but not needed: the direct path wins
    load_into_engine(llm, WEIGHTS)
    assert model.calls == [WEIGHTS] and applied == []


def test_v1_apply_model_gets_a_picklable_loader():
    model = Recorder()

    def apply_model(fn):
        fn = pickle.loads(pickle.dumps(fn))  # what a V1 engine in another process receives
        return [fn(model)]

    load_into_engine(NS(apply_model=apply_model), WEIGHTS)
    assert [n for n, _ in model.calls[0]] == ["model.norm.weight", "lm_head.weight"]
    assert torch.equal(model.calls[0][0][1], torch.ones(3))


def test_engine_without_any_weight_api_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"neither llm\.llm_engine.*nor LLM\.apply_model.*vLLM >= 0\.8.*backend=hf"):
        load_into_engine(NS(llm_engine=NS()), WEIGHTS)


def test_plain_model_weights_are_its_state_dict_without_copies():
    model = tiny_model(tiny_tokenizer(), hidden=32)
    sd = model.state_dict()
    pushed = trainer_weights(model)
    assert [n for n, _ in pushed] == list(sd)
    assert all(t.data_ptr() == sd[n].data_ptr() for n, t in pushed)


def test_lora_weights_are_merged_out_of_place_like_peft_merge_and_unload():
    pytest.importorskip("peft")
    from sleuth.models import add_lora

    base = tiny_model(tiny_tokenizer(), hidden=32)
    names = list(base.state_dict())
    policy = add_lora(base, rank=4, alpha=8.0, targets=["q_proj", "v_proj"])
    with torch.no_grad():  # lora_B starts at 0 (delta 0): make the adapters matter
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    before = {n: t.clone() for n, t in policy.state_dict().items()}
    pushed = dict(trainer_weights(policy))
    reference = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert list(pushed) == names == list(reference)
    for n in names:
        torch.testing.assert_close(pushed[n], reference[n], rtol=0, atol=1e-6)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(pushed[q], before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"])
    assert all(torch.equal(t, before[n]) for n, t in policy.state_dict().items())  # trainer untouched


def test_missing_vllm_errors_are_user_errors_and_import_errors(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(VLLMUnavailable, match=r"pip install 'sleuth\[gpu\]'") as e:
        VLLMBackend("some/model")
    assert isinstance(e.value, UserError) and isinstance(e.value, ImportError)
    tok = tiny_tokenizer()
    with pytest.raises(UserError, match=r"rollout.vllm_tensor_parallel_size=2 must divide the number of ranks \(3\)"):
        VLLMBackend.from_trainer(tiny_model(tok, hidden=32), tok, "unused", RolloutConfig(vllm_tensor_parallel_size=2),
                                 dtype="float32", world_size=3)
