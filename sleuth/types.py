"""Core data types shared by every stage of Sleuth.

Shape-letter legend used in names across the code base (after tinker-cookbook):

    Q  questions in a batch          G  samples per question (group size)
    B  rows = Q * G                  T  tokens (time)
    K  passages per query            V  vocabulary

So ``rewards_B`` is a vector with one reward per row and ``logprobs_BT`` a [B, T] matrix.

The invariant that carries correctness: a :class:`Trajectory` is a list of :class:`Segment`,
each either *sampled* (policy tokens, trained, with the logprobs the sampler saw) or *injected*
(prompt, retrieved text, corrective messages; never trained). The flag is set when the tokens are
produced and is never rebuilt later from strings.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Question:
    """One QA item.

    ``id`` is globally unique across every dataset of a run (e.g. ``"nq/train/17"``); GRPO groups
    are keyed by it, never by a per-dataset row index.
    """

    id: str
    text: str
    golden_answers: tuple[str, ...]
    data_source: str = "unknown"
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"Question id must be a non-empty string, got {self.id!r}")
        if isinstance(self.golden_answers, str):  # a bare string is one answer, not its letters
            object.__setattr__(self, "golden_answers", (self.golden_answers,))
        else:
            object.__setattr__(self, "golden_answers", tuple(str(a) for a in self.golden_answers))


@dataclass
class Passage:
    """A retrieved passage. ``score`` is the retriever's score (higher is better) or None."""

    id: str
    title: str
    text: str
    score: float | None = None
    raw_contents: str | None = field(default=None, repr=False)
    """The corpus row's ``contents`` exactly as stored, when the passage came from one."""

    @property
    def contents(self) -> str:
        """The Search-R1 / wiki-18 ``contents`` field: the stored row when known, else a quoted
        title line and the text (the wiki-18 convention)."""
        if self.raw_contents is not None:
            return self.raw_contents
        return f'"{self.title}"\n{self.text}'

    @classmethod
    def from_contents(cls, id: str, contents: str, score: float | None = None) -> "Passage":
        """Split a ``contents`` string (first line = title, maybe quoted) into title and text;
        the string itself is kept so renderers can reproduce it byte for byte."""
        title, _, text = contents.partition("\n")
        title = title.strip()
        if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
            title = title[1:-1]
        return cls(id=str(id), title=title, text=text.strip(), score=score, raw_contents=contents)


class SegmentKind(str, enum.Enum):
    SAMPLED = "sampled"  # produced by the policy: trained
    INJECTED = "injected"  # prompt, observation, corrective message: never trained


@dataclass
class Segment:
    """A run of tokens with one origin. ``logprobs`` is set (same length) for sampled segments."""

    kind: SegmentKind
    token_ids: list[int]
    logprobs: list[float] | None = None
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind is SegmentKind.SAMPLED:
            if self.logprobs is None or len(self.logprobs) != len(self.token_ids):
                raise ValueError("a sampled segment needs one logprob per token")

    @classmethod
    def sampled(cls, token_ids: list[int], logprobs: list[float], text: str = "") -> "Segment":
        return cls(SegmentKind.SAMPLED, list(token_ids), list(logprobs), text)

    @classmethod
    def injected(cls, token_ids: list[int], text: str = "") -> "Segment":
        return cls(SegmentKind.INJECTED, list(token_ids), None, text)

    @property
    def trained(self) -> bool:
        return self.kind is SegmentKind.SAMPLED


class StopReason(str, enum.Enum):
    """Every way a trajectory ends; each is counted in the metrics as ``rollout/stop/<value>``."""

    ANSWERED = "answered"  # the policy wrote a complete answer
    MAX_TURNS = "max_turns"  # search budget spent and no answer in the final round
    MAX_TOKENS = "max_tokens"  # a turn hit the per-turn token cap without a stop
    CONTEXT_FULL = "context_full"  # the total context budget is exhausted
    INVALID_ACTION = "invalid_action"  # too many unparseable turns
    EOS = "eos"  # the policy ended (EOS) without an answer


class ActionKind(str, enum.Enum):
    SEARCH = "search"
    ANSWER = "answer"
    INVALID = "invalid"


@dataclass
class Action:
    """What a protocol format parsed out of one policy turn."""

    kind: ActionKind
    queries: list[str] = field(default_factory=list)
    answer: str | None = None
    error: str = ""  # why the turn is invalid (for logs)


@dataclass
class SearchOutcome:
    """What an executed search gave the policy: one list per query of the turn (in its order)."""

    passage_ids: list[list[str]]  # an empty list per query when the search failed
    titles: list[list[str]]  # the titles of those passages
    observation: str  # the injected text: rendered passages or the format's error message
    error: str | None = None  # the retriever's exception (``Type: message``) when the search failed
    texts: list[list[str]] = field(default_factory=list)  # the passages' texts as retrieved (before the
    # observation cut them to ``max_obs_tokens``), same shape as ``passage_ids``; [] when not recorded

    @property
    def failed(self) -> bool:
        return self.error is not None


@dataclass
class Turn:
    """One policy turn as the rollout loop handled it; ``Trajectory.turns`` holds one per sampled
    segment, in order, written while the rollout runs (later stages never re-parse the text).

    ``action`` is what the format parsed out of ``text``; ``finish_reason`` is the backend's
    (``stop``, ``eos`` or ``length``). ``search`` is set when the loop executed the turn's search;
    it stays None for a search it did not run (final round, or a turn cut by its token cap).
    """

    text: str
    action: Action
    finish_reason: str = "stop"
    search: SearchOutcome | None = None

    @property
    def executed(self) -> bool:
        """Whether the loop ran this turn's search (failed searches included)."""
        return self.search is not None


@dataclass
class Trajectory:
    """One sample for one question: the full token history and what happened.

    ``segments[0]`` is the injected prompt. Everything after it is the *response*. ``turns`` is the
    typed history of the policy turns (one per sampled segment, see :class:`Turn`); ``queries``,
    ``passage_ids`` and ``retrieved_text`` list every search flat, in order.
    """

    question: Question
    sample_index: int
    segments: list[Segment]
    stop_reason: StopReason | None = None
    answer: str | None = None
    queries: list[str] = field(default_factory=list)
    passage_ids: list[list[str]] = field(default_factory=list)  # one list per issued query ([] if it failed)
    retrieved_text: list[str] = field(default_factory=list)  # rendered observations, in order
    num_turns: int = 0  # policy turns generated
    num_searches: int = 0  # searches executed
    num_invalid: int = 0  # turns answered with the corrective message
    num_retrieval_errors: int = 0
    reward: float | None = None
    turns: list[Turn] = field(default_factory=list)  # one per policy turn, in order

    @property
    def group_id(self) -> str:
        return self.question.id

    @property
    def token_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    @property
    def loss_mask(self) -> list[int]:
        return [int(s.trained) for s in self.segments for _ in s.token_ids]

    @property
    def prompt_len(self) -> int:
        return len(self.segments[0].token_ids) if self.segments else 0

    @property
    def response_text(self) -> str:
        """The decoded text of everything after the prompt (sampled and injected)."""
        return "".join(s.text for s in self.segments[1:])

    @property
    def num_sampled_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments if s.trained)
