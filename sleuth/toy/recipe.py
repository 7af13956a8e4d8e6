"""The embedded default's training recipe: the config ``sleuth demo`` trains the tiny model with
(``configs/tiny.yaml`` is the same, shortened), and the setting ``sleuth eval``/``ask`` fall back to
for the ``tiny`` model."""

from __future__ import annotations

DEMO_WORLD_ENTITIES = 600


def demo_config(model_path: str, *, steps: int, seed: int, fmt: str, world_seed: int = 0,
                world_entities: int = DEMO_WORLD_ENTITIES):
    """The demo's training config (also the content of ``configs/tiny.yaml``, shortened there): the
    embedded ``tiny`` model's setting, which ``sleuth eval``/``ask`` also default to for it."""
    # lazy: pydantic (~0.2 s) at `sleuth --help` (sleuth.demo.cli and sleuth.eval.defaults import this module)
    from sleuth.config import (
        AlgoConfig,
        Config,
        DataConfig,
        EvalConfig,
        ModelConfig,
        RetrievalConfig,
        RewardConfig,
        RolloutConfig,
        TrainConfig,
    )

    return Config(
        model=ModelConfig(name_or_path=model_path),
        data=DataConfig(train_files=["world:train"], eval_files=["world:test"], world_seed=world_seed,
                        world_entities=world_entities),
        # top-1: the world's wording puts the fact's passage first for the searches the base model knows
        retrieval=RetrievalConfig(corpus="world", topk=1),
        rollout=RolloutConfig(format=fmt, group_size=8, max_turns=2, max_tokens_per_turn=40, max_obs_tokens=128,
                              max_context_tokens=512, temperature=1.0, use_chat_template=False),
        reward=RewardConfig(kind="em"),
        algo=AlgoConfig(advantage="grpo", kl_coef=0.0, kl_mode="none", clip_low=0.2, clip_high=0.28),
        train=TrainConfig(total_steps=steps, questions_per_step=8, lr=5e-4, micro_batch_size=32, seed=seed,
                          eval_every=0, save_every=0, cpu_threads=1),  # tiny ops: one thread is fastest
        eval=EvalConfig(batch_size=128),
    )
