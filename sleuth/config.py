"""One dataclass tree for every setting of a run; YAML in and out; ``--set dotted.key=value``.

No interpolation, no composition: a config is one YAML file whose keys mirror these dataclasses,
plus command-line overrides. Unknown keys and wrongly typed values are errors that name the key.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass
class ModelConfig:
    name_or_path: str = "tiny"
    """Hub name, local directory, training checkpoint, or ``.gguf`` file; ``tiny`` = embedded model."""
    gguf_file: str | None = None
    """File name inside ``name_or_path`` to load with ``gguf_file=`` (set automatically for .gguf paths)."""
    dtype: str = "float32"
    """Compute dtype: float32, bfloat16 or float16. Training keeps float32 master weights and AdamW
    state and runs every forward (rollout, logprobs, update) under autocast in this dtype; the frozen
    reference is held in it; checkpoints hold the float32 weights. eval/ask load the weights in it.
    float16 has no loss scaling here: prefer bfloat16."""
    device: str = "auto"
    """``auto`` picks cuda when available, else cpu."""
    lora_rank: int = 0
    """> 0 trains LoRA adapters (peft) instead of all weights; the reference is the base model
    with the adapters disabled (no second copy in memory)."""
    lora_alpha: float = 32.0
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Module names that get adapters."""


@dataclass
class DataConfig:
    train_files: list[str] = field(default_factory=list)
    """QA files for training (FlashRAG jsonl, json list, or Search-R1 parquet); ``world:train`` is
    the embedded toy world's train split."""
    eval_files: list[str] = field(default_factory=list)
    """QA files for evaluation during and after training (``world:test`` for the toy world)."""
    world_seed: int = 0
    """Seed of the embedded toy world used by ``world:*`` files and ``retrieval.corpus: world``."""
    world_entities: int = 600
    """Size of the embedded toy world (entities; ``generate_world(n_entities=...)``)."""
    limit: int | None = None
    """Use the first N questions of each data source of each file, in file order (None = all); a
    merged file such as Search-R1's test.parquet gives N of each of its datasets."""
    shuffle: bool = True
    """Shuffle training questions each epoch (seeded by train.seed)."""


@dataclass
class RetrievalConfig:
    kind: str = "bm25"
    """bm25 | dense | hybrid | url | memory."""
    index_dir: str | None = None
    """Directory written by ``sleuth index build``."""
    corpus: str | None = None
    """Corpus jsonl indexed with BM25 on the fly (cached) when no index_dir is given; ``world`` is
    the embedded toy world's corpus."""
    url: str | None = None
    """Search-R1 ``/retrieve`` endpoint when kind=url."""
    topk: int = 3
    """Passages returned per query."""
    timeout_s: float = 30.0
    """Client timeout per request."""
    retries: int = 3
    """Client retries with exponential backoff before a retrieval error."""
    retry_for_s: float = 120.0
    """kind=url: a server that has answered before and then fails (a restart, an overload) is
    retried with backoff (at most 8 s apart) for up to this many seconds before the search counts
    as failed. A server that never answered fails after ``retries`` (the start-up check is quick)."""
    cache_size: int = 10000
    """LRU entries of (query, k) -> passages kept by the client."""
    query_prefix: str | None = None
    """Dense query prefix instead of the one the index_dir was built with (a warning when they
    differ); None: the index's own (e.g. ``"query: "`` for e5, recorded at build)."""
    passage_prefix: str | None = None
    """When set, refuse a dense index_dir built with another passage prefix; None: no check."""


@dataclass
class RolloutConfig:
    format: str = "search_r1"
    """Protocol format: search_r1 | r1_searcher | tool_call | search_r1_tiny (short prompt of the
    embedded tiny model)."""
    group_size: int = 5
    """G: samples per question."""
    max_turns: int = 4
    """Searches executed at most; then one final round in which searching is not executed."""
    max_tokens_per_turn: int = 500
    """Tokens the policy may sample in one turn."""
    max_obs_tokens: int = 512
    """Tokens of one rendered observation (passages truncated, closing tag kept)."""
    max_context_tokens: int = 4096
    """Total tokens of prompt + response; the prompt is never cut, the trajectory stops instead."""
    max_invalid: int = 2
    """Invalid turns tolerated (each answered with the corrective message) before stopping."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    use_chat_template: bool = True
    """Apply the tokenizer's chat template when it has one; raw text otherwise."""
    final_nudge: str = ""
    """Text injected before the final no-search round (empty = none)."""
    backend: str = "hf"
    """Engine for training rollouts: hf (transformers, our batched decode loop) | vllm (an
    in-process vLLM engine on the trainer's GPU, ``pip install 'sleuth[gpu]'``; one process only;
    the trainer's weights are pushed into it after every update; its logprobs feed
    ``algo.tis_cap``). Evaluation always uses the hf backend."""
    vllm_gpu_memory_utilization: float = 0.3
    """Share of the GPU's memory vLLM may take (its weights + KV cache); the trainer shares the GPU."""
    vllm_enforce_eager: bool = False
    """Run vLLM without CUDA graphs (faster start, slower decode)."""


