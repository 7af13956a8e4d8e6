"""The memory plan: the expected peak memory per rank of a training run, before any weight is loaded.

``sleuth train`` prints it and, when ``train.max_tokens_per_micro_batch`` bounds the micro-batches,
refuses a config whose peak cannot fit the visible device (a GPU's memory, or the machine's RAM for
a CPU run), naming the settings to change (without a token budget the activation term is a worst
case, every row at full context: a warning only); ``sleuth train --plan`` prints it and exits.
``train.memory_check: false`` runs anyway.

What is counted (bytes per rank; P parameters, P_t trainable, N ranks, FSDP divides by N what it shards):

* master weights: float32 policy parameters (``4 P``, ``/ N`` under FSDP);
* compute copy: under autocast (``model.dtype`` bfloat16/float16) the weights cast once per step
  (``2 P``; under FSDP the update casts at each use, one block's casts held at a time with gradient
  checkpointing, every block's without);
* gradients ``4 P_t`` and AdamW state ``8 P_t`` (``/ N`` under FSDP; with ``train.offload_optimizer``
  the state is on the device at the optimizer step only);
* reference: a frozen copy in ``model.reference_dtype`` (float32 by default) (none with LoRA, none without a KL term, none
  under ``rollout.async_steps``: the rollout worker holds it; with ``train.offload_reference`` on the device for its
  pass only);
* critic (``algo.advantage: gae``): its own master weights, gradients and AdamW state;
* FSDP: generation runs on the full weights, all-gathered (float32, plus their autocast copy);
* activations of one micro-batch at the token budget ``M`` (``train.max_tokens_per_micro_batch``,
  else ``micro_batch_size x max_context_tokens``): per token and decoder layer, the tensors
  autograd saves in a block, measured with ``saved_tensors_hooks`` on CPU and exact to the byte
  there (tests/component/test_memory_plan.py). A Llama-family block: float32
  ``32 H + 8 KV + 16 I + 4 A + 8`` bytes, under bf16 autocast ``30 H + 4 KV + 8 I + 4 A + 8`` (H hidden
  size, I the MLP's, KV = key-value heads x head size, A attention heads), plus ``8 H + 4 D + 12``
  outside the blocks (embeddings, final norm, rotary tables; D head size). A Gemma-3 block (four norms
  computed in float32, query/key norms; Q = A x D, which need not be H): float32
  ``40 H + 16 I + 16 Q + 16 KV + 8 A + 4 K + 16``, bf16 ``42 H + 8 I + 14 Q + 10 KV + 8 A + 4 K + 16`` (K
  key-value heads), plus ``8 H + 8 D + 15`` outside (packed rows); exact with one key-value head or one per query head,
  a few hundred bytes a token more per block in between. With gradient checkpointing the blocks' inputs
  (``4 H``) plus one block recomputed; doubled with a critic;
* with ``train.remove_padding``, the packed row's [M, M] boolean attention mask, and the additive mask
  SDPA makes of it and saves for backward in every layer: ``M^2`` bytes in the compute dtype per layer
  (one layer with gradient checkpointing), measured for Llama and Gemma-3 blocks on CPU;
* the output layer of a micro-batch: two [C, V] float32 blocks with the chunked head
  (``sleuth.train.chunked_head``), else ``20 V`` bytes per scored token (every token, an upper bound);
* KV cache of generation: ``rows x max_context_tokens x 2 x layers x KV x dtype bytes`` for the rows
  generating at once (``rollout.max_concurrent_rows``, else every row of the rank's share).

Static = master weights + the AdamW state, reference and critic held on the device (with asynchronous
rollouts also the worker beside the trainer, its whole float32 policy and reference, or under
``rollout.workers`` the N + 1 weight buffers on their way to the rollout rank). Peak = the
largest phase: rollout (static + compute copy, or under FSDP the gathered weights, + KV cache),
update (static + compute copy + gradients + activations + output layer), the reference pass (under
FSDP or offloaded: static + the whole reference) and the optimizer step (static + gradients +
AdamW's foreach temporaries, 4 bytes per trainable parameter, + the AdamW state when offloaded). Allocator caching and fragmentation, CUDA context and
library workspaces are not in it: the check keeps 10% of the device free for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sleuth.config import Config
from sleuth.errors import ConfigError
from sleuth.models import reference_dtype
from sleuth.named import model_dir

GEMMA3_TYPES = ("gemma3_text", "gemma3")  # model types whose blocks the Gemma-3 activation formula describes
FREE_SHARE = 0.10  # of the device kept for what the plan does not count
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class MemoryPlanError(ConfigError):
    """The config's expected peak does not fit the device."""


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a model: parameter counts and the decoder's dimensions."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    kv_dim: int  # key-value heads x head size
    heads: int
    head_dim: int
    vocab: int
    chunked_head: bool  # the update's output layer runs chunked (a Llama-family plain head)
    sliding_layers: int = 0  # layers with sliding-window attention (Gemma-3: 5 of every 6)
    family: str = "llama"  # whose block the activation formula describes: llama, or gemma3
    window: int | None = None  # their window, in tokens
    slot_cache: bool = True  # the HF rollout keeps every layer's keys/values whole (rollout/hf_cache.supports_slot_cache)

    @classmethod
    def from_config(cls, hf_config) -> ModelShape:
        from transformers import AutoModelForCausalLM

        from sleuth.rollout.hf_cache import supports_slot_cache  # lazy: memory_plan is imported by the loop
        from sleuth.train.chunked_head import plain_head

        with torch.device("meta"):  # no memory, no weights: just the parameter shapes
            model = AutoModelForCausalLM.from_config(hf_config)
        params = sum(p.numel() for p in model.parameters())
        c = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
        heads = c.num_attention_heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        kv_heads = getattr(c, "num_key_value_heads", None) or heads
        sliding = sum(t == "sliding_attention" for t in getattr(c, "layer_types", None) or [])
        return cls(params=params, layers=c.num_hidden_layers, hidden=c.hidden_size,
                   intermediate=getattr(c, "intermediate_size", 4 * c.hidden_size), kv_dim=kv_heads * head_dim,
                   heads=heads, head_dim=head_dim, vocab=c.vocab_size, chunked_head=plain_head(c),
                   sliding_layers=sliding, window=getattr(c, "sliding_window", None) if sliding else None,
                   slot_cache=supports_slot_cache(model),
                   family="gemma3" if getattr(c, "model_type", "") in GEMMA3_TYPES else "llama")


