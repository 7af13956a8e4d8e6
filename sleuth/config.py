"""One dataclass tree for every setting of a run (YAML in and out, ``--set dotted.key=value`` and the
check: :mod:`sleuth.config_file`).

No interpolation, no composition: a config is one YAML file whose keys mirror these dataclasses, plus
command-line overrides. The dataclasses are plain data (building one in code checks nothing); pydantic checks
a config read from YAML or --set, or given to ``validate``, against the annotations: ``Literal`` choices, bounds
as ``Field`` metadata. A wrong key or value is a ConfigError (:mod:`sleuth.config_file`) naming the key. The choices mirror the components'
registries (formats, reward kinds, ...): ``tests/unit/test_config_registries.py`` keeps them equal.
"""

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, with_config


def _number(value: Any) -> Any:
    """PyYAML (YAML 1.1) reads ``1e-6`` and ``1e3`` as strings: a string in Python's spellings (``1e-6``, ``5e3``,
    ``1_000``, ``.5``, ``+2``) becomes a number (pydantic takes an integral float for an int); true/false is no
    number (pydantic would take it as 1/0)."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    if isinstance(value, str):
        for parse in (int, float):
            try:
                return parse(value.strip())
            except ValueError:
                pass
    return value


Int = Annotated[int, BeforeValidator(_number)]
Float = Annotated[float, BeforeValidator(_number)]  # finite: allow_inf_nan=False below
Bool = Annotated[bool, Field(strict=True)]  # only true/false, not 1 or "yes"
Names = Annotated[list[str], BeforeValidator(lambda v: [v] if type(v) in (str, int, float) else v)]  # a = [a]

_RULES = ConfigDict(extra="forbid", allow_inf_nan=False, coerce_numbers_to_str=True, use_attribute_docstrings=True)


def _section(cls: type) -> type:
    return with_config(_RULES)(dataclass(cls))


@_section
class ModelConfig:
    name_or_path: str = "tiny"
    """Hub name, local directory, training checkpoint, or ``.gguf`` file; ``tiny`` = embedded model."""
    gguf_file: str | None = None
    """File name inside ``name_or_path`` to load with ``gguf_file=`` (set automatically for .gguf paths)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Compute dtype. Training keeps float32 master weights and AdamW state and runs every forward (rollout,
    logprobs, update) under autocast in this dtype (the frozen reference: ``reference_dtype``); checkpoints hold the
    float32 weights. eval/ask load the weights in it. float16 has no loss scaling here: prefer bfloat16."""
    reference_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The frozen reference's weights. ``auto``: float32, as the policy's master weights, so the reference
    computes what the policy computes and the KL is 0 at step 0 (held in bfloat16 while the policy runs
    float32 weights under bf16 autocast, the two round differently: k3 KL 0.0028 at step 0 on SmolLM2, an H100,
    2026-11-27). ``bfloat16`` halves its memory at that price."""
    device: str = "auto"
    """``auto`` picks cuda when available, else cpu."""
    lora_rank: Int = 0
    """> 0 trains LoRA adapters (peft) instead of all weights; the reference is the base model with the adapters
    disabled (no second copy in memory)."""
    lora_alpha: Float = 32.0
    """LoRA scaling alpha (the adapters' update is scaled by alpha / rank); used when lora_rank > 0."""
    lora_targets: Names = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Module names that get adapters."""


@_section
class DataConfig:
    train_files: Names = field(default_factory=list)
    """QA files for training (FlashRAG jsonl, json list, or Search-R1 parquet); ``world:train`` is the embedded
    toy world's train split."""
    eval_files: Names = field(default_factory=list)
    """QA files for evaluation during and after training (``world:test`` for the toy world)."""
    world_seed: Int = 0
    """Seed of the embedded toy world used by ``world:*`` files and ``retrieval.corpus: world``."""
    world_entities: Int = 600
    """Size of the embedded toy world (entities; ``generate_world(n_entities=...)``)."""
    limit: Annotated[Int | None, Field(ge=1)] = None
    """Use the first N questions of each data source of each file, in file order (None = all); a merged file
    such as Search-R1's test.parquet gives N of each of its datasets."""
    shuffle: Bool = True
    """Shuffle training questions each epoch (seeded by train.seed)."""


