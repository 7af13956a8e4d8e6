"""configs/search_r1_{grpo,ppo}.yaml against Search-R1's train_grpo.sh / train_ppo.sh as its verl fork
interprets them (PeterGriffinJin/Search-R1 at a14dc3a4ffc6fe88c1e95038d9738e21ba3f7a06). Each row: our
setting, the value the fork runs with, and the source line(s) it was transcribed from (the script, or
the fork's code that turns the script's value into ours; docs/search_r1_reference.md has the
reasoning). W = 8 GPUs."""

from pathlib import Path

import pytest

from sleuth.config_file import load_config

ROOT = Path(__file__).resolve().parents[2]

# (setting, GRPO value, PPO value, source)
TABLE = [
    ("model.name_or_path", "Qwen/Qwen2.5-3B", "meta-llama/Llama-3.2-3B",
     "train_grpo.sh:15 BASE_MODEL; train_ppo.sh:6 BASE_MODEL"),
    ("train.questions_per_step", 512, 512, "data.train_batch_size=512 (both scripts)"),
    ("rollout.group_size", 5, 1, "actor_rollout_ref.rollout.n_agent=5 / =1; ray_trainer.py:702 batch.repeat(n_agent)"),
    # ppo_mini_batch_size=256 // W * rollout.n (=1, fsdp_workers.py:97,100) = 32 rows per rank = 256 rows in all:
    # GRPO 512 x 5 = 2,560 rows -> 10 optimizer steps; PPO 512 rows -> 2
    ("train.mini_batches", 10, 2, "ppo_mini_batch_size=256; fsdp_workers.py:97,100"),
    ("train.micro_batch_size", 8, 8, "ppo_micro_batch_size=64 (global): 64 // 8 per rank, fsdp_workers.py:98-101"),
    ("train.lr", 1e-6, 1e-6, "actor_rollout_ref.actor.optim.lr=1e-6"),
    ("train.warmup_steps", 286, 286, "lr_warmup_steps_ratio=0.285 x total_training_steps=1005; fsdp_workers.py:236-240"),
    ("train.warmup_from_zero", True, True, "get_constant_schedule_with_warmup: lr x (k - 1) / 286 at step k, "
     "fsdp_workers.py:240; verl/utils/torch_functional.py:428-429"),
    ("train.schedule", "constant", "constant", "get_constant_schedule_with_warmup, fsdp_workers.py:240"),
    ("train.weight_decay", 0.01, 0.01, "AdamW weight_decay 1e-2 default, fsdp_workers.py:229-232"),
    ("train.grad_clip", 1.0, 1.0, "actor.grad_clip: 1.0, ppo_trainer.yaml:32"),
    ("train.total_steps", 1004, 1004, "total_training_steps=1005; ray_trainer.py:843-846 stops at global_steps >= 1005"),
    ("train.grad_checkpointing", True, True, "enable_gradient_checkpointing=true"),
    ("train.parallel", "fsdp", "fsdp", "actor/ref/critic workers are FSDP, verl/workers/fsdp_workers.py"),
    ("train.remove_padding", True, True, "actor_rollout_ref.model.use_remove_padding=True, train_grpo.sh:44, "
     "train_ppo.sh:45 (critic.model.use_remove_padding=True, :62)"),
    ("train.offload_optimizer", True, True, "actor.fsdp_config.optimizer_offload=true, train_grpo.sh:52, "
     "train_ppo.sh:51 (critic's, :69)"),
    ("train.offload_reference", True, True, "ref.fsdp_config.param_offload=True, train_grpo.sh:58, train_ppo.sh:57"),
    ("train.save_every", 100, 100, "trainer.save_freq=100"),
    ("train.eval_every", 50, 50, "trainer.test_freq=50"),
    ("rollout.max_turns", 2, 2, "max_turns=2 (generation.py: 2 searching turns + a final one)"),
    ("rollout.max_tokens_per_turn", 500, 500, "data.max_response_length=500 (vLLM max_tokens per call)"),
    ("rollout.max_obs_tokens", 500, 500, "data.max_obs_length=500"),
    ("rollout.max_context_tokens", 4096, 4096, "data.max_prompt_length=4096"),
    ("rollout.temperature", 1.0, 1.0, "actor_rollout_ref.rollout.temperature=1"),
    ("rollout.top_p", 0.95, 0.95, "rollout.top_p: 0.95 default, ppo_trainer.yaml:71; vllm_rollout.py:116-118"),
    ("rollout.top_k", 0, 0, "rollout.top_k: -1 (off), ppo_trainer.yaml:70"),
    ("retrieval.topk", 3, 3, "retriever.topk=3"),
    ("retrieval.url", "http://127.0.0.1:8000/retrieve", "http://127.0.0.1:8000/retrieve", "retriever.url"),
    ("reward.kind", "em", "em", "main_ppo.py: qa_em.compute_score_em, format_score=0"),
    ("algo.advantage", "grpo", "gae", "algorithm.adv_estimator=grpo / =gae"),
    ("algo.clip_low", 0.2, 0.2, "actor.clip_ratio: 0.2, ppo_trainer.yaml:34 (symmetric)"),
    ("algo.clip_high", 0.2, 0.2, "actor.clip_ratio: 0.2, ppo_trainer.yaml:34 (symmetric)"),
    ("algo.entropy_coef", 0.001, 0.001, "actor.entropy_coeff: 0.001 default, ppo_trainer.yaml:35"),
    ("algo.kl_coef", 0.001, 0.001, "GRPO kl_loss_coef=0.001; PPO algorithm.kl_ctrl.kl_coef=0.001"),
    ("algo.kl_mode", "loss", "reward", "GRPO use_kl_loss=true; PPO use_kl_loss default false -> KL in the reward"),
    ("algo.kl_estimator", "k3", "k1", "GRPO kl_loss_type=low_var_kl; PPO kl_penalty: kl, ppo_trainer.yaml:158"),
]
PPO_ONLY = [
    ("train.critic_lr", 1e-5, "critic.optim.lr=1e-5"),
    ("train.critic_lr_warmup_steps", 15, "critic.optim.lr_warmup_steps_ratio=0.015 x 1005; fsdp_workers.py:670-678"),
    ("train.critic_warmup_steps", 0, "trainer.critic_warmup=0; ray_trainer.py:815"),
    ("algo.gamma", 1.0, "algorithm.gamma: 1.0, ppo_trainer.yaml:153"),
    ("algo.lam", 1.0, "algorithm.lam: 1.0, ppo_trainer.yaml:154"),
    ("algo.value_clip", 0.5, "critic.cliprange_value: 0.5, ppo_trainer.yaml:126"),
]


