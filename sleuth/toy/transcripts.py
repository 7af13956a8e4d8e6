"""Pretraining data of the tiny base model: protocol-shaped transcripts of the toy world.

The simulated policy is deliberately unreliable: it answers without searching with probability
``1 - p_search`` (a guess of the right type), searches the right entity with probability
``p_query`` (else another entity or a partial name), and copies the fact from the passages with
probability ``p_copy`` (else another entity of the right type). Transcripts are ``(text, trained)``
segments, tokenised segment by segment as in a rollout; every invented name is renamed at random
per transcript (:class:`Renamer`) so names are copied, never memorised.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from sleuth.rollout.formats import SearchR1Format, TinySearchR1Format
from sleuth.toy.corpus import WorldSearch
from sleuth.toy.names import name_inventory
from sleuth.toy.wording import RELATIONS, claim_text, hop_query, need_text, said_text
from sleuth.toy.world import World
from sleuth.types import Question

if TYPE_CHECKING:
    from sleuth.toy.specs import PretrainSpec


def make_format(prompt: str) -> SearchR1Format:
    """The protocol format matching a pretraining prompt style."""
    if prompt not in ("tiny", "search_r1"):
        raise ValueError(f"PretrainSpec.prompt must be 'tiny' or 'search_r1', got {prompt!r}")
    return TinySearchR1Format() if prompt == "tiny" else SearchR1Format()


# ---------------------------------------------------------------------------------------------
# Transcripts
# ---------------------------------------------------------------------------------------------


def _random_object(world: World, kind: str, rng: random.Random) -> str:
    if kind == "year":
        return str(rng.randint(1750, 2000))
    pool = [e for e in world.entities[kind] if world.split_of.get(e, "train") == "train"]
    return rng.choice(pool)


def _wrong_query(world: World, subject: str, kind: str, rng: random.Random) -> str:
    if rng.random() < 0.3 and " " in subject:
        return subject.split(" ")[0]  # a partial name (a company or invention stem, shared by some)
    pool = [e for e in world.entities[kind] if e != subject and world.split_of.get(e) == "train"]
    return rng.choice(pool)


def synthesize_transcript(world: World, q: Question, fmt, search: WorldSearch, spec: PretrainSpec,
                          rng: random.Random) -> list[tuple[str, bool]]:
    """One transcript in the Search-R1 layout from the unreliable simulated policy, as
    ``(text, trained)`` segments: the prompt and the observations are injected (not trained), the
    policy's own text is trained, exactly as in a rollout:

    ``<think> I need to find who founded X. </think>`` ``<search> who founded X </search>`` observation
    ``<think> The passage says: founded by P. </think>`` then ``<answer> P </answer>`` (or, for a
    two-hop question, ``<search> P born </search>`` and one more round); or, without searching,
    ``<think> I know the answer. </think> <answer> guess </answer>``.
    """
    chain, subject = q.meta["chain"], q.meta["subject"]
    segments = [(fmt.user_content(q), False)]
    if rng.random() >= spec.search_fraction:
        guess = _random_object(world, q.meta["answer_kind"], rng)
        return segments + [(f"{GUESS_OPENING} </think>\n<answer> {guess} </answer>", True)]
    text = f"{SEARCH_OPENING} {need_text(subject, chain[0])}. </think>\n"
    s = subject
    for hop, rel in enumerate(chain):
        kind, obj_kind = RELATIONS[rel]
        target = s if rng.random() < spec.p_query else _wrong_query(world, s, kind, rng)
        # The first query repeats the need said just before it (a continuation); a later one starts
        # with the name said last (a copy at a fixed distance, like the answer's).
        query = need_text(target, rel) if hop == 0 else hop_query(target, rel)
        docs = search.search([query], spec.topk)[0]
        segments += [(text + f"<search> {query} </search>", True), (fmt.render_observation([(query, docs)]), False)]
        true_obj = world.facts.get((s, rel))
        found = true_obj is not None and any(claim_text(s, rel, true_obj) in d.text for d in docs)
        if found and rng.random() < spec.p_copy:
            obj = true_obj
        elif (target, rel) in world.facts and rng.random() < 0.5:
            obj = world.facts[(target, rel)]  # the fact of the entity it searched by mistake
        else:
            obj = _random_object(world, obj_kind, rng)
        text = f"<think> {said_text(rel, obj)} </think>\n"
        s = obj  # the next hop searches what this one found
    return segments + [(text + f"<answer> {obj} </answer>", True)]


class Renamer:
    """Renames every invented name in a transcript by one random permutation of the
    :func:`~sleuth.toy.names.name_inventory`, kind by kind (``Bansozun`` -> ``Tanzin``,
    ``Budoport`` -> ``Lenfakonport``), the same way in the question, the queries, the passages and
    the answer; years too (1700-2029, one map per transcript). Names and years then carry nothing
    to memorise: the only way to predict a query or an answer is to copy it from the context, and
    every name of the inventory (those of any world's test questions too) and every year is a copy
    target during pretraining, so none is learnt as "never said"."""

    def __init__(self):
        import re

        self.groups = [list(group) for group in name_inventory().values()]
        self.group_of = {name: n for n, group in enumerate(self.groups) for name in group}
        self._word = re.compile(r"[A-Z][a-z]+|\b(?:1[7-9]\d\d|20[0-2]\d)\b")  # a name or a year 1700-2029
        self.groups.append([str(y) for y in range(1700, 2030)])
        self.group_of.update({year: len(self.groups) - 1 for year in self.groups[-1]})

    def __call__(self, segments: list[tuple[str, bool]], rng: random.Random) -> list[tuple[str, bool]]:
        # A random one-to-one map of the names present (as a whole permutation would, restricted).
        present: list[list[str]] = [[] for _ in self.groups]
        for text, _ in segments:
            for word in self._word.findall(text):
                if word in self.group_of and word not in present[self.group_of[word]]:
                    present[self.group_of[word]].append(word)
        perm = {}
        for group, names in zip(self.groups, present):
            perm.update(zip(names, rng.sample(group, len(names))))
        return [(self._word.sub(lambda m: perm.get(m.group(0), m.group(0)), text), trained)
                for text, trained in segments]


SEARCH_OPENING = "<think> I need to find"  # how every searching transcript starts
GUESS_OPENING = "<think> I know the answer."  # how every guessing transcript starts


def pretraining_docs(world: World, spec: PretrainSpec, seed: int) -> list[tuple[list[tuple[str, bool]], bool]]:
    """``spec.n_transcripts`` transcripts of train questions (and, with ``spec.passage_docs``, every
    passage once, fully trained), shuffled, as ``(segments, drop_decision)``: ``drop_decision`` marks
    searching transcripts whose decision token ("need" in :data:`SEARCH_OPENING`) is left out of the
    loss, so the learned prior to search is ``p_search``."""
    if not world.train:
        raise ValueError("the world has no train questions; pretraining needs some")
    if not 0.0 < spec.p_search <= spec.search_fraction < 1.0:
        raise ValueError(f"need 0 < p_search <= search_fraction < 1, got {spec.p_search}, {spec.search_fraction}")
    rng, fmt, search = random.Random(seed), make_format(spec.prompt), WorldSearch(world)
    f, p = spec.search_fraction, spec.p_search
    keep = p * (1 - f) / (f * (1 - p))  # P(decision trained | searching): f*keep / (f*keep + 1-f) = p
    docs = [([(passage.contents, True)], False) for passage in world.passages] if spec.passage_docs else []
    rename = Renamer() if spec.rename else None
    for n in range(spec.n_transcripts):
        segments = synthesize_transcript(world, world.train[n % len(world.train)], fmt, search, spec, rng)
        segments = rename(segments, rng) if rename else segments
        docs.append((segments, segments[1][0].startswith(SEARCH_OPENING) and rng.random() >= keep))
    rng.shuffle(docs)
    return docs
