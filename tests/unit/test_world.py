"""The toy world: determinism, splits, wording that BM25 can serve, files the QA loader reads."""

import json

import pytest

from sleuth.toy.names import CITY_SUFFIXES, INVENTORY_SIZES, MAX_ENTITIES, SYLLABLES, name_inventory
from sleuth.toy.wording import NEEDS, PHRASES, QUESTION_TYPES, RELATIONS, claim_text, hop_query, need_text, said_text
from sleuth.toy.world import generate_world
from sleuth.types import Passage

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def world():
    return generate_world(seed=3, n_entities=200)


def _gold_passage(world, subject, relation):
    """The passage holding the fact sentence of (subject, relation)."""
    sentence = claim_text(subject, relation, world.facts[(subject, relation)])
    hits = [p for p in world.passages if sentence in p.text]
    assert len(hits) == 1, (subject, relation, hits)
    return hits[0]


def test_claim_and_need_wording():
    # The sentence templates, filled by hand.
    assert claim_text("Varnell Works", "founder", "Ida Morrow") == "Varnell Works was founded by Ida Morrow."
    assert claim_text("Kaso Lamp", "invented_year", "1850") == "Kaso Lamp was invented in 1850."
    assert claim_text("Ida Morrow", "birthplace", "Dunford") == "Ida Morrow was born at Dunford."
    assert need_text("Ida Morrow", "birthplace") == "the birthplace of Ida Morrow"
    assert said_text("founder", "Ida Morrow") == "The passage says: founded by Ida Morrow."
    assert hop_query("Ida Morrow", "birthplace") == "Ida Morrow born"
    assert hop_query("Dunford", "country") == "Dunford city"
    assert set(PHRASES) == set(RELATIONS) == set(NEEDS)
    for chain, template in QUESTION_TYPES.values():
        assert template.endswith("{s}?") and all(r in RELATIONS for r in chain)
        if len(chain) == 2:  # the first hop's object is the second hop's subject
            assert RELATIONS[chain[0]][1] == RELATIONS[chain[1]][0]


def test_deterministic_by_seed(world):
    again = generate_world(seed=3, n_entities=200)
    assert [p.contents for p in again.passages] == [p.contents for p in world.passages]
    assert [(q.id, q.text, q.golden_answers) for q in again.test] == [(q.id, q.text, q.golden_answers) for q in world.test]
    assert again.fingerprint() == world.fingerprint()
    other = generate_world(seed=4, n_entities=200)
    assert [p.contents for p in other.passages] != [p.contents for p in world.passages]
    assert other.fingerprint() != world.fingerprint()


def test_names_are_one_word_from_the_inventory_and_unique(world):
    names = [n for kind in ("person", "company", "invention", "city", "country") for n in world.entities[kind]]
    assert len(names) == len(set(names))
    # 200 entities: 80 people, 50 companies, 30 inventions, 40 cities (+24 countries).
    assert [len(world.entities[k]) for k in ("person", "company", "invention", "city")] == [80, 50, 30, 40]
    inventory = name_inventory()
    assert {k: len(v) for k, v in inventory.items()} == INVENTORY_SIZES
    everything = [n for group in inventory.values() for n in group]
    assert len(everything) == len(set(everything)) and name_inventory() is inventory  # fixed, not per world
    people, cities = set(world.entities["person"]), set(world.entities["city"])
    assert people <= set(inventory["stem"]) and cities <= set(inventory["city"])
    assert set(world.entities["country"]) <= set(inventory["country"])
    for name in world.entities["company"] + world.entities["invention"]:  # an inventory stem + a kind word
        assert name.split()[0] in inventory["stem"] and len(name.split()) == 2
    assert set(world.stems) == people | cities | set(world.entities["country"]) | {
        n.split()[0] for n in world.entities["company"] + world.entities["invention"]}
    syl = set(SYLLABLES)
    for city in world.entities["city"]:
        suffix = next(x for x in CITY_SUFFIXES if city.endswith(x))  # a stem + a city suffix
        rest = city[:-len(suffix)].lower()  # every stem is a concatenation of inventory syllables
        while rest:
            step = next((s for s in sorted(syl, key=len, reverse=True) if rest.startswith(s)), None)
            assert step is not None, city
            rest = rest[len(step):]
    # Two worlds of other seeds and sizes draw from the same inventory, differently.
    other = generate_world(seed=4, n_entities=100)
    assert set(other.entities["person"]) <= set(inventory["stem"]) and other.entities["person"] != world.entities["person"][:40]


def test_questions_ids_sources_and_answers(world):
    questions = world.train + world.test
    ids = [q.id for q in questions]
    assert len(ids) == len(set(ids))
    for split in ("train", "test"):
        for n, q in enumerate(getattr(world, split)):
            assert q.id == f"{q.data_source}/{split}/{n}"
    for q in questions:
        hops = q.meta["hops"]
        assert q.data_source == f"world_{hops}hop" and q.meta["type"] in QUESTION_TYPES
        assert q.meta["subject"] in q.text
        s, answer = q.meta["subject"], world.facts[(q.meta["subject"], q.meta["chain"][0])]
        if hops == 2:
            assert q.meta["bridge"] == answer
            answer = world.facts[(answer, q.meta["chain"][1])]
        assert q.golden_answers == (answer,)
        # the answer is written verbatim in the passage of the last hop
        last_subject = q.meta["bridge"] if hops == 2 else s
        assert answer in _gold_passage(world, last_subject, q.meta["chain"][-1]).text
    assert {q.data_source for q in world.test} == {"world_1hop", "world_2hop"}


