"""Guidance for small models (``algo.guide_coef``): a gold transcript's supervised loss where a group failed.

Outcome-only RL starves a small model on questions it never gets right: a group whose every sample is
wrong has no contrast, so GRPO learns nothing from it (``groups/em_variance_share``). Guided updates give
such questions a signal from a demonstration: for a group whose every sample fails (exact match 0) and
whose question has a gold transcript (``algo.guide_files``: ``sleuth sft``'s ``transcripts.jsonl``, or any
JSONL of transcripts, read as ``sft.source: trajectories`` reads them), the step adds ``guide_coef`` times
the supervised loss of that transcript, with the loss masks of SFT (the policy's own segments trained, the
prompt and the retrieved passages not), the token mean over the step's guide tokens on every rank.

A departure from GRPO, as in DGPO (arXiv 2508.20324: teacher guidance only where the student fails) and
David-GRPO (arXiv 2601.21699: a warm start on gold demonstrations plus guided updates, for models below
1B where the Search-R1 recipe scores 0). With ``guide_coef: 0`` (the default) nothing here runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from sleuth.config_file import ConfigError
from sleuth.data.transcripts import encode, read_transcripts
from sleuth.reward.trajectory import answer_scores
from sleuth.rollout.chat import ChatRenderer


@dataclass
class GuideRows:
    """The supervised rows a step adds: ``(ids, labels)`` (labels -100 where no loss), and their weight."""

    rows: list[tuple[list[int], list[int]]]
    coef: float


class Guide:
    """Gold transcripts by question id, encoded as a rollout tokenises them."""

    def __init__(self, files: list[str], render: ChatRenderer, coef: float):
        transcripts, _ = read_transcripts(files, by_id=True)
        self.coef = coef
        self.encoded = {t.question.id: encode(t, render) for t in transcripts}

    def rows_for(self, trajectories) -> GuideRows:
        """The transcripts of the questions whose every sample failed (and that have one)."""
        groups: dict[str, list] = {}
        for t in trajectories:
            groups.setdefault(t.question.id, []).append(t)
        failed = [qid for qid, g in groups.items() if all(answer_scores(t).em == 0.0 for t in g)]
        return GuideRows([self.encoded[qid] for qid in failed if qid in self.encoded], self.coef)


def make_guide(cfg, tokenizer, fmt) -> Guide | None:
    """The run's guide (``algo.guide_coef`` > 0), None otherwise; a clear error without transcripts."""
    algo = cfg.algo
    if algo.guide_coef == 0:
        return None
    if not algo.guide_files:
        raise ConfigError("algo.guide_coef > 0 needs algo.guide_files: gold transcripts, e.g. the "
                          "transcripts.jsonl of a `sleuth sft` run")
    guide = Guide(algo.guide_files, ChatRenderer(tokenizer, fmt, cfg.rollout.use_chat_template), algo.guide_coef)
    if not guide.encoded:
        raise ConfigError(f"algo.guide_files {algo.guide_files} hold no transcript")
    return guide