@_section
class RetrievalConfig:
    kind: Literal["bm25", "dense", "hybrid", "url", "memory", "web"] = "bm25"
    """url: the server at ``url``. web: a web search API (``web_provider``; its key from the environment). With
    ``index_dir``: bm25 or dense opens that side of a (hybrid) index, others open it as built. With ``corpus``:
    memory scores term overlap in memory (tests, toy worlds), others BM25."""
    index_dir: str | None = None
    """Directory written by ``sleuth index build``."""
    corpus: str | None = None
    """Corpus jsonl indexed with BM25 on the fly (cached) when no index_dir is given; ``world`` is the embedded
    toy world's corpus."""
    url: str | None = None
    """Search-R1 ``/retrieve`` endpoint when kind=url."""
    web_provider: Literal["serper", "serpapi", "brave"] = "serper"
    """kind=web: the search API, its key read from ``SERPER_API_KEY``, ``SERPAPI_API_KEY`` or ``BRAVE_API_KEY``.
    Passages are the results' titles and snippets (``sleuth.retrieval.web``)."""
    web_base_url: str | None = None
    """kind=web: another address for the provider's API (a proxy, or a local stand-in); None: the provider's own."""
    topk: Annotated[Int, Field(ge=1)] = 3
    """Passages returned per query."""
    timeout_s: Annotated[Float, Field(gt=0)] = 30.0
    """Client timeout per request."""
    retries: Annotated[Int, Field(ge=0)] = 3
    """Client retries with exponential backoff before a retrieval error."""
    retry_for_s: Annotated[Float, Field(ge=0)] = 120.0
    """kind=url: a server that has answered before and then fails (a restart, an overload) is retried with
    backoff (at most 8 s apart) for up to this many seconds before the search counts as failed. A server that
    never answered fails after ``retries`` (the start-up check is quick)."""
    cache_size: Annotated[Int, Field(ge=0)] = 10000
    """LRU entries of (query, k) -> passages kept by the client."""
    query_prefix: str | None = None
    """Dense query prefix instead of the one the index_dir was built with (a warning when they differ); None: the
    index's own (e.g. ``"query: "`` for e5, recorded at build)."""
    passage_prefix: str | None = None
    """When set, refuse a dense index_dir built with another passage prefix; None: no check."""


