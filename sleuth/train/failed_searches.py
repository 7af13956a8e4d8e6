"""Failed searches are not training data. A trajectory whose search failed (after the retrieval
client's retries) read an error instead of passages: not the policy's doing. It is left out of the
loss (counted in ``rollout/failed_search_trajectories``); a step whose every search failed means the
retriever is down, and the run stops before its update. See docs/training.md."""

from __future__ import annotations

from pathlib import Path

import torch

from sleuth.config import Config
from sleuth.retrieval.base import RetrieverDownError


def leave_out(trajs, group_ids: list[str], mask_BT: torch.Tensor) -> tuple[list[str], torch.Tensor, int]:
    """``(group_ids, mask_BT, n_failed)`` with the trajectories whose search failed left out: their
    trained tokens unmasked, and each in a group of its own, so its reward enters no other row's
    baseline (GRPO/RLOO) nor the whitening (REINFORCE++/GAE)."""
    failed_B = [t.num_retrieval_errors > 0 for t in trajs]
    n_failed = sum(failed_B)
    if not n_failed:
        return group_ids, mask_BT, 0
    keep_B1 = torch.tensor([not f for f in failed_B], device=mask_BT.device)[:, None]
    mask_BT = torch.where(keep_B1, mask_BT, torch.zeros_like(mask_BT))
    group_ids = [f"{g}/failed-search/{i}" if f else g for i, (g, f) in enumerate(zip(group_ids, failed_B))]
    return group_ids, mask_BT, n_failed


def retriever_down_error(trajs, cfg: Config, step: int, errors: int, checkpoint: Path | None) -> RetrieverDownError:
    """The error that stops a run whose step ``step`` saw only failed searches: what failed, that
    nothing was trained, and the checkpoint to ``--resume`` from."""
    r = cfg.retrieval
    where = f"{r.kind}: {r.url or r.index_dir or r.corpus}"
    seen = next((text for t in trajs for text in t.retrieved_text if t.num_retrieval_errors), "")
    last = f"the latest checkpoint is {checkpoint.name}" if checkpoint else "no checkpoint was written yet"
    return RetrieverDownError(
        f"every search of step {step} failed ({errors} searches; the retriever ({where}) is down or failing): "
        f"{seen.strip()[:300]!r}. Nothing of this step was trained. Start or fix the retriever, then continue "
        f"with --resume ({last})")