@dataclass
class RewardConfig:
    kind: str = "em"
    """em | f1 | cover_em | search_r1_v03 | r1_searcher_stage1 | r1_searcher_stage2."""
    format_score: float = 0.0
    """lambda_format of the Search-R1 v0.3 composite."""
    retrieval_score: float = 0.0
    """lambda_retrieval of the Search-R1 v0.3 composite."""
    final_format_score: float = 0.0
    """Reward for a well-formed response with a wrong answer (Search-R1 v0.3)."""


@dataclass
class AlgoConfig:
    advantage: str = "grpo"
    """grpo | drgrpo | rloo | reinforce_pp | gae."""
    clip_low: float = 0.2
    clip_high: float = 0.2
    """Upper clip (clip-higher when > clip_low)."""
    dual_clip: float | None = None
    """Dual-clip constant c (> 1) for negative advantages; None disables."""
    kl_coef: float = 0.001
    kl_estimator: str = "k3"
    """k1 | k2 | k3 (low-variance)."""
    kl_mode: str = "loss"
    """loss (added to the policy loss) | reward (folded into the reward) | none."""
    entropy_coef: float = 0.0
    loss_agg: str = "token_mean"
    """token_mean | seq_mean_token_mean | seq_sum_norm."""
    tis_cap: float | None = None
    """Truncated importance sampling cap on trainer/sampler probability ratios; None disables."""
    gamma: float = 1.0
    lam: float = 1.0
    value_clip: float = 0.5


@dataclass
class TrainConfig:
    total_steps: int = 100
    questions_per_step: int = 8
    """Q: questions per step (rows B = Q * G)."""
    lr: float = 1e-6
    critic_lr: float = 1e-5
    warmup_steps: int = 0
    schedule: str = "constant"
    """constant | cosine (after warm-up)."""
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    micro_batch_size: int = 8
    """Rows per forward/backward; gradients are accumulated over micro-batches."""
    mini_batches: int = 1
    """Optimizer steps per rollout batch (PPO mini-batches)."""
    epochs: int = 1
    """Passes over each rollout batch (PPO epochs)."""
    grad_checkpointing: bool = False
    parallel: str = "ddp"
    """Data parallelism under ``torchrun`` (ignored in one process): ``ddp`` (a full replica per
    rank) or ``fsdp`` (FSDP2: parameters, gradients and optimizer state sharded per decoder block,
    for models that do not fit one device; checkpoints stay plain ``save_pretrained`` directories)."""
    cpu_threads: int | None = None
    """torch intra-op threads when the model runs on CPU (None = torch's default, one per core).
    Small models run faster on 1, much faster on a shared machine (torchrun already sets 1)."""
    save_every: int = 0
    """Checkpoint every N steps (0 = only at the end)."""
    eval_every: int = 0
    """Evaluate every N steps (0 = only at the end)."""
    eval_limit: int | None = None
    """Evaluate during training on the first N questions of each data source of each eval file
    (None = all)."""
    keep_checkpoints: int = 2
    """Complete checkpoints kept on disk (older ones are deleted)."""
    on_collapse: str = "warn"
    """What the collapse watch does: warn | stop | rollback (to the last good checkpoint)."""
    seed: int = 0
    tensorboard: bool = False
    wandb: bool = False


@dataclass
class EvalConfig:
    greedy: bool = True
    limit: int | None = None
    batch_size: int = 64


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


class ConfigError(ValueError):
    """A config key or value is wrong; the message names it."""


# The values each string setting takes, and the least value of each number (None = "off"/"all",
# never checked). ``validate`` checks them once, when a config is built from YAML or --set, so a
# wrong value fails before any model is loaded, naming the key, not deep inside a run. Where a
# component keeps a registry of its names, the choices are read from it (``_choices``).
FIXED_CHOICES = {
    "retrieval.kind": ("bm25", "dense", "hybrid", "url", "memory"),
    "rollout.backend": ("hf", "vllm"),
    "algo.kl_mode": ("loss", "reward", "none"),
    "train.schedule": ("constant", "cosine"),
    "train.parallel": ("ddp", "fsdp"),
    "train.on_collapse": ("warn", "stop", "rollback"),
}


def _choices() -> dict[str, tuple]:
    """FIXED_CHOICES plus the names the components register (imported here, when a config is checked)."""
    from sleuth.algo.aggregate import LOSS_AGGREGATIONS
    from sleuth.algo.kl import KL_ESTIMATORS
    from sleuth.reward import REWARD_KINDS
    from sleuth.rollout.formats import FORMATS
    from sleuth.train.models import DTYPES
    from sleuth.train.update import ADVANTAGES

    return {**FIXED_CHOICES, "model.dtype": tuple(DTYPES), "reward.kind": tuple(REWARD_KINDS),
            "rollout.format": (*FORMATS, *(() if "search_r1_tiny" in FORMATS else ("search_r1_tiny",))),
            "algo.advantage": tuple(ADVANTAGES), "algo.kl_estimator": tuple(KL_ESTIMATORS),
            "algo.loss_agg": tuple(LOSS_AGGREGATIONS)}