@_section
class RolloutConfig:
    format: Literal["search_r1", "r1_searcher", "tool_call", "r1_searcher_base", "search_r1_fewshot",
                    "search_r1_fewshot_verbatim", "search_r1_fewshot3", "search_r1_fewshot3_restate",
                    "search_r1_fewshot3_reask", "search_r1_tiny"] = "search_r1"
    """Protocol format; search_r1_tiny is the short prompt of the embedded tiny model, r1_searcher_base
    R1-Searcher's prompt for base models (plain text ending ``Assistant: <think>``), search_r1_fewshot Search-R1's
    instruction with one worked example (a real query, its passage, an answer) before the question,
    search_r1_fewshot_verbatim the same whose example searches for its question as written, search_r1_fewshot3 the
    same with three examples (short answers: a place, a person, a year), search_r1_fewshot3_restate the same whose
    examples restate their question after the passages, before answering, search_r1_fewshot3_reask the same whose
    observations end with the question asked again (inside the information block)."""
    group_size: Annotated[Int, Field(ge=1)] = 5
    """G: samples per question."""
    max_turns: Annotated[Int, Field(ge=0)] = 4
    """Searches executed at most; then one final round in which searching is not executed."""
    max_tokens_per_turn: Annotated[Int, Field(ge=1)] = 500
    """Tokens the policy may sample in one turn."""
    max_obs_tokens: Annotated[Int, Field(ge=1)] = 512
    """Tokens of one rendered observation (passages truncated, closing tag kept)."""
    max_context_tokens: Annotated[Int, Field(ge=1)] = 4096
    """Total tokens of prompt + response; the prompt is never cut, the trajectory stops instead."""
    max_concurrent_rows: Annotated[Int | None, Field(ge=1)] = None
    """At most this many rows generate at once on each rank (with the HF backend: hold a KV cache at once); the
    rows go through the multi-turn loop in shares of this size (None: all rows of the step at once). Bounds
    generation memory: KV bytes = rows x context tokens x 2 x layers x kv_heads x head_dim x dtype bytes."""
    max_invalid: Annotated[Int, Field(ge=0)] = 2
    """Invalid turns tolerated (each answered with the corrective message) before stopping."""
    temperature: Annotated[Float, Field(ge=0)] = 1.0
    """Sampling temperature, also applied to the logits of the update's logprobs; 0 = greedy."""
    top_p: Annotated[Float, Field(gt=0, le=1)] = 1.0
    """Nucleus sampling: keep the most likely tokens up to this probability mass; 1 disables."""
    top_k: Annotated[Int, Field(ge=0)] = 0
    """Sample from the k most likely tokens only; 0 disables."""
    use_chat_template: Bool = True
    """Apply the tokenizer's chat template when it has one; raw text otherwise."""
    final_nudge: str = ""
    """Text injected before the final no-search round (empty = none)."""
    backend: Literal["hf", "hf_static", "vllm"] = "hf"
    """Engine for training rollouts: hf (transformers, our batched decode loop; the default: fastest measured on
    CPU, works for every model) | hf_static (the same loop with a static KV cache, sampling on the device and a
    host sync every ``hf_sync_every`` tokens, optionally compiled: meant for GPUs, where per-token launches and
    syncs dominate a small model's decode; greedy outputs equal hf's, samples are another random stream; models
    with plain full-attention caches only) | vllm (a vLLM engine in the trainer's process, on its GPU, ``pip
    install 'sleuth[gpu]'``; under torchrun one engine per rank, vLLM's external launcher mode; the trainer's
    weights are pushed into it after every update; its logprobs feed ``algo.tis_cap``; the run's evaluations use it
    too when ``vllm_tensor_parallel_size`` is 1). docs/benchmarks.md has what was measured."""
    hf_compile: Bool = False
    """hf_static: run the decode step through ``torch.compile`` (on CUDA with CUDA graphs, mode reduce-overhead)
    over a persistent KV pool at bucketed shapes (batch rounded up to a power of two, width to a multiple of
    256 slots), so it compiles once per bucket met (seconds to minutes each), not once per call; the pool
    holds the K/V of the largest bucket met. Measured slower on a 2-core CPU; not yet measured on a GPU."""
    hf_sync_every: Annotated[Int | None, Field(ge=1)] = None
    """hf_static: tokens decoded between host synchronisations (None: 8 on CUDA, 1 on CPU)."""
    vllm_gpu_memory_utilization: Float = 0.3
    """Share of the GPU's memory vLLM may take (its weights + KV cache); the trainer shares the GPU."""
    vllm_enforce_eager: Bool = False
    """Run vLLM without CUDA graphs (faster start, slower decode)."""
    vllm_tensor_parallel_size: Annotated[Int, Field(ge=1)] = 1
    """Ranks that hold one engine together (tensor parallel; under torchrun, must divide the world size). The ranks
    of a group generate their questions together (every rank of the group submits the same prompts) and each keeps
    its own share."""
    async_steps: Annotated[Int, Field(ge=0)] = 0
    """Asynchronous rollouts: a rollout worker generates step ``t + N`` while the trainer learns from step ``t``
    (batch ``t`` sampled by the weights of update ``t - 1 - N``), the weights published to it after every update;
    the update recomputes the old logprobs with the current weights and ``algo.tis_cap`` corrects for the sampler's
    (sleuth.train.async_rollout). 0: synchronous, the loop as it always was. Under torchrun only with ``workers``."""
    async_worker: Literal["process", "inline"] = "process"
    """async_steps > 0: ``process`` spawns the worker (its own threads, ``async_threads``, or its own copy on the
    device); ``inline`` runs the same schedule in the trainer's process with no overlap (a reference for tests and
    a way to debug)."""
    async_threads: Annotated[Int | None, Field(ge=1)] = None
    """async_worker=process on CPU: the worker's torch threads (None: half of ``train.cpu_threads`` or of torch's);
    the trainer keeps the rest, at least one."""
    workers: Annotated[Int, Field(ge=0)] = 0
    """async_steps > 0 under torchrun: the last ``workers`` ranks generate and the first ``workers`` train (verl's
    one-step-off split; launch ``2 x workers`` ranks): rollout rank ``i`` collects what training rank ``i`` would
    have, the weights broadcast to it after every update (gloo on CPU, NCCL on GPU; sleuth.train.rollout_ranks).
    0: no split (asynchronous rollouts then run in one process)."""
    vllm_sleep: Bool = True
    """Put the engine to sleep after each rollout (its weights and KV cache freed: memory for the update) and wake
    it with the updated weights (vLLM sleep mode, level 2)."""