def load_shape(cfg: Config) -> ModelShape:
    """The shape of ``model.name_or_path`` from its config alone (no weights are read)."""
    from transformers import AutoConfig

    from sleuth.models import resolve_model  # lazy: transformers only when a plan is made

    source = resolve_model(model_dir(cfg.model.name_or_path), cfg.model.gguf_file)  # "tiny": sleuth.named
    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    return ModelShape.from_config(AutoConfig.from_pretrained(source.path, **kwargs))


def lora_params(shape: ModelShape, rank: int, targets: list[str]) -> int:
    """LoRA parameters: ``rank x (in + out)`` per targeted projection (Llama naming)."""
    H, I, KV = shape.hidden, shape.intermediate, shape.kv_dim
    dims = {"q_proj": (H, H), "k_proj": (H, KV), "v_proj": (H, KV), "o_proj": (H, H),
            "gate_proj": (H, I), "up_proj": (H, I), "down_proj": (I, H)}
    return shape.layers * sum(rank * (i + o) for t, (i, o) in dims.items() if t in targets)


def activation_bytes_per_token(shape: ModelShape, dtype: str, checkpointing: bool) -> float:
    """Bytes autograd keeps per token of a micro-batch over all decoder layers (see the module docstring)."""
    H, I, KV, L, A, D = shape.hidden, shape.intermediate, shape.kv_dim, shape.layers, shape.heads, shape.head_dim
    if shape.family == "gemma3":
        Q, K = A * D, KV // D
        if dtype == "float32":
            block = 40 * H + 16 * I + 16 * Q + 16 * KV + 8 * A + 4 * K + 16
        else:
            block = 42 * H + 8 * I + 14 * Q + 10 * KV + 8 * A + 4 * K + 16
        outside = 8 * H + 8 * D + 15
    else:
        if dtype == "float32":
            block = 32 * H + 8 * KV + 16 * I + 4 * A + 8
        else:
            block = 30 * H + 4 * KV + 8 * I + 4 * A + 8
        outside = 8 * H + 4 * D + 12
    if checkpointing:  # each block's input kept, one block's activations alive while it is recomputed
        return L * 4 * H + block + outside
    return L * block + outside


