"""``--device`` checked before torch sees it: malformed strings and absent GPUs are clear errors."""

import pytest

from sleuth.device import check_device

pytestmark = pytest.mark.unit


def test_valid_devices():
    assert check_device(None) is None and check_device("auto") is None  # the library's choice
    assert check_device("cpu") == "cpu"


@pytest.mark.parametrize("bad", ["banana", "CUDA", "cuda:", "cuda:x", "gpu", ""])
def test_malformed_device_names_flag_value_and_choices(bad):
    with pytest.raises(ValueError) as e:
        check_device(bad)
    assert f"--device {bad!r} is not a device" in str(e.value) and "cpu, cuda, cuda:N" in str(e.value)


def test_cuda_without_a_gpu(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"--device cuda: CUDA is not available .* use --device cpu or auto"):
        check_device("cuda")


def test_cuda_index_beyond_the_gpus(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_device("cuda:1") == "cuda:1"
    with pytest.raises(ValueError, match=r"--device cuda:2: this machine has 2 GPU\(s\), cuda:0 to cuda:1"):
        check_device("cuda:2", flag="--device")