AT_LEAST = {
    "data.limit": 1, "retrieval.topk": 1, "retrieval.retries": 0, "retrieval.retry_for_s": 0,
    "retrieval.cache_size": 0,
    "rollout.group_size": 1, "rollout.max_turns": 0, "rollout.max_tokens_per_turn": 1, "rollout.max_obs_tokens": 1,
    "rollout.max_context_tokens": 1, "rollout.max_invalid": 0, "rollout.temperature": 0, "rollout.top_k": 0,
    "algo.clip_low": 0, "algo.clip_high": 0, "algo.kl_coef": 0, "train.total_steps": 1,
    "train.questions_per_step": 1, "train.lr": 0, "train.critic_lr": 0, "train.warmup_steps": 0,
    "train.weight_decay": 0, "train.grad_clip": 0, "train.micro_batch_size": 1, "train.mini_batches": 1,
    "train.epochs": 1, "train.cpu_threads": 1, "train.save_every": 0, "train.eval_every": 0, "train.eval_limit": 1,
    "train.keep_checkpoints": 1, "eval.limit": 1, "eval.batch_size": 1,
}
ABOVE = {"retrieval.timeout_s": 0, "rollout.top_p": 0, "algo.tis_cap": 0, "algo.dual_clip": 1}


def validate(cfg: Config) -> Config:
    """Check every setting named in the choices / AT_LEAST / ABOVE; raise ConfigError naming the first bad one."""
    def get(key: str):
        section, name = key.split(".")
        return getattr(getattr(cfg, section), name)

    for key, choices in _choices().items():
        if get(key) not in choices:
            raise ConfigError(f"{key}: {get(key)!r} is not one of {list(choices)}")
    for key, least in AT_LEAST.items():
        if get(key) is not None and get(key) < least:
            raise ConfigError(f"{key} must be >= {least}, got {get(key)!r}")
    for key, bound in ABOVE.items():
        if get(key) is not None and get(key) <= bound:
            raise ConfigError(f"{key} must be > {bound}, got {get(key)!r}")
    if cfg.rollout.top_p > 1:
        raise ConfigError(f"rollout.top_p must be in (0, 1], got {cfg.rollout.top_p!r}")
    return cfg


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check/convert ``value`` against the annotation ``tp``; raise ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}")
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        number = _number(value)
        if isinstance(number, int):
            return number
        if isinstance(number, float) and number.is_integer():
            return int(number)  # 1e3, 1000.0
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        number = _number(value)
        if number is not None and math.isfinite(number):
            return float(number)
        raise ConfigError(f"{key}: expected a finite number (e.g. 1e-6, 0.001, 3), got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported type {tp}")


def _number(value: Any) -> int | float | None:
    """``value`` as a number: ints and floats as they are, and numeric strings in the usual spellings
    (``1e-6``, ``1E-6``, ``5e3``, ``1_000``, ``.5``, ``+2``), which YAML 1.1 (PyYAML) reads as strings
    when the mantissa has no dot. None for anything else (booleans included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if not isinstance(value, str):
        return None
    text = value.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_dict(data: dict[str, Any], cls: type = Config, prefix: str = "") -> Any:
    """Build a config dataclass from a nested dict, checking every key and type."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}")
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"unknown config key {full!r}; valid keys here: {sorted(names)}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = from_dict(value, tp, prefix=f"{full}.")
        else:
            kwargs[key] = _coerce(value, tp, full)
    built = cls(**kwargs)
    return validate(built) if cls is Config else built


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Apply ``dotted.key=value`` strings (values parsed as YAML scalars/lists)."""
    data = to_dict(cfg)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like dotted.key=value")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        node = data
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                raise ConfigError(f"unknown config section {p!r} in override {item!r}")
            node = node[p]
        if parts[-1] not in node:
            raise ConfigError(f"unknown config key {key!r} in override {item!r}; valid keys: {sorted(node)}")
        try:
            node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: value is not valid YAML ({e})") from e
    return from_dict(data)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML file (or the defaults when None) and apply overrides."""
    cfg = Config()
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist")
        if not p.is_file():
            raise ConfigError(f"config file {p} is a directory; give a YAML file (see configs/)")
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {e}") from e
        except UnicodeDecodeError as e:
            raise ConfigError(f"config file {p} is not UTF-8 text (byte {e.start}); save it as UTF-8 YAML") from None
        cfg = from_dict(data)
    return apply_overrides(cfg, overrides or [])


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
