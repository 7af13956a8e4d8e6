"""The compiled ``hf_static`` decode step of ``bench/gpu_decode.py``: how often it compiles as the
shapes change the way training changes them (``--churn N``), and its rate at one fixed batch
(``--compiled-fixed B``).

What is counted, from ``torch._dynamo.utils.counters`` (deltas over each call; dynamo's caches are
reset first, so earlier compiles neither count nor use up the recompile limit):

* ``graphs``: ``counters["stats"]["unique_graphs"]``, FX graphs dynamo produced. One compile of the
  step is one graph when it has no graph breaks; a graph break makes more per compile.
* ``frames``: ``counters["frames"]["ok"]``, frames compiled (the first compile and every recompile
  of ``_forward_step``, plus any resume frames after a graph break); ``frames_failed``: frames
  dynamo tried and gave up on (``total - ok``: the recompile limit, an unsupported construct).
* ``cudagraph_records``: CUDA graphs recorded (``CUDAGraphTreeManager.record_function`` calls;
  0 off CUDA or with another backend than inductor's reduce-overhead). A record on a call with
  an already seen shape is a re-record (new buffer addresses), not a compile.
* ``recompile_limit_hit``: dynamo gave up on the frame (``torch._dynamo.config.recompile_limit``,
  8 by default): from then on the step runs eager, silently but for one log line.

The churn sequence: call 0 at the base shape (``batch``, ``prompt_len``, cap ``new_tokens``), then
repeating ``prompt+1`` (every prompt one token longer), ``cap+1`` (one more token allowed),
``rows+1`` (one more row), ``same`` (the previous call's shape again: the control). Each call's
static buffer width is ``W = prompt_len + cap`` (no cached prefix). ``new_shapes``: calls whose
``(batch, W)`` no earlier call had; ``graphs_per_new_shape``: graphs compiled after the first call
over ``new_shapes``. ``bucket``: the ``(batch, width)`` the compiled step runs at (hf_static rounds
the batch up to a power of two and the width up to a multiple of 256, over a persistent KV pool);
``new_buckets``: calls whose bucket no earlier call had. hf_static compiles once per bucket (before
its KV pool: once per new shape, ``graphs_per_new_shape`` >= 1), so ``graphs_on_seen_shapes`` and
the graphs of calls in a seen bucket (``graphs_in_seen_buckets``) should be 0; on CUDA
``cudagraph_records`` should be about one per bucket (more are re-records: after the pool grew, its
buffers have new addresses).
"""

from __future__ import annotations

import contextlib
import time
from types import SimpleNamespace

import torch

from gpu_common import synchronize
from sleuth.rollout.backends import SamplingParams
from sleuth.rollout.hf_static import StaticHFBackend

CHANGES = ("prompt+1", "cap+1", "rows+1", "same")


def compiled_static(model, compile_backend: str = "inductor") -> StaticHFBackend:
    """``hf_static`` with ``compile=True``. ``inductor``: exactly hf_static's own compile (reduce-overhead,
    i.e. CUDA graphs, on a GPU); another backend (``eager``, ``aot_eager``: cheap CPU checks) compiles
    its step with that backend and the same ``dynamic=False``, so the guards and recompiles are the same."""
    return StaticHFBackend(model, SimpleNamespace(pad_token_id=0), eos_token_ids=[], compile=True,
                           compile_backend=None if compile_backend == "inductor" else compile_backend)


def error_text(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200] if lines else ''}"


@contextlib.contextmanager
def count_cudagraph_records():
    """Yields a one-item list holding the number of CUDA graphs recorded inside the block (None when
    this torch has no CUDA graph trees to count)."""
    box: list = [0]
    try:
        from torch._inductor.cudagraph_trees import CUDAGraphTreeManager
        original = CUDAGraphTreeManager.record_function
    except (ImportError, AttributeError):
        box[0] = None
        yield box
        return

    def counted(self, *a, **kw):
        box[0] += 1
        return original(self, *a, **kw)

    CUDAGraphTreeManager.record_function = counted
    try:
        yield box
    finally:
        CUDAGraphTreeManager.record_function = original


def snapshot() -> dict:
    from torch._dynamo.utils import counters

    limit_hits = sum(v for k, v in counters["unimplemented"].items()
                     if any(w in k.lower() for w in ("recompile limit", "recompile_limit", "cache_size_limit")))
    return {"graphs": counters["stats"]["unique_graphs"], "frames": counters["frames"]["ok"],
            "frames_failed": counters["frames"]["total"] - counters["frames"]["ok"], "limit_hits": limit_hits}


def delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before}


def timed_call(engine, prompts, cap: int, device, ctx) -> tuple[float, dict, int | None]:
    """``(seconds, counter deltas, CUDA graphs recorded)`` of one sampled generate call of ``cap`` tokens."""
    params = SamplingParams(max_new_tokens=cap, temperature=1.0)
    before = snapshot()
    with count_cudagraph_records() as records, ctx(), torch.no_grad():
        synchronize(device)
        t0 = time.perf_counter()
        out = engine.generate(prompts, params, seeds=list(range(len(prompts))))
        synchronize(device)
        seconds = time.perf_counter() - t0
    assert all(len(r.token_ids) == cap for r in out)
    return seconds, delta(before, snapshot()), records[0]