def test_split_has_no_shared_question_or_subject(world):
    train_subjects = {q.meta["subject"] for q in world.train}
    test_subjects = {q.meta["subject"] for q in world.test}
    assert not train_subjects & test_subjects
    assert not {q.text for q in world.train} & {q.text for q in world.test}
    # No fact on a test question's chain is asked by a train question, at either hop.
    def chain_facts(q):
        out = {(q.meta["subject"], q.meta["chain"][0])}
        return out | ({(q.meta["bridge"], q.meta["chain"][1])} if q.meta["hops"] == 2 else set())

    asked_in_train = set().union(*(chain_facts(q) for q in world.train))
    for q in world.test:
        assert not chain_facts(q) & asked_in_train, q.text
        assert all(world.split_of[s] == "test" for s, _ in chain_facts(q))
    assert 0.1 < len(world.test) / len(world.train + world.test) < 0.35


def test_bm25_finds_the_gold_passage_with_the_entity_name(world):
    """hit@3 for the ideal queries (the subject, then the bridge) with bm25s over ``contents``."""
    import Stemmer

    from sleuth.retrieval.bm25 import import_bm25s

    bm25s = import_bm25s()  # JAX, if installed, kept off a GPU

    stemmer = Stemmer.Stemmer("english")
    index = bm25s.BM25(method="lucene", k1=0.9, b=0.4)
    index.index(bm25s.tokenize([f"{p.title}\n{p.text}" for p in world.passages], stopwords="en",
                               stemmer=stemmer, show_progress=False), show_progress=False)
    hits, total = 0, 0
    for q in world.train + world.test:
        hops = [(q.meta["subject"], q.meta["chain"][0])]
        if q.meta["hops"] == 2:
            hops.append((q.meta["bridge"], q.meta["chain"][1]))
        for subject, relation in hops:
            gold = _gold_passage(world, subject, relation)
            query = bm25s.tokenize([subject], stopwords="en", stemmer=stemmer, show_progress=False)
            docs, _ = index.retrieve(query, k=3, show_progress=False)
            hits += int(gold.id) in docs[0].tolist()
            total += 1
    assert hits / total >= 0.98, hits / total


def test_the_ideal_searches_rank_the_fact_first(world):
    """The searches the pretraining transcripts teach (the need, then name + search word) put the
    fact's passage at rank 1 for every question, so top-1 retrieval suffices. The words before each
    object in a fact passage occur before nothing else in that question's context."""
    from sleuth.toy.corpus import WorldSearch

    search = WorldSearch(world)
    for q in world.train + world.test:
        subject, context = q.meta["subject"], [q.text]
        for hop, relation in enumerate(q.meta["chain"]):
            query = need_text(subject, relation) if hop == 0 else hop_query(subject, relation)
            top = search.search([query], 1)[0]
            obj = world.facts[(subject, relation)]
            assert top and claim_text(subject, relation, obj) in top[0].text, (q.text, query, top)
            context += [query, top[0].text]
            subject = obj
        for hop, relation in enumerate(q.meta["chain"]):  # the object's two leading words are unique
            lead = " ".join(PHRASES[relation][1].split()[-2:]) + " "
            assert sum(c.count(lead) for c in context) == 1, (q.text, lead, context)


def test_write_files_and_load_with_the_qa_loader(world, tmp_path):
    from sleuth.data.qa import load_questions

    paths = world.write(tmp_path / "w")
    rows = [json.loads(line) for line in paths["corpus"].read_text().splitlines()]
    assert len(rows) == len(world.passages) and set(rows[0]) == {"id", "contents"}
    assert Passage.from_contents(rows[0]["id"], rows[0]["contents"]).title == world.passages[0].title
    test_rows = [json.loads(line) for line in paths["test"].read_text().splitlines()]
    assert {"id", "question", "golden_answers", "data_source"} <= set(test_rows[0])
    loaded = load_questions(paths["test"])
    assert [(q.id, q.text, q.golden_answers, q.data_source) for q in loaded] == [
        (q.id, q.text, q.golden_answers, q.data_source) for q in world.test
    ]


def test_bad_parameters_are_errors():
    with pytest.raises(ValueError, match="n_entities"):
        generate_world(n_entities=5)
    with pytest.raises(ValueError, match="name inventory"):
        generate_world(n_entities=MAX_ENTITIES + 1)
    with pytest.raises(ValueError, match="n_countries"):
        generate_world(n_countries=INVENTORY_SIZES["country"] + 1)
    with pytest.raises(ValueError, match="test_fraction"):
        generate_world(test_fraction=1.5)