@_section
class RewardConfig:
    kind: Literal["em", "f1", "cover_em", "search_r1_v03", "search_r1_stage1", "r1_searcher_stage1",
                  "r1_searcher_stage2"] = "em"
    """Reward function of a trajectory (``sleuth.reward``)."""
    format_score: Float = 0.0
    """lambda_format of the Search-R1 v0.3 composite."""
    retrieval_score: Float = 0.0
    """lambda_retrieval of the Search-R1 v0.3 composite."""
    final_format_score: Float = 0.0
    """Reward for a wrong answer in a response that is *not* well-formed (Search-R1 v0.3's last branch)."""
    answer_metric: Literal["em", "f1"] = "em"
    """How ``search_r1_v03`` judges the answer: em (Search-R1's) or f1, the answer's token F1 paying its share of
    the way from the wrong-answer branch to the exact-match one (a sentence holding the gold answer earns part)."""
    format_requires_search: Bool = False
    """``search_r1_v03`` pays its shaped terms (format_score, retrieval_score, final_format_score) only to a
    response that made a search answered by passages; one without earns its answer only (exact match, else 0)."""
    answer_requires_search: Bool = False
    """``search_r1_v03`` pays a right answer (``score``, or its F1 share) only to a response that made a search
    answered by passages; one without is paid as a wrong answer. With the shaped terms at 0 the reward is then
    an exact match after a search, else 0: a right closed-book guess earns nothing."""
    read_corrective: Bool = True
    """Whether the reward reads the invalid-action messages the environment injects, as Search-R1 does. Their
    text holds ``<answer> and </answer>``, so a response of invalid actions "answers" ``and``: a wrong answer in
    an invalid format, ``final_format_score`` under ``search_r1_v03``, which a base model learns to collect by
    writing invalid actions (Gemma-3-270M did within 6 steps, docs/results.md). False: the reward reads the
    policy's turns and the observations only."""
    search_cost: Annotated[Float, Field(ge=0)] = 0.0
    """Subtracted from a trajectory's reward per search it executed, so budget-aware policies can be trained
    (``rollout/searches_mean`` and eval's searches per question report the spend). 0: searches are free."""