def churn_probe(model, calls: int, batch: int, prompt_len: int, cap: int, compile_backend: str, ctx,
                seed: int = 0, progress=None) -> dict:
    """Compiles per call of the compiled hf_static step over ``calls`` generate calls shaped as
    training shapes them (see the module docstring). Keys are prefixed ``churn_``; ``progress``
    is called with the summary so far after each call."""
    import torch._dynamo

    torch._dynamo.reset()
    device = next(model.parameters()).device
    engine = compiled_static(model, compile_backend)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    rows, seen, buckets = [], set(), set()
    for i in range(calls):
        change = "base" if i == 0 else CHANGES[(i - 1) % len(CHANGES)]
        prompt_len += change == "prompt+1"
        cap += change == "cap+1"
        batch += change == "rows+1"
        prompts = torch.randint(0, vocab, (batch, prompt_len), generator=g).tolist()
        row = {"call": i, "change": change, "batch": batch, "prompt_len": prompt_len, "cap": cap,
               "width": prompt_len + cap}
        row["new_shape"] = i > 0 and (batch, prompt_len + cap) not in seen
        seen.add((batch, prompt_len + cap))
        row["bucket"] = list(engine.bucket(batch, prompt_len + cap))
        row["new_bucket"] = i > 0 and tuple(row["bucket"]) not in buckets
        buckets.add(tuple(row["bucket"]))
        try:
            seconds, d, records = timed_call(engine, prompts, cap, device, ctx)
            row.update(seconds=seconds, graphs=d["graphs"], frames=d["frames"], frames_failed=d["frames_failed"],
                       cudagraph_records=records, recompile_limit_hit=d["limit_hits"] > 0)
        except Exception as e:  # a failed compile is a result: record it, try the next shape
            row["error"] = error_text(e)
        rows.append(row)
        if progress is not None:
            progress(churn_summary(rows, compile_backend))
    return churn_summary(rows, compile_backend)


def churn_summary(rows: list[dict], compile_backend: str) -> dict:
    ok = [r for r in rows if "error" not in r]
    later = [r for r in ok if r["call"] > 0]
    new_shapes = sum(r["new_shape"] for r in later)
    graphs_later = sum(r["graphs"] for r in later)
    first = ok[0] if ok and ok[0]["call"] == 0 else None
    return {
        "churn_calls": len(rows),
        "churn_failed_calls": len(rows) - len(ok),
        "churn_new_shapes": new_shapes,
        "churn_new_buckets": sum(r["new_bucket"] for r in later),
        "churn_graphs_in_seen_buckets": sum(r["graphs"] for r in later if not r["new_bucket"]),
        "churn_graphs_total": sum(r["graphs"] for r in ok),
        "churn_graphs_first_call": first and first["graphs"],
        "churn_graphs_after_first": graphs_later,
        "churn_graphs_per_new_shape": graphs_later / new_shapes if new_shapes else None,
        "churn_graphs_on_seen_shapes": sum(r["graphs"] for r in later if not r["new_shape"]),
        "churn_compiles_per_call": sum(r["graphs"] for r in ok) / len(ok) if ok else None,
        "churn_frames_total": sum(r["frames"] for r in ok),
        "churn_frames_failed": sum(r["frames_failed"] for r in ok),
        "churn_cudagraph_records": None if not ok or ok[0]["cudagraph_records"] is None
        else sum(r["cudagraph_records"] for r in ok),
        "churn_recompile_limit_hit": any(r["recompile_limit_hit"] for r in ok),
        "churn_s_per_call": sum(r["seconds"] for r in ok) / len(ok) if ok else None,
        "churn_s_first_call": first and first["seconds"],
        "churn_compile_backend": compile_backend,
        "recompile_limit": getattr(torch._dynamo.config, "recompile_limit", None),
        "churn": rows,
    }


def compiled_fixed(model, batch: int, prompt_len: int, new_tokens: int, repeats: int, compile_backend: str,
                   ctx, seed: int = 0) -> dict:
    """The compiled hf_static step at one fixed shape: the first call (compile + decode), then the best
    of ``repeats`` calls of the same shape (decode; the same KV pool, so on CUDA no call re-records its graphs),
    and the same with one new token (the prefill; the compiled step never runs), so
    ``tokens_per_s = batch · (new_tokens - 1) / (t_n - t_1)`` as for the other engines.
    ``compile_s``: first call minus a steady call. Keys are prefixed ``compiled_``."""
    import torch._dynamo

    torch._dynamo.reset()
    device = next(model.parameters()).device
    engine = compiled_static(model, compile_backend)
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, model.config.vocab_size, (batch, prompt_len), generator=g).tolist()
    first_s, first, first_records = timed_call(engine, prompts, new_tokens, device, ctx)
    steady = [timed_call(engine, prompts, new_tokens, device, ctx) for _ in range(max(repeats, 1))]
    prefill = [timed_call(engine, prompts, 1, device, ctx) for _ in range(max(repeats, 1))]
    t_n, t_1 = min(s for s, _, _ in steady), min(s for s, _, _ in prefill)
    step_s = max(t_n - t_1, 1e-9) / (new_tokens - 1)
    return {
        "compiled_batch": batch,
        "compiled_tokens_per_s": batch / step_s,
        "compiled_ms_per_step": 1e3 * step_s,
        "compiled_compile_s": first_s - t_n,
        "compiled_first_call_s": first_s,
        "compiled_graphs_first_call": first["graphs"],
        "compiled_graphs_steady": sum(d["graphs"] for _, d, _ in steady + prefill),
        "compiled_cudagraph_records_first_call": first_records,
        "compiled_cudagraph_records_per_steady_call": None if steady[0][2] is None
        else sum(r for _, _, r in steady) / len(steady),
        "compiled_compile_backend": compile_backend,
    }