@dataclass
class MemoryPlan:
    """Bytes per rank by component, the phases' totals, the peak, and the device's capacity."""

    items: dict[str, float] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    phases: dict[str, tuple[float, str]] = field(default_factory=dict)  # name: (bytes, what it holds)
    peak: float = 0.0
    capacity: float | None = None
    device: str = ""
    world_size: int = 1

    @property
    def rollout(self) -> float:
        return self.phases["rollout"][0]

    @property
    def update(self) -> float:
        return self.phases["update"][0]

    def fits(self) -> bool:
        return self.capacity is None or self.peak <= (1 - FREE_SHARE) * self.capacity

    def table(self) -> str:
        gib = 2**30
        lines = [f"Memory plan per rank ({self.world_size} rank(s), {self.device}):"]
        for name, value in self.items.items():
            lines.append(f"  {name:<26} {value / gib:8.2f} GiB  {self.notes.get(name, '')}")
        for name, (value, what) in self.phases.items():
            lines.append(f"  {name + ' phase':<26} {value / gib:8.2f} GiB  ({what})")
        cap = f" of {self.capacity / gib:.2f} GiB" if self.capacity else ""
        lines.append(f"  {'expected peak':<26} {self.peak / gib:8.2f} GiB{cap}")
        return "\n".join(lines)


def device_capacity(device: torch.device) -> float | None:
    """Total bytes of the device the run will use: a GPU's memory, or the machine's RAM."""
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[1])
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def make_plan(cfg: Config, shape: ModelShape, *, world_size: int = 1, capacity: float | None = None,
              device: str = "") -> MemoryPlan:
    """The plan of ``cfg`` for a model of ``shape`` on ``world_size`` ranks."""
    mc, tc, rc = cfg.model, cfg.train, cfg.rollout
    fsdp = tc.parallel == "fsdp" and world_size > 1
    shard = world_size if fsdp else 1
    compute = DTYPE_BYTES[mc.dtype]
    P = shape.params
    plan = MemoryPlan(world_size=world_size, capacity=capacity, device=device)
    it, notes = plan.items, plan.notes
    held = _held_terms(plan, cfg, shape, shard, fsdp)
    static = sum(it.values())
    copy = compute * P if compute != 4 and not fsdp else 0.0
    if fsdp and compute != 4:  # the update casts at each use; the casts are saved for backward per block
        copy = compute * P / shape.layers if tc.grad_checkpointing else compute * P
    it["compute copy"] = copy
    notes["compute copy"] = f"{mc.dtype} weights under autocast" if copy else "none (float32 compute)"
    # FSDP: generation runs on the full weights, every block all-gathered (sleuth.train.distributed.gathered)
    gathered = 4 * P * (shard - 1) / shard + (compute * P if compute != 4 else 0.0) if fsdp else 0.0
    if fsdp:
        it["gathered weights"] = gathered
        notes["gathered weights"] = "FSDP rollout: the full float32 weights (+ their autocast copy)"
    it["gradients"] = 4 * held["trainable"] / shard
    tokens = tc.max_tokens_per_micro_batch or tc.micro_batch_size * rc.max_context_tokens
    rows = cfg.train.questions_per_step * rc.group_size // max(world_size, 1)  # this rank's rows a step
    per_token = activation_bytes_per_token(shape, mc.dtype, tc.grad_checkpointing)
    it["activations"] = per_token * tokens * (2 if held["critic"] else 1)
    notes["activations"] = (f"{tokens} tokens per micro-batch x {per_token / 2**10:.0f} KiB"
                            + (", checkpointed" if tc.grad_checkpointing else "")
                            + (", policy + critic" if held["critic"] else ""))
    if tc.remove_padding:  # eager/SDPA: the packed row's [N, N] block-diagonal mask (flash attention needs none)
        saved_in = (1 if tc.grad_checkpointing else shape.layers) * (2 if held["critic"] else 1)
        it["packed-row mask"] = float(tokens) ** 2 * (1 + compute * saved_in)
        notes["packed-row mask"] = (f"[{tokens}, {tokens}] booleans, and as {mc.dtype} saved for backward in "
                                    f"{saved_in} layer(s) (eager/SDPA attention)")
    _output_layer_term(plan, cfg, shape, tokens, rows, device)
    pooled = _generation_terms(plan, cfg, shape, rows)
    plan.phases["rollout"] = (static + (gathered if fsdp else copy) + it["KV cache"] + it["prefix store"],
                              "static + " + ("gathered weights" if fsdp else "compute copy")
                              + " + KV cache + prefix store")
    plan.phases["update"] = (static + copy + it["gradients"] + it["activations"] + it["output layer"]
                             + it.get("packed-row mask", 0.0) + (it["KV cache"] if pooled else 0.0),
                             "static + compute copy + gradients + activations + output layer"
                             + (" + packed-row mask" if tc.remove_padding else "") + (" + KV pool" if pooled else ""))
    if held["use_ref"] and (fsdp or tc.offload_reference):  # the whole reference on the device for its pass
        ref_bytes = held["ref_bytes"]
        visiting = ref_bytes if tc.offload_reference else ref_bytes * (shard - 1) / shard
        plan.phases["reference pass"] = (static + visiting, "static + the whole reference"
                                         + (" (brought from CPU memory)" if tc.offload_reference else " (gathered)"))
    # AdamW's foreach step allocates one temporary per trainable parameter (sqrt of the second moment)
    step_temp = 4 * (held["trainable"] + (P if held["critic"] else 0)) / shard
    plan.phases["optimizer step"] = (static + it["gradients"] + step_temp + (held["adam"] if tc.offload_optimizer else 0.0),
                                     "static + gradients + " + ("AdamW state + " if tc.offload_optimizer else "")
                                     + "AdamW's temporaries")
    plan.peak = max(value for value, _ in plan.phases.values())
    return plan