@_section
class AlgoConfig:
    advantage: Literal["grpo", "drgrpo", "rloo", "reinforce_pp", "gae"] = "grpo"
    """Advantage estimator; gae trains a critic (a second copy of the model)."""
    clip_low: Annotated[Float, Field(ge=0)] = 0.2
    """Lower clip: the probability ratio is clipped to [1 - clip_low, 1 + clip_high]."""
    clip_high: Annotated[Float, Field(ge=0)] = 0.2
    """Upper clip (clip-higher when > clip_low)."""
    dual_clip: Annotated[Float | None, Field(gt=1)] = None
    """Dual-clip constant c (> 1) for negative advantages; None disables."""
    kl_coef: Annotated[Float, Field(ge=0)] = 0.001
    """Weight of the KL to the frozen reference (see kl_mode); 0 disables it and no reference is kept."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator; k3 is low-variance."""
    kl_mode: Literal["loss", "reward", "none"] = "loss"
    """loss (added to the policy loss) | reward (folded into the reward) | none."""
    entropy_coef: Float = 0.0
    """Weight of the entropy bonus (-coef * entropy added to the loss; 0 = none)."""
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_sum_norm"] = "token_mean"
    """How per-token losses are reduced to one loss."""
    tis_cap: Annotated[Float | None, Field(gt=0)] = None
    """Truncated importance sampling cap on trainer/sampler probability ratios; None disables."""
    guide_coef: Annotated[Float, Field(ge=0)] = 0.0
    """Guided updates for small models (a departure from GRPO; DGPO, David-GRPO): for a group whose every sample
    is wrong (exact match 0) and whose question has a transcript in ``guide_files``, the step adds this times the
    transcript's supervised loss (SFT's masks; token mean over the step's guide tokens). 0: off."""
    guide_files: Names = field(default_factory=list)
    """guide_coef > 0: gold transcripts (``sleuth sft``'s ``transcripts.jsonl``, or any JSONL of transcripts),
    matched to questions by id."""
    gamma: Float = 1.0
    """Discount per sampled token of reinforce_pp and gae returns."""
    lam: Float = 1.0
    """GAE lambda (advantage=gae)."""
    value_clip: Float = 0.5
    """Clip of the critic's values around the old ones in the value loss (advantage=gae)."""


