"""``python tests/helpers/vllm_stub_cli.py ARGS…``: ``sleuth ARGS…`` with the stub ``vllm`` module
(:mod:`tests.helpers.vllm_stub`) installed and CUDA reported present, so that ``rollout.backend=vllm``
runs on CPU, e.g. under ``torchrun`` (the stub's events go to ``$STUB_VLLM_LOG``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: `tests.helpers` imports

from tests.helpers.vllm_stub import stub_vllm_module  # noqa: E402

sys.modules["vllm"] = stub_vllm_module()

from sleuth.cli import main  # noqa: E402
from sleuth.rollout import vllm_backend  # noqa: E402

vllm_backend.cuda_available = lambda: True

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
