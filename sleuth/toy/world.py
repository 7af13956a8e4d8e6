"""A toy world for the embedded default: invented entities, encyclopedia passages, QA pairs.

Every name is built from syllables, so no pretrained model can answer from memory; the only way
to a right answer is to search the world's corpus. The world is deterministic by ``seed``. Names
are drawn from one fixed :func:`~sleuth.toy.names.name_inventory` shared by every world (one word
each: a stem for people, companies and inventions, a stem plus a suffix for cities and countries),
so the tiny model's tokenizer spells every name as one token and the same model serves every world.

Entities and facts (``World.facts[(subject, relation)] -> object``):

* person:    ``birthplace`` (city), ``birth_year``
* company:   ``founder`` (person), ``hq`` (city), ``founded_year``
* invention: ``inventor`` (person), ``invented_year``
* city:      ``country``

Each fact is written in its passage as one fixed sentence (:mod:`sleuth.toy.wording`, e.g. "Varnell
Works was founded by Ida Morrow."), so the answer appears verbatim next to the subject's name.
Distractor passages share words with the real ones (companies sharing a stem, family and fair
passages, a second city in every person's biography).

Questions: single-hop (one relation) and two-hop (a relation whose object is the subject of a
second relation, e.g. founder -> birthplace). The train/test split is by entity and closed under
the facts questions follow: test people are born in test cities, test companies and inventions
have test founders/inventors and test headquarters, so no fact on a test question's chain is ever
asked (or answered) by a train question.
Question ids are ``{data_source}/{split}/{n}``: the ids ``sleuth.data.qa.load_questions`` gives the
rows of the written ``train.jsonl`` / ``test.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from sleuth.errors import ConfigError
from sleuth.toy.names import INVENTORY_SIZES, MAX_ENTITIES, name_inventory
from sleuth.toy.wording import QUESTION_TYPES, RELATIONS, claim_text
from sleuth.types import Passage, Question

WORLD_VERSION = 6  # bump when generation changes: it is part of every cache key built on a world

_COMPANY_KINDS = {"Works": "glass", "Labs": "medicines", "Motors": "engines", "Foods": "bread",
                  "Mills": "flour", "Textiles": "cloth", "Press": "books", "Forge": "tools"}
_DEVICES = "Engine Loom Lamp Compass Valve Pump Clock Telescope".split()
_OCCUPATIONS = "engineer merchant chemist weaver architect printer clockmaker sailor painter".split()


@dataclass
class World:
    """Passages (the corpus), questions with gold answers, and the fact table behind them."""

    seed: int
    params: dict
    passages: list[Passage]
    train: list[Question]
    test: list[Question]
    facts: dict[tuple[str, str], str]
    entities: dict[str, list[str]]  # kind -> names (kinds: person, company, invention, city, country)
    split_of: dict[str, str] = field(default_factory=dict)  # entity name -> "train" | "test"
    stems: list[str] = field(default_factory=list)  # every invented name it uses (one word each)

    def fingerprint(self) -> str:
        """A short hash of everything that determines the world (for cache keys)."""
        blob = json.dumps({"seed": self.seed, "params": self.params, "version": WORLD_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """Write ``corpus.jsonl`` ({"id","contents"}) and FlashRAG-style ``train.jsonl``/``test.jsonl``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {name: out / f"{name}.jsonl" for name in ("corpus", "train", "test")}
        _write_jsonl(paths["corpus"], ({"id": p.id, "contents": p.contents} for p in self.passages))
        for split in ("train", "test"):
            rows = (
                {"id": q.id.rsplit("/", 1)[1], "question": q.text, "golden_answers": list(q.golden_answers),
                 "data_source": q.data_source, "metadata": q.meta}
                for q in getattr(self, split)
            )
            _write_jsonl(paths[split], rows)
        return paths


def _write_jsonl(path: Path, rows) -> None:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


