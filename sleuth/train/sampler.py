"""Question sampling with a resumable cursor, and the collapse watch."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from sleuth.errors import DataError
from sleuth.types import Question


class QuestionSampler:
    """Epochs of (optionally shuffled) questions; ``state()``/``load_state()`` make resume exact.

    The permutation of epoch ``e`` depends only on ``(seed, e)``. A draw that crosses into a new
    epoch never repeats a question it already holds: the questions it drew from the end of the old
    epoch are moved (in their order) to the end of the new epoch's permutation, so every epoch
    still holds each question once and no step holds one twice (GRPO groups are keyed by question
    id). The cursor ``(epoch, pos, deferred)`` is the whole state. Ids must be unique.
    """

    def __init__(self, questions: list[Question], *, seed: int = 0, shuffle: bool = True):
        if not questions:
            raise DataError("no training questions: check data.train_files")
        ids = [q.id for q in questions]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise DataError(f"question id {dup!r} appears more than once; ids must be globally unique")
        self.questions = list(questions)
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self.pos = 0, 0
        self.deferred: list[int] = []  # indices moved to the end of this epoch's order (see the class doc)
        self._order = self._permutation(0)

    def _permutation(self, epoch: int, deferred: list[int] = ()) -> list[int]:
        order = list(range(len(self.questions)))
        if self.shuffle:
            random.Random(self.seed * 100_003 + epoch).shuffle(order)
        moved = set(deferred)
        return [i for i in order if i not in moved] + [i for i in deferred]

    def next(self, n: int) -> list[Question]:
        """The next ``n`` distinct questions (crossing epoch boundaries as needed)."""
        if not 1 <= n <= len(self.questions):
            raise ValueError(f"cannot draw {n} distinct questions from {len(self.questions)}")
        drawn: list[int] = []
        while len(drawn) < n:
            if self.pos >= len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self.deferred = list(drawn)  # this draw's tail of the old epoch: last in the new one
                self._order = self._permutation(self.epoch, self.deferred)
            drawn.append(self._order[self.pos])
            self.pos += 1
        return [self.questions[i] for i in drawn]

    def state(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "deferred": list(self.deferred)}

    def load_state(self, state: dict) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self.deferred = [int(i) for i in state.get("deferred", [])]  # absent in older checkpoints
        self._order = self._permutation(self.epoch, self.deferred)


@dataclass
class CollapseWatch:
    """Warns when the reward falls while the invalid-format rate or the entropy jumps.

    Compares the mean of the last ``window`` steps with the mean of the ``window`` before them.
    ``check`` returns a message when a collapse is suspected, else None.
    """

    window: int = 5
    reward_drop: float = 0.2  # absolute fall of the mean reward
    invalid_jump: float = 0.2  # absolute rise of the invalid-action rate
    entropy_ratio: float = 2.0  # entropy growing by this factor
    history: deque = field(default_factory=lambda: deque(maxlen=200))

    def check(self, reward: float, invalid_rate: float, entropy: float) -> str | None:
        self.history.append((reward, invalid_rate, entropy))
        w = self.window
        if len(self.history) < 2 * w:
            return None
        recent = list(self.history)[-w:]
        before = list(self.history)[-2 * w : -w]

        def mean(rows, i):
            return sum(r[i] for r in rows) / len(rows)

        fell = mean(before, 0) - mean(recent, 0) >= self.reward_drop
        invalid_up = mean(recent, 1) - mean(before, 1) >= self.invalid_jump
        entropy_up = mean(before, 2) > 0 and mean(recent, 2) >= self.entropy_ratio * mean(before, 2)
        if fell and (invalid_up or entropy_up):
            return (
                f"possible collapse: reward {mean(before, 0):.3f} -> {mean(recent, 0):.3f}, "
                f"invalid rate {mean(before, 1):.3f} -> {mean(recent, 1):.3f}, "
                f"entropy {mean(before, 2):.3f} -> {mean(recent, 2):.3f}"
            )
        return None