def _held_terms(plan: MemoryPlan, cfg: Config, shape: ModelShape, shard: int, fsdp: bool) -> dict:
    """What every phase holds: master weights, AdamW state, the reference, the critic."""
    mc, tc = cfg.model, cfg.train
    it, notes, P = plan.items, plan.notes, shape.params
    trainable = lora_params(shape, mc.lora_rank, mc.lora_targets) if mc.lora_rank > 0 else P
    it["master weights"] = 4 * (P + (trainable if mc.lora_rank > 0 else 0)) / shard
    notes["master weights"] = f"float32, {P / 1e9:.2f}B parameters" + (" (sharded)" if fsdp else "")
    critic = cfg.algo.advantage == "gae"
    adam = 8 * (trainable + (P if critic else 0)) / shard  # policy and critic
    it["AdamW state"] = 0.0 if tc.offload_optimizer else 8 * trainable / shard
    notes["AdamW state"] = f"{trainable / 1e6:.1f}M trainable parameters" + (
        "; offloaded: in CPU memory, on the device at the optimizer step only" if tc.offload_optimizer else "")
    # asynchronous rollouts: the rollout worker holds the reference (train/rollout_worker.py)
    kl_ref = cfg.algo.kl_coef > 0 and cfg.algo.kl_mode != "none" and mc.lora_rank == 0  # a reference is held
    use_ref = kl_ref and not cfg.rollout.async_steps
    ref_dtype = reference_dtype(mc)
    ref_bytes = DTYPE_BYTES[ref_dtype] * P  # the whole reference
    it["reference"] = ref_bytes / shard if use_ref and not tc.offload_reference else 0.0
    notes["reference"] = (f"frozen, {ref_dtype}" + ("; offloaded: in CPU memory, on the device for its pass only"
                                                   if tc.offload_reference else "")
                          if use_ref else "none (no KL term, LoRA: the base, or the rollout worker's)")
    if cfg.rollout.workers:  # train/rollout_ranks.py: N + 1 float32 copies of the weights on their way to the rollout rank
        it["weight buffers"] = (cfg.rollout.async_steps + 1) * 4 * P
        notes["weight buffers"] = f"{cfg.rollout.async_steps + 1} float32 copies sent to the rollout rank"
    elif cfg.rollout.async_steps:  # the worker beside the trainer (inline, or its process on the same device)
        worker_ref = ref_bytes if kl_ref else 0
        it["rollout worker"] = 4 * P + worker_ref  # whole, whatever the trainer's sharding (train/rollout_worker.py)
        notes["rollout worker"] = ("its float32 policy" + (f" and reference ({ref_dtype})" if worker_ref else "")
                                   + ", whole; its weight slots in host memory not counted")
    it["critic"] = (8 if tc.offload_optimizer else 16) * P / shard if critic else 0.0
    notes["critic"] = ("weights, gradients" + ("" if tc.offload_optimizer else ", AdamW state")) if critic else "none"
    return {"trainable": trainable, "critic": critic, "adam": adam, "use_ref": use_ref, "ref_bytes": ref_bytes}