class _Namer:
    """Unique names drawn at random from :func:`name_inventory` (never reused across entities)."""

    def __init__(self, rng: random.Random):
        self.rng, self.left = rng, {k: list(v) for k, v in name_inventory().items()}
        self.used: set[str] = set()

    def take(self, kind: str = "stem") -> str:
        pool = self.left[kind]
        if not pool:
            raise ConfigError(f"the name inventory ran out of {kind} names; use n_entities <= {MAX_ENTITIES}")
        name = pool.pop(self.rng.randrange(len(pool)))
        self.used.add(name)
        return name


def generate_world(seed: int = 0, n_entities: int = 600, test_fraction: float = 0.2,
                   n_countries: int = 24) -> World:
    """Build a world of about ``n_entities`` people, companies, inventions and cities.

    Shares: 40% people, 25% companies, 15% inventions, 20% cities, plus ``n_countries`` countries.
    ``test_fraction`` of people (with their companies and inventions) and of cities are test.
    """
    what = "n_entities (--world-entities, data.world_entities)"
    if n_entities < 20:
        raise ConfigError(f"{what} must be >= 20 for a usable world, got {n_entities}")
    if n_entities > MAX_ENTITIES:
        raise ConfigError(f"{what} must be <= {MAX_ENTITIES} (the size of the name inventory), got {n_entities}")
    if not 1 <= n_countries <= INVENTORY_SIZES["country"]:
        raise ValueError(f"n_countries must be in [1, {INVENTORY_SIZES['country']}], got {n_countries}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    params = {"n_entities": n_entities, "test_fraction": test_fraction, "n_countries": n_countries}
    rng, facts, split_of = random.Random(seed), {}, {}
    namer = _Namer(rng)
    countries = [namer.take("country") for _ in range(n_countries)]
    # Splits are drawn first so that every fact on a test question's chain is about test entities:
    # test people are born in test cities, test companies/inventions have test founders/inventors
    # and test headquarters.
    cities = _make(namer, max(4, n_entities // 5), test_fraction, split_of, "city")
    for c in cities:
        facts[(c, "country")] = rng.choice(countries)
    in_split = {sp: [c for c in cities if split_of[c] == sp] for sp in ("train", "test")}
    people = _make(namer, max(4, n_entities * 2 // 5), test_fraction, split_of, "stem")
    for person in people:
        facts[(person, "birthplace")] = rng.choice(in_split[split_of[person]])
        facts[(person, "birth_year")] = str(rng.randint(1750, 1950))
    stems: list[str] = []
    companies = []
    for _ in range(max(2, n_entities // 4)):
        # Some companies reuse another company's stem: a distractor sharing a word.
        stem = rng.choice(stems) if stems and rng.random() < 0.15 else namer.take()
        stems.append(stem)
        name = f"{stem} {rng.choice(sorted(_COMPANY_KINDS))}"
        while name in companies:
            name = f"{namer.take()} {rng.choice(sorted(_COMPANY_KINDS))}"
        companies.append(name)
        founder = rng.choice(people)
        split_of[name] = split_of[founder]
        facts[(name, "founder")] = founder
        facts[(name, "hq")] = rng.choice(in_split[split_of[founder]])
        facts[(name, "founded_year")] = str(int(facts[(founder, "birth_year")]) + rng.randint(20, 50))
    inventions = []
    for _ in range(max(2, n_entities * 3 // 20)):
        inventions.append(f"{namer.take()} {rng.choice(_DEVICES)}")
        inventor = rng.choice(people)
        split_of[inventions[-1]] = split_of[inventor]
        facts[(inventions[-1], "inventor")] = inventor
        facts[(inventions[-1], "invented_year")] = str(int(facts[(inventor, "birth_year")]) + rng.randint(20, 60))
    entities = {"person": people, "company": companies, "invention": inventions, "city": cities,
                "country": countries}
    passages = _passages(rng, entities, facts)
    train, test = _questions(rng, entities, facts, split_of)
    return World(seed, params, passages, train, test, facts, entities, split_of, sorted(namer.used))


def _make(namer: _Namer, n: int, test_fraction: float, split_of: dict, kind: str) -> list[str]:
    """``n`` new names; the first ``round(test_fraction * n)`` (at least one) are test."""
    names = [namer.take(kind) for _ in range(n)]
    n_test = max(1, round(test_fraction * n))
    split_of.update({name: ("test" if i < n_test else "train") for i, name in enumerate(names)})
    return names


def _passages(rng: random.Random, entities: dict, facts: dict) -> list[Passage]:
    """Encyclopedia passages: every fact sentence verbatim, plus distractors sharing words."""
    rows: list[tuple[str, str]] = []
    founded_by = {facts[(c, "founder")]: c for c in entities["company"]}
    invented_by = {facts[(i, "inventor")]: i for i in entities["invention"]}
    claim = lambda s, r: claim_text(s, r, facts[(s, r)])  # noqa: E731
    for p in entities["person"]:
        rows.append((p, f"{claim(p, 'birthplace')} {claim(p, 'birth_year')}"))
        deeds = f" Founded {founded_by[p]}." if p in founded_by else ""
        deeds += f" Invented {invented_by[p]}." if p in invented_by else ""
        job = rng.choice(_OCCUPATIONS)
        where = rng.choice(entities["city"])
        rows.append((p, f"Worked as {'an' if job[0] in 'aeiou' else 'a'} {job} in {where}.{deeds}"))
    for c in entities["company"]:
        rows.append((c, f"{claim(c, 'founder')} {claim(c, 'founded_year')}"))
        rows.append((c, f"{claim(c, 'hq')} It makes {_COMPANY_KINDS[c.rsplit(' ', 1)[1]]}."))
    for i in entities["invention"]:
        rows.append((i, f"{claim(i, 'inventor')} {claim(i, 'invented_year')}"))
        rows.append((i, f"{i} is a {i.rsplit(' ', 1)[1].lower()} first made in {rng.choice(entities['city'])}."))
    for c in entities["city"]:
        rows.append((c, claim(c, "country")))
    for k in entities["country"]:
        rows.append((k, f"{k} is a country with {rng.randint(2, 40)} provinces."))
    for s in rng.sample(entities["person"], len(entities["person"]) // 3):  # distractors: families and fairs
        rows.append((f"{s} family", f"The {s} family kept a shop in {rng.choice(entities['city'])}."))
    for c in rng.sample(entities["city"], len(entities["city"]) // 3):
        rows.append((f"{c} Fair", f"The {c} Fair is held every summer. Traders come from {rng.choice(entities['city'])}."))
    rng.shuffle(rows)
    return [Passage(str(n), title, text) for n, (title, text) in enumerate(rows)]


def _questions(rng: random.Random, entities: dict, facts: dict, split_of: dict) -> tuple[list, list]:
    """Every question type for every subject of its kind, split by the subject's split."""
    out: dict[str, list[Question]] = {"train": [], "test": []}
    items = []
    for qtype, (chain, template) in QUESTION_TYPES.items():
        kind = RELATIONS[chain[0]][0]
        for s in entities[kind]:
            items.append((qtype, chain, template, s))
    rng.shuffle(items)
    for qtype, chain, template, s in items:
        split = split_of[s]
        hops, bridge, obj = len(chain), None, facts[(s, chain[0])]
        if hops == 2:
            bridge, obj = obj, facts[(obj, chain[1])]
        source = f"world_{hops}hop"
        meta = {"hops": hops, "type": qtype, "subject": s, "chain": list(chain), "bridge": bridge,
                "answer_kind": RELATIONS[chain[-1]][1]}
        qid = f"{source}/{split}/{len(out[split])}"
        out[split].append(Question(qid, template.format(s=s), (obj,), source, meta))
    return out["train"], out["test"]
