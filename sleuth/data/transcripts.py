"""Transcripts: a question and the turns that follow its prompt, each trained (the policy's) or
injected (observations, corrective messages), and how they become ``(ids, labels)`` rows.

A transcript is tokenised exactly as a rollout of the same actions is (``tests`` run the rollout
loop on a scripted policy playing a transcript's turns and compare the ids and the loss mask): the
prompt through :meth:`ChatRenderer.prompt` (the chat template when the tokenizer has one), each
segment on its own with ``tokenizer(text, add_special_tokens=False)``, as the rollout tokenises a
policy turn's text and an observation. Labels are -100 on the prompt and on injected segments, the
loss-mask rule of RL: only the policy's own tokens are trained.

JSONL form (one object per line; a run's ``samples.jsonl`` rows have this shape)::

    {"question_id": "nq/train/3", "question": "...", "golden_answers": ["..."], "data_source": "nq",
     "reward": 1.0, "segments": [{"kind": "sampled", "text": "<think> ..."}, {"kind": "injected", ...}]}

``data_source`` and ``reward`` are optional; ``question_id`` defaults to ``FILE:LINE``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from sleuth.errors import UserError
from sleuth.records import SEGMENT_TEXT_LIMIT
from sleuth.rollout.chat import ChatRenderer
from sleuth.files import write_text_atomic
from sleuth.types import Question

SAMPLE_TEXT_LIMIT = SEGMENT_TEXT_LIMIT  # a run's samples.jsonl (and an eval's rows) cut a segment's text here


@dataclass
class Transcript:
    """A question and its ``(text, trained)`` segments after the prompt."""

    question: Question
    segments: list[tuple[str, bool]]
    reward: float | None = None

    def record(self) -> dict:
        """The JSONL form (see the module docstring)."""
        q = self.question
        out = {"question_id": q.id, "question": q.text, "golden_answers": list(q.golden_answers),
               "data_source": q.data_source}
        if self.reward is not None:
            out["reward"] = self.reward
        out["segments"] = [{"kind": "sampled" if trained else "injected", "text": text}
                           for text, trained in self.segments]
        return out


def encode(transcript: Transcript, render: ChatRenderer) -> tuple[list[int], list[int]]:
    """``(ids, labels)`` of a transcript as a rollout of its actions tokenises it (labels -100 where
    no loss: the prompt and injected segments)."""
    prompt_ids, _ = render.prompt(transcript.question)
    ids, labels = list(prompt_ids), [-100] * len(prompt_ids)
    for text, trained in transcript.segments:
        x = render.encode(text)
        ids += x
        labels += x if trained else [-100] * len(x)
    return ids, labels


def write_transcripts(path: Path, transcripts: list[Transcript]) -> None:
    """All transcripts as JSONL, written beside and renamed into place (never half a file)."""
    write_text_atomic(path, "".join(json.dumps(t.record(), ensure_ascii=False) + "\n" for t in transcripts))


def _parse(row, where: str) -> tuple[Transcript, bool]:
    """The transcript of one JSONL row, and whether the sample log cut one of its segments (a row of
    ``samples.jsonl``, which records ``n_tokens``, whose text stops at ``SAMPLE_TEXT_LIMIT``)."""
    if not isinstance(row, dict):
        raise ValueError("not a JSON object")
    missing = [k for k in ("question", "golden_answers", "segments") if k not in row]
    if missing:
        raise ValueError(f"lacks {', '.join(missing)}")
    segments, cut = [], False
    for n, seg in enumerate(row["segments"]):
        if not isinstance(seg, dict) or seg.get("kind") not in ("sampled", "injected") or not isinstance(
                seg.get("text"), str):
            raise ValueError(f"segment {n} is not {{'kind': 'sampled' | 'injected', 'text': str}}")
        segments.append((seg["text"], seg["kind"] == "sampled"))
        cut = cut or ("n_tokens" in seg and len(seg["text"]) >= SAMPLE_TEXT_LIMIT)
    if not any(trained for _, trained in segments):
        raise ValueError("has no sampled segment (nothing to train)")
    reward = row.get("reward")
    if reward is not None and not isinstance(reward, (int, float)):
        raise ValueError(f"reward {reward!r} is not a number")
    q = Question(str(row.get("question_id") or where), str(row["question"]), row["golden_answers"],
                 str(row.get("data_source") or "unknown"))
    return Transcript(q, segments, None if reward is None else float(reward)), cut


def _rows(path: Path):
    """``(transcript, cut)`` of every line of ``path``; a malformed line is an error naming file and line."""
    if not path.is_file():
        raise UserError(f"sft.files: {path} is not a file")
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                yield _parse(json.loads(line), where)
            except ValueError as e:  # JSONDecodeError too
                raise UserError(f"{where}: not a transcript ({e}); see sleuth/data/transcripts.py for the form")


def load_transcripts(path: Path) -> list[Transcript]:
    """Every transcript of a file ``write_transcripts`` wrote, as written (a run reads its own back)."""
    return [t for t, _ in _rows(path)]


def read_transcripts(files: list[str], min_reward: float | None = None, *,
                     by_id: bool = False) -> tuple[list[Transcript], Counter]:
    """Transcripts from JSONL files (a run's ``samples.jsonl`` or transcripts), the first occurrence of
    each (question, segments) kept (``by_id``: of each question id and segments, so questions of the same
    text under different ids each keep theirs); ``min_reward`` keeps records whose reward reaches it;
    segments the sample log cut are dropped. Returns them and the counts kept and dropped per reason."""
    if not files:
        raise UserError("sft.source=trajectories needs sft.files (a run's samples.jsonl or a JSONL of transcripts)")
    out, counts, seen = [], Counter(), set()
    for name in files:
        for t, cut in _rows(Path(name)):
            if min_reward is not None and (t.reward is None or t.reward < min_reward):
                counts["dropped: no reward" if t.reward is None else f"dropped: reward < {min_reward:g}"] += 1
                continue
            if cut:
                counts[f"dropped: a segment cut at {SAMPLE_TEXT_LIMIT} characters in the log"] += 1
                continue
            key = (t.question.id if by_id else t.question.text, tuple(t.segments))
            if key in seen:
                counts["dropped: duplicate"] += 1
                continue
            seen.add(key)
            counts["kept"] += 1
            out.append(t)
    return out, counts
