"""A stub ``vllm`` module for CPU tests of the vLLM rollout backend (``sys.modules["vllm"]``).

``StubLLM`` has the surface ``VLLMBackend`` uses (V1-style: ``apply_model``, no ``llm_engine``):
it builds its model from the saved config with random weights (as ``load_format="dummy"`` does;
otherwise it loads the checkpoint),
records every ``load_weights`` push, and generates with our HF backend on its own copy of the
weights. Its logprobs are the true ones minus ``OFFSET``: a sampler that disagrees with the
trainer by a known amount. Sleep mode is modelled as vLLM's level 2: ``sleep`` scrambles the
weights (they are discarded), ``wake_up(["weights"])`` must precede the push, ``generate`` while
asleep fails. ``events`` lists what happened, in order; with ``STUB_VLLM_LOG`` set (a directory),
each engine also writes them to ``events_rank{RANK}.json`` there, with every push's weights
summarised per tensor (sum and sum of squares) so another process can check them.
"""

from __future__ import annotations

import json
import os
import types
from types import SimpleNamespace as NS

import torch

from sleuth.rollout.backends import SamplingParams
from sleuth.rollout.hf_backend import HFBackend

OFFSET = 0.25  # stub logprob = true logprob - OFFSET


def fingerprint(t: torch.Tensor) -> list[float]:
    t = t.detach().double()
    return [float(t.sum()), float((t * t).sum())]


class StubEngineModel:
    """What ``apply_model`` hands over: vLLM's model, here a HF model plus a recording ``load_weights``."""

    def __init__(self, hf, llm):
        self.hf, self.llm = hf, llm
        self.pushes: list[dict[str, torch.Tensor]] = []

    def load_weights(self, weights):
        weights = list(weights)
        assert not self.llm.weights_discarded, "load_weights while the weights' memory is asleep (wake it first)"
        self.pushes.append({n: t.detach().clone() for n, t in weights})
        self.llm.record("push", {n: fingerprint(t) for n, t in weights})
        params = self.hf.state_dict()  # shares storage with the parameters
        with torch.no_grad():
            for n, t in weights:
                params[n].copy_(t)
        return {n for n, _ in weights}


class StubLLM:
    last = None

    def __init__(self, model, **kwargs):
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        self.kwargs = kwargs
        torch.manual_seed(123)  # as vLLM seeds every generator when it builds an engine
        if kwargs.get("load_format") == "dummy":  # random weights of the saved architecture
            hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model))
        else:  # the checkpoint's weights
            hf = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, kwargs.get("dtype", "float32")))
        self.engine_model = StubEngineModel(hf.eval(), self)
        self.tok = AutoTokenizer.from_pretrained(model)
        self.emitted: list[float] = []  # every logprob returned, in order
        self.resets = 0
        self.events: list[tuple] = []
        self.weights_discarded = self.kv_discarded = False
        self.shut_down = False
        self.record("build", {k: v for k, v in kwargs.items() if isinstance(v, (str, int, float, bool))})
        StubLLM.last = self

    def record(self, kind: str, detail=None) -> None:
        self.events.append((kind, detail))
        log = os.environ.get("STUB_VLLM_LOG")
        if log:
            path = os.path.join(log, f"events_rank{os.environ.get('RANK', '0')}.json")
            with open(path, "w") as f:
                json.dump(self.events, f)

    def get_tokenizer(self):
        return self.tok

    def apply_model(self, fn):
        return [fn(self.engine_model)]

    def reset_prefix_cache(self):
        self.resets += 1

    def sleep(self, level=1):
        assert self.kwargs.get("enable_sleep_mode"), "sleep() on an engine built without enable_sleep_mode"
        assert level == 2
        with torch.no_grad():  # level 2 discards the weights: a wake without a push would sample from these
            for p in self.engine_model.hf.parameters():
                p.normal_()
        self.weights_discarded = self.kv_discarded = True
        self.record("sleep", level)

    def wake_up(self, tags=None):
        tags = list(tags or ["weights", "kv_cache"])
        if "kv_cache" in tags:
            assert not self.weights_discarded or "weights" in tags, "kv_cache woken before the weights"
        self.weights_discarded &= "weights" not in tags
        self.kv_discarded &= "kv_cache" not in tags
        self.record("wake", tags)

    def shutdown(self):
        import torch.distributed as dist

        self.shut_down = True
        self.record("shutdown", {"process_group_alive": dist.is_available() and dist.is_initialized()})

    def generate(self, prompts, params, use_tqdm=False):
        assert not (self.weights_discarded or self.kv_discarded) and not self.shut_down, "generate on a sleeping engine"
        p0 = params[0]
        ours = SamplingParams(temperature=p0.temperature, top_p=p0.top_p, top_k=max(p0.top_k, 0),
                              stop=tuple(p0.stop or ()))
        prompt_ids = [p["prompt_token_ids"] for p in prompts]
        self.record("generate", {"rows": len(prompts), "prompts": prompt_ids, "temperature": p0.temperature})
        res = HFBackend(self.engine_model.hf, self.tok).generate(
            prompt_ids, ours, seeds=[p.seed for p in params], max_new_tokens=[p.max_tokens for p in params])
        outs = []
        for r in res:
            lps = [lp - OFFSET for lp in r.logprobs]
            self.emitted += lps
            comp = NS(token_ids=r.token_ids, logprobs=[{t: NS(logprob=lp)} for t, lp in zip(r.token_ids, lps)],
                      finish_reason="length" if r.finish_reason == "length" else "stop",
                      stop_reason=r.stop_string)  # vLLM: the stop string, or None when eos ended the row
            outs.append(NS(outputs=[comp]))
        return outs


def stub_vllm_module():
    mod = types.ModuleType("vllm")
    mod.LLM = StubLLM
    mod.SamplingParams = NS
    return mod
