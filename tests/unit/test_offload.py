"""Offload options (sleuth.train.offload): the optimizer state is brought to the parameters for each
step and sent back after (and after a checkpoint load), training is unchanged, and (GPU) the state
really lives in CPU memory between steps."""

import copy

import pytest
import torch

import sleuth.train.offload as offload

pytestmark = pytest.mark.unit


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))


def _train(model, opt, steps=3):
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(4, 6, generator=g)
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()


def test_the_state_goes_to_the_parameters_for_each_step_and_home_after(monkeypatch):
    events = []
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    offload.offload_optimizer(opt)
    offload.offload_optimizer(opt)  # idempotent: hooks registered once
    monkeypatch.setattr(offload, "state_to_params", lambda o: events.append("to params"))
    monkeypatch.setattr(offload, "state_to_home", lambda o: events.append("home"))
    opt.register_step_pre_hook(lambda o, a, k: events.append("step"))  # runs after ours: registered later
    _train(model, opt, steps=2)
    assert events == ["to params", "step", "home"] * 2
    events.clear()
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert events == ["home"]
    with offload.state_on_params(opt):
        assert events == ["home", "to params"]
        # FSDP's state-dict gather may step the optimizer at rate 0 to create its state: it stays put
        opt.step()
        opt.load_state_dict(copy.deepcopy(opt.state_dict()))
        assert events == ["home", "to params", "to params", "step"]
    assert events == ["home", "to params", "to params", "step", "home"]


def test_offloaded_training_equals_plain_training():
    a, b = _model(), _model()
    opt_a = torch.optim.AdamW(a.parameters(), lr=1e-2, weight_decay=0.01)
    opt_b = offload.offload_optimizer(torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=0.01))
    _train(a, opt_a)
    _train(b, opt_b)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    for p in b.parameters():
        assert all(v.device.type == "cpu" for v in opt_b.state[p].values())


def test_a_plain_optimizer_and_a_cpu_model_are_left_alone():
    model = _model()
    opt = torch.optim.AdamW(model.parameters())
    _train(model, opt, steps=1)
    before = {k: v for k, v in opt.state[next(model.parameters())].items()}
    with offload.state_on_params(opt), offload.on_device(model, torch.device("cpu"), offloaded=True):
        pass
    after = opt.state[next(model.parameters())]
    assert all(after[k] is before[k] for k in before)  # not copied


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_state_and_the_reference_live_in_cpu_memory_between_uses():
    model = _model().cuda()
    opt = offload.offload_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    seen = []
    opt.register_step_pre_hook(lambda o, a, k: seen.append({v.device.type for s in o.state.values()
                                                             for v in s.values() if v.dim()}))
    g = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 6, device="cuda", generator=g)).pow(2).sum().backward()
        opt.step()
    assert seen[1] == {"cuda"}  # the second step found its state on the GPU
    assert {v.device.type for s in opt.state.values() for v in s.values() if v.dim()} == {"cpu"}
    ref = _model()
    with offload.on_device(ref, torch.device("cuda"), offloaded=True):
        assert next(ref.parameters()).device.type == "cuda"
    assert next(ref.parameters()).device.type == "cpu"