def _output_layer_term(plan: MemoryPlan, cfg: Config, shape: ModelShape, tokens: int, rows: int, device: str) -> None:
    """The output layer of one micro-batch: chunked (a block of positions at a time) or full logits."""
    tc, rc, compute = cfg.train, cfg.rollout, DTYPE_BYTES[cfg.model.dtype]
    if not shape.chunked_head:
        plan.items["output layer"] = 20.0 * tokens * shape.vocab
        plan.notes["output layer"] = f"full logits, 20 B per token x {shape.vocab} vocabulary"
        return
    from sleuth.train.chunked_head import chunk_positions  # lazy: only for chunked heads

    chunk = min(chunk_positions(shape.vocab, device="cuda" if device.startswith("cuda") else "cpu"), tokens)
    # two [C, V] float32 blocks, the saved hidden states, the weight cast once to the compute dtype, and
    # when micro-batches accumulate, the weight gradient's float32 accumulator beside the gradient it
    # is added into (for the first micro-batch it becomes that gradient)
    head = shape.vocab * shape.hidden
    accumulates = rows > tc.micro_batch_size or rows * rc.max_context_tokens > tokens
    plan.items["output layer"] = (2 * 4 * chunk * shape.vocab + 4 * tokens * shape.hidden
                                  + (compute * head if compute != 4 else 0) + (4 * head if accumulates else 0))
    plan.notes["output layer"] = (f"chunked ({chunk} positions a block), recomputed in backward; its weight cast once"
                                  + ("; a float32 weight-gradient accumulator" if accumulates else ""))


def _generation_terms(plan: MemoryPlan, cfg: Config, shape: ModelShape, rows: int) -> bool:
    """The rollout's KV cache and prefix store; True when compiled hf_static keeps its pool through the update."""
    rc, mc = cfg.rollout, cfg.model
    it, notes = plan.items, plan.notes
    gen_rows = min(rc.max_concurrent_rows or rows, rows)
    pooled = rc.backend == "hf_static" and rc.hf_compile  # a persistent pool of the bucket's shape (rollout/hf_static)
    kv_rows, kv_width = gen_rows, rc.max_context_tokens
    if pooled:
        from sleuth.rollout.hf_static import bucket_shape  # lazy: only for compiled hf_static

        kv_rows, kv_width = bucket_shape(gen_rows, rc.max_context_tokens)
    # sliding-window layers keep all their keys/values in the HF backends' slot buffers (a mask per layer
    # kind, rollout/hf_cache); where those do not apply, at most their window (transformers' sliding layers)
    windowed = shape.sliding_layers if not shape.slot_cache else 0
    slots = (shape.layers - windowed) * kv_width + windowed * min(kv_width, shape.window or 0)
    it["KV cache"] = kv_rows * slots * 2 * shape.kv_dim * DTYPE_BYTES[mc.dtype]
    notes["KV cache"] = (f"{kv_rows} rows x {kv_width} tokens generating at once, K and V in {mc.dtype}"
                         + (f"; {windowed} of {shape.layers} layers keep a {shape.window}-token window"
                            if windowed else "")
                         + ("; compiled hf_static's pool, kept through the update" if pooled else ""))
    # HF backends, several rounds: each finished row's keys/values are copied out and kept for the next
    # round's prefill (rollout/hf_cache.PrefixStore) while the batch's cache still holds every row; at
    # the round boundary the store is still alive while the next round's buffers are assembled
    # (not where the backend cannot use slot buffers: rollout/hf_cache.supports_slot_cache, no prefix is reused)
    stored = rc.max_turns > 0 and rc.backend != "vllm" and shape.slot_cache
    it["prefix store"] = it["KV cache"] if stored else 0.0
    notes["prefix store"] = ("finished rows' keys/values kept for the next round (as large as the KV cache)"
                             if stored else "none (one round, vLLM, or a cache kind with no prefix reuse)")
    return pooled


