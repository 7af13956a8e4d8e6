"""How the toy world (:mod:`sleuth.toy.world`) words its facts: the relations, the passage
sentence of each fact, the search word, the need and the question templates, and the functions
that fill them in. Part of what determines a world and its pretraining transcripts: a change here
needs a bump of :data:`sleuth.toy.world.WORLD_VERSION`."""

from __future__ import annotations

# relation -> (subject kind, object kind)
RELATIONS = {
    "birthplace": ("person", "city"),
    "birth_year": ("person", "year"),
    "founder": ("company", "person"),
    "hq": ("company", "city"),
    "founded_year": ("company", "year"),
    "inventor": ("invention", "person"),
    "invented_year": ("invention", "year"),
    "country": ("city", "country"),
}
# How a fact is worded: "{subject} {verb} {phrase} {object}." in passages. The phrase's last two
# words come right before the object and appear before nothing else in the context of a question
# that reads this fact (the question, the needs, the passages its searches bring up), so copying
# the object after them is unambiguous.
PHRASES = {
    "birthplace": ("was", "born at"),
    "birth_year": ("was", "born in"),
    "founder": ("was", "founded by"),
    "hq": ("is", "headquartered in"),
    "founded_year": ("was", "founded in"),
    "inventor": ("was", "invented by"),
    "invented_year": ("was", "invented in"),
    "country": ("is", "a city in"),
}
# The word a search for a fact about a name just found adds after the name ("Ida Morrow born"):
# a word of the fact's own passage, so BM25 ranks that passage first.
SEARCH_WORDS = {
    "birthplace": "born", "birth_year": "born", "founder": "founded", "hq": "headquartered",
    "founded_year": "founded", "inventor": "invented", "invented_year": "invented", "country": "city",
}
# What one needs to find, said before the first search; it ends with the subject, worded like the
# question just before the subject.
NEEDS = {
    "birthplace": "the birthplace of {s}",
    "birth_year": "the birth year of {s}",
    "founder": "who founded {s}",
    "hq": "the headquarters of {s}",
    "founded_year": "the founding year of {s}",
    "inventor": "who invented {s}",
    "invented_year": "the invention year of {s}",
    "country": "the country of {s}",
}
# question type -> (relation chain, question template); every question ends with its subject.
QUESTION_TYPES = {
    "birthplace": (("birthplace",), "Which city is the birthplace of {s}?"),
    "birth_year": (("birth_year",), "What is the birth year of {s}?"),
    "founder": (("founder",), "Who founded {s}?"),
    "hq": (("hq",), "Which city is the headquarters of {s}?"),
    "founded_year": (("founded_year",), "What is the founding year of {s}?"),
    "inventor": (("inventor",), "Who invented {s}?"),
    "invented_year": (("invented_year",), "What is the invention year of {s}?"),
    "country": (("country",), "What is the country of {s}?"),
    "founder_birthplace": (("founder", "birthplace"), "Which city is the birthplace of the person who founded {s}?"),
    "founder_birth_year": (("founder", "birth_year"), "What is the birth year of the person who founded {s}?"),
    "hq_country": (("hq", "country"), "Which country hosts the headquarters of {s}?"),
    "inventor_birthplace": (("inventor", "birthplace"), "Which city is the birthplace of the person who invented {s}?"),
    "birth_country": (("birthplace", "country"), "Which country holds the birthplace of {s}?"),
}


def claim_text(subject: str, relation: str, obj: str) -> str:
    """The passage sentence stating ``relation(subject) = obj``, e.g. "X was founded by P."."""
    verb, phrase = PHRASES[relation]
    return f"{subject} {verb} {phrase} {obj}."


def said_text(relation: str, obj: str) -> str:
    """What a reader says it found, worded like the passage up to the object."""
    return f"The passage says: {PHRASES[relation][1]} {obj}."


def need_text(subject: str, relation: str) -> str:
    """What one needs to find about ``subject`` (said before the first search; ends with it)."""
    return NEEDS[relation].format(s=subject)


def hop_query(name: str, relation: str) -> str:
    """The search for ``relation`` of a name just found, e.g. "Ida Morrow born": the name first
    (said last before the search, so writing it is a copy at a fixed distance), then a word of
    the fact's passage."""
    return f"{name} {SEARCH_WORDS[relation]}"