@_section
class TrainConfig:
    total_steps: Annotated[Int, Field(ge=1)] = 100
    """RL steps (each: rollouts, then an update); the cosine schedule ends here."""
    questions_per_step: Annotated[Int, Field(ge=1)] = 8
    """Q: questions per step, over all ranks (rows B = Q * G; under torchrun each rank rolls out and trains Q / N
    of them, whole groups)."""
    lr: Annotated[Float, Field(ge=0)] = 1e-6
    """AdamW learning rate of the policy (after warm-up, before decay)."""
    critic_lr: Annotated[Float, Field(ge=0)] = 1e-5
    """AdamW learning rate of the critic (advantage=gae)."""
    critic_lr_warmup_steps: Annotated[Int, Field(ge=0)] = 0
    """Updates of linear learning-rate warm-up of the critic, constant after (Search-R1's PPO: 15, from
    ``critic.optim.lr_warmup_steps_ratio=0.015``); 0 = none."""
    warmup_steps: Annotated[Int, Field(ge=0)] = 0
    """Steps of linear learning-rate warm-up (0 = none)."""
    warmup_from_zero: Bool = False
    """Warm-up from rate 0: the k-th update runs at (k - 1) / warmup_steps of the rate (verl's and Search-R1's
    ``get_constant_schedule_with_warmup``) instead of k / warmup_steps. Applies to the critic's warm-up too."""
    schedule: Literal["constant", "cosine"] = "constant"
    """Learning rate after warm-up: constant, or cosine decay to 0 at total_steps."""
    weight_decay: Annotated[Float, Field(ge=0)] = 0.0
    """AdamW weight decay (policy and critic)."""
    grad_clip: Annotated[Float, Field(ge=0)] = 1.0
    """Gradient norm clipped to this before each optimizer step; 0 disables."""
    micro_batch_size: Annotated[Int, Field(ge=1)] = 8
    """Rows per forward/backward on each rank (Search-R1's global micro-batch of 64 on 8 GPUs is 8 here);
    gradients are accumulated over micro-batches. Also caps the no-grad passes (old policy, reference, critic)."""
    max_tokens_per_micro_batch: Annotated[Int | None, Field(ge=1)] = None
    """Token budget of a micro-batch on each rank, padding included (rows x the longest row's length): rows,
    longest first, join a micro-batch while it stays within both this and ``micro_batch_size``; a row longer than
    the budget goes alone. Bounds the update's activation memory whatever the rows' lengths (verl's
    ``ppo_max_token_len_per_gpu``). None: ``micro_batch_size`` rows alone."""
    remove_padding: Bool = False
    """Run each micro-batch (update, and the no-gradient passes: old policy, reference, critic) as one row without
    padding: its rows concatenated, position ids restarting at each row, attention kept within each row (verl's
    ``use_remove_padding``). The layers outside attention compute no padding, and ``max_tokens_per_micro_batch``
    counts real tokens. Attention: flash-attention kernels run each row on its own; eager and SDPA (the default
    attention here) compute the whole packed row against a block-diagonal [N, N] mask, so their attention cost
    grows with the square of the packed length: worth it for rows of very different lengths, not for long
    micro-batches of similar rows. For the Llama, Mistral, Qwen2/Qwen3, SmolLM3 and OLMo2 families; other models run
    padded, with a warning."""
    share_prefix: Bool = False
    """Run the leading tokens a micro-batch's rows have in common once (update, old-policy and reference passes):
    rows are grouped by their tokens (a GRPO group's samples share the prompt and, when they search alike, the
    first turns and their ``<information>``), the common part runs as one row whose KV cache the rows' own
    tokens then attend to. The same logprobs and gradients to float rounding; much less compute when samples
    share long prefixes (``perf/computed_token_share`` reports the slots computed per real token). For CPUs: on
    an H100 it made the update 12x slower (many small micro-batches; docs/training.md).
    ``max_tokens_per_micro_batch`` counts computed slots. Single process only (not under torchrun), not with
    ``remove_padding`` or ``grad_checkpointing``, for models whose KV cache is plain full attention (others: a
    warning, the micro-batches run whole); a critic's passes run whole."""
    mini_batches: Annotated[Int, Field(ge=1)] = 1
    """Optimizer steps per rollout batch (PPO mini-batches): each rank splits its rows into this many, so a
    mini-batch holds B / mini_batches rows over all ranks."""
    epochs: Annotated[Int, Field(ge=1)] = 1
    """Passes over each rollout batch (PPO epochs)."""
    dynamic_sampling: Bool = False
    """DAPO's dynamic sampling: draw questions in rounds until the step holds ``questions_per_step`` groups whose
    rewards differ (at most ``max_sampling_rounds`` rounds; short of that, groups without variance fill the step
    and are counted), dropping the others before any logprob pass. ``sampling/*`` counts rounds, drawn, dropped
    and filled groups; the question cursor covers every draw, so a resumed run draws what the uninterrupted one
    would."""
    max_sampling_rounds: Annotated[Int, Field(ge=1)] = 4
    """dynamic_sampling: rollout rounds per step at most (each draws ``questions_per_step`` questions)."""
    overlong: Literal["keep", "mask", "penalty"] = "keep"
    """Trajectories cut by a token budget (stopped at ``max_tokens`` or ``context_full``): ``keep`` trains on
    them as on any other; ``mask`` leaves their tokens out of the loss (DAPO's overlong filtering; their rewards
    still count in their group's statistics); ``penalty`` subtracts ``overlong_penalty`` from their reward."""
    overlong_penalty: Annotated[Float, Field(ge=0)] = 0.5
    """overlong=penalty: subtracted from a cut trajectory's reward."""
    skip_zero_advantage: Bool = False
    """Rows that add nothing to the gradient (advantage 0 at every trained token, as in a group whose rewards are
    all equal, or no trained token) run no forward or backward in the update; the loss's denominators still count
    them, so the gradient is the same to float rounding. Not when a KL loss, an entropy bonus or a critic reads every
    row. The update's token means (``algo/entropy``, clip fractions) then cover the rows run; ``algo/rows_skipped``
    counts the others."""
    grad_checkpointing: Bool = False
    """Recompute the policy's (and the critic's) activations in the backward pass: less memory, slower."""
    offload_optimizer: Bool = False
    """Keep the AdamW state (policy and critic; 8 bytes per trainable parameter) in CPU memory except during each
    optimizer step (verl's ``optimizer_offload``): the device holds it only at the step, when no activations or KV
    cache are alive. Costs two host-device copies of it per optimizer step. No effect on a CPU run."""
    offload_reference: Bool = False
    """Keep the frozen reference in CPU memory and move it to the device for its log-probability pass only (verl's
    reference ``param_offload``; under FSDP its shards through FSDP2's ``CPUOffloadPolicy``). Costs one copy of it
    each way per step. No effect on a CPU run."""
    memory_check: Bool = True
    """Before loading weights, print the memory plan (expected peak per rank; ``sleuth train --plan``) and refuse a
    config whose peak does not fit the device; false: print it and run anyway."""
    critic_warmup_steps: Annotated[Int, Field(ge=0)] = 0
    """algo.advantage=gae: the first N steps train the critic only (the policy is not updated, its learning-rate
    schedule does not move), so that the advantages start from a fitted baseline (Search-R1's PPO: 15)."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """Data parallelism under ``torchrun`` (ignored in one process): ``ddp`` (a full replica per rank) or ``fsdp``
    (FSDP2: parameters, gradients and optimizer state sharded per decoder block, for models that do not fit one
    device; checkpoints stay plain ``save_pretrained`` directories)."""
    cpu_threads: Annotated[Int | None, Field(ge=1)] = None
    """torch intra-op threads when the model runs on CPU (None = torch's default, one per core). Small models run
    faster on 1, much faster on a shared machine (torchrun already sets 1)."""
    save_every: Annotated[Int, Field(ge=0)] = 0
    """Checkpoint every N steps (0 = only at the end)."""
    eval_every: Annotated[Int, Field(ge=0)] = 0
    """Evaluate every N steps (0 = only at the end)."""
    eval_limit: Annotated[Int | None, Field(ge=1)] = None
    """Evaluate during training on the first N questions of each data source of each eval file (None = all)."""
    log_samples: Annotated[Int, Field(ge=0)] | Literal["all"] = 2
    """Trajectories of each step written to ``samples.jsonl``: the first N of the step's rollouts (rank 0's under
    torchrun; a group's samples are consecutive), each with its segments, masks and searches, as ``sleuth view``
    shows them; 0 = none; ``all``: every trajectory of the step (rank 0's)."""
    keep_checkpoints: Annotated[Int, Field(ge=1)] = 2
    """Complete checkpoints kept on disk (older ones are deleted)."""
    on_collapse: Literal["warn", "stop", "rollback"] = "warn"
    """What the collapse watch does: warn | stop | rollback (to the last good checkpoint)."""
    seed: Int = 0
    """Seed of the run: python/numpy/torch, question order, rollout sampling."""
    deterministic: Bool | None = None
    """Use torch's deterministic algorithms (``torch.use_deterministic_algorithms``, warnings where an op has none;
    on a GPU also ``CUBLAS_WORKSPACE_CONFIG`` and no cuDNN autotuning): reruns and resumes give the same numbers.
    None (default): on CPU runs, where it costs nothing, and not on GPUs, where it slows some kernels."""
    time_limit_minutes: Annotated[Float | None, Field(gt=0)] = None
    """Stop after the step after which one more like it would end past this many minutes of training (the slowest
    rank's clocks; loading and the final evaluation and save come on top), evaluate and save a checkpoint as after
    a last step (``sleuth sft``: saves); ``--resume`` continues towards ``total_steps``. For machines lent by the
    minute. None: no limit."""
    sampler_check_every: Annotated[Int | None, Field(ge=0)] = None
    """With one on-policy pass the rollout's logprobs stand in for the old policy's; every this many steps (from
    step 1) the trainer's forward computes them too and the gap is logged (``rollout/sampler_gap_*``). None: every
    10 steps on a GPU or in bf16/float16 compute, never on a CPU in float32 (equal to rounding there); 0: never."""
    sampler_max_gap: Annotated[Float, Field(ge=0)] = 0.01
    """Mean |sampler - trainer| logprob above which the old logprobs are recomputed at every step from then on."""
    tf32: Bool = True
    """On a GPU, float32 matrix products (``model.dtype: float32``; the update's float32 parts) run on the
    TF32 tensor cores (``torch.set_float32_matmul_precision("high")``: ~8x faster on an H100, 10-bit
    mantissa products accumulated in float32). False keeps full float32 products. Off whenever
    ``train.deterministic`` is on. No effect on CPU."""
    tensorboard: Bool = False
    """Also write TensorBoard events to ``<out>/tensorboard``."""
    wandb: Bool = False
    """Also log to Weights & Biases, project ``sleuth`` (``pip install 'sleuth[logging]'``)."""


@_section
class EvalConfig:
    batch_size: Annotated[Int, Field(ge=1)] = 64
    """Questions rolled out together by the evaluations during training."""


@_section
class SftConfig:
    source: Literal["synthesize", "trajectories"] = "synthesize"
    """Where ``sleuth sft`` gets its transcripts: ``synthesize`` writes them from ``data.train_files`` and the
    retriever (search with the question, a follow-up search when the first results miss the answer, kept only
    when a gold answer is in the retrieved passages); ``trajectories`` reads ``sft.files``."""
    files: Names = field(default_factory=list)
    """source=trajectories: a run's ``samples.jsonl`` or a JSONL of transcripts (``question``,
    ``golden_answers``, ``segments`` of ``{"kind": "sampled" | "injected", "text"}``, optional ``reward``)."""
    min_reward: Float | None = None
    """source=trajectories: keep only records whose ``reward`` is at least this (rejection-sampling fine-tuning;
    a record without a reward is then dropped); None keeps every record."""
    follow_up: Bool = True
    """source=synthesize: when the question's own search misses the answer, search the title of the first deeper
    passage (of the top 20) that holds it and keep the transcript if that search finds the answer."""
    max_transcripts: Annotated[Int | None, Field(ge=1)] = None
    """Train on at most this many transcripts (the first ones; None = all)."""
    epochs: Annotated[Float, Field(gt=0)] = 1.0
    """Passes over the transcripts (fractions allowed); sets the step count unless ``sft.steps`` does."""
    steps: Annotated[Int | None, Field(ge=1)] = None
    """Optimizer steps (None: ``epochs`` passes of ``batch_size`` transcripts)."""
    batch_size: Annotated[Int, Field(ge=1)] = 8
    """Transcripts per optimizer step (split into ``train.micro_batch_size`` rows per forward)."""
    lr: Annotated[Float, Field(ge=0)] = 1e-5
    """AdamW learning rate (after warm-up; ``train.schedule`` decays it)."""
    warmup_steps: Annotated[Int, Field(ge=0)] = 0
    """Steps of linear learning-rate warm-up."""


@_section
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    data: DataConfig = field(default_factory=DataConfig)
    """Questions to train and evaluate on."""
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    """The search engine."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Multi-turn sampling."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Scoring of a trajectory."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """The RL objective."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimisation, checkpoints, logging."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation during training."""
    sft: SftConfig = field(default_factory=SftConfig)
    """Supervised fine-tuning on protocol transcripts (``sleuth sft``)."""