def advice(plan: MemoryPlan, cfg: Config) -> str:
    """The settings that would lower the largest phase first, then the static terms."""
    tc = cfg.train
    worst = max(plan.phases, key=lambda name: plan.phases[name][0])
    tips = {
        "rollout": ["rollout.max_concurrent_rows (fewer rows generating at once)"],
        "update": (["train.grad_checkpointing=true"] if not tc.grad_checkpointing else [])
                  + ["a smaller train.max_tokens_per_micro_batch (or train.micro_batch_size)"],
        "reference pass": ["more GPUs under train.parallel=fsdp, or algo.kl_coef=0 (no reference)"],
        "optimizer step": ["more GPUs under train.parallel=fsdp (shards gradients and AdamW state)"],
    }[worst]
    if not tc.offload_optimizer and worst != "optimizer step":
        tips.append("train.offload_optimizer=true (AdamW state in CPU memory)")
    if plan.items.get("reference") and not tc.offload_reference:
        tips.append("train.offload_reference=true")
    if tc.parallel != "fsdp":
        tips.append("train.parallel=fsdp over more GPUs (shards weights, gradients, AdamW state)")
    if cfg.model.lora_rank == 0:
        tips.append("model.lora_rank (LoRA: no reference copy, small optimizer state)")
    if cfg.model.dtype == "float32":
        tips.append("model.dtype=bfloat16")
    return "; ".join(tips)


def check_plan(plan: MemoryPlan, cfg: Config) -> None:
    """Raise MemoryPlanError (naming what to change) when the peak does not fit the device."""
    if plan.fits():
        return
    gib = 2**30
    raise MemoryPlanError(
        f"the memory plan expects a peak of {plan.peak / gib:.2f} GiB per rank, more than "
        f"{(1 - FREE_SHARE) * plan.capacity / gib:.2f} GiB ({100 - 100 * FREE_SHARE:.0f}% of the "
        f"{plan.capacity / gib:.2f} GiB of {plan.device}).\n{plan.table()}\nTry: {advice(plan, cfg)}. "
        "To run anyway: --set train.memory_check=false")


def plan_for(cfg: Config, world_size: int, device: torch.device) -> MemoryPlan:
    """The plan of ``cfg`` on ``device`` (its capacity read from the device)."""
    name = f"{device.type}" + (f":{torch.cuda.get_device_name(device)}" if device.type == "cuda" else " RAM")
    return make_plan(cfg, load_shape(cfg), world_size=world_size, capacity=device_capacity(device), device=name)


def check_memory(cfg: Config, ctx) -> MemoryPlan | None:
    """At the start of ``sleuth train``: the plan for this rank's device, printed by rank 0; raises
    MemoryPlanError when it does not fit (unless ``train.memory_check`` is false). A model whose shape
    cannot be read without its weights gets a warning and no plan."""
    import sys

    from sleuth.models import pick_device  # lazy: transformers only when a plan is made

    device = torch.device("cuda", ctx.local_rank) if ctx.enabled and torch.cuda.is_available() \
        else pick_device(cfg.model.device)
    try:
        plan = plan_for(cfg, ctx.world_size, device)
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as e:
        if ctx.is_main:
            print(f"warning: no memory plan for {cfg.model.name_or_path!r} ({type(e).__name__}: {e})", file=sys.stderr)
        return None
    if ctx.is_main:
        print(plan.table())
    if cfg.train.memory_check and cfg.train.max_tokens_per_micro_batch is not None:
        check_plan(plan, cfg)  # without a token budget the activations are a worst case (every row at full context)
    elif not plan.fits() and ctx.is_main:
        print(f"warning: the worst case (every row at rollout.max_context_tokens) may not fit; set "
              f"train.max_tokens_per_micro_batch to bound it. {advice(plan, cfg)}")
    return plan