def _get(cfg, dotted):
    section, key = dotted.split(".")
    return getattr(getattr(cfg, section), key)


@pytest.mark.parametrize("name,column", [("grpo", 1), ("ppo", 2)])
def test_the_config_holds_every_value_of_the_script(name, column):
    cfg = load_config(ROOT / "configs" / f"search_r1_{name}.yaml", [])
    wrong = [(row[0], _get(cfg, row[0]), row[column], row[3]) for row in TABLE if _get(cfg, row[0]) != row[column]]
    if name == "ppo":
        wrong += [(k, _get(cfg, k), v, src) for k, v, src in PPO_ONLY if _get(cfg, k) != v]
    assert not wrong, "\n".join(f"{k}: config {got!r}, script {want!r} ({src})" for k, got, want, src in wrong)


@pytest.mark.parametrize("name", ["grpo", "ppo"])
def test_every_table_setting_is_written_in_the_yaml(name):
    """Explicit, not inherited from Sleuth's defaults: a change of default cannot move the recipe."""
    import yaml

    raw = yaml.safe_load((ROOT / "configs" / f"search_r1_{name}.yaml").read_text())
    keys = [row[0] for row in TABLE] + ([k for k, _, _ in PPO_ONLY] if name == "ppo" else [])
    missing = [k for k in keys if k.split(".")[1] not in raw.get(k.split(".")[0], {})]
    assert not missing, missing


def test_rows_per_optimizer_step_match_the_fork():
    """The fork's mini-batch: 256 rows over all ranks (32 per GPU), whatever n_agent is."""
    for name, rows in (("grpo", 2560), ("ppo", 512)):
        cfg = load_config(ROOT / "configs" / f"search_r1_{name}.yaml", [])
        total = cfg.train.questions_per_step * cfg.rollout.group_size
        assert total == rows and total // cfg.train.mini_batches == 256
