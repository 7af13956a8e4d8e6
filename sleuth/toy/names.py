"""The name inventory every toy world draws its entity names from (:func:`name_inventory`):
fixed for all worlds, one word per name, so the tiny model's tokenizer spells every name as one
token and the same model serves every world. A change here needs a bump of
:data:`sleuth.toy.world.WORLD_VERSION`."""

from __future__ import annotations

import functools
import random

# Name stems are 2-3 syllables (consonant, vowel, optional n); every name is one word: a stem
# (people, company and invention stems) or a stem plus a city or country suffix.
SYLLABLES = [c + v + e for c in "bdfgklmprstvz" for v in "aeiou" for e in ("", "n")]
COUNTRY_SUFFIXES = ["ria", "land", "mark"]
CITY_SUFFIXES = ["ford", "burg", "ton", "vale", "port"]
# The name inventory every world draws from (fixed: not per world): kind -> size. A world of
# n_entities uses 0.8 * n stems and 0.2 * n cities, so worlds up to MAX_ENTITIES entities fit.
INVENTORY_SIZES = {"stem": 900, "city": 220, "country": 48}
INVENTORY_SEED = 20261123
MAX_ENTITIES = 1100


@functools.lru_cache(maxsize=1)
def name_inventory() -> dict[str, tuple[str, ...]]:
    """Every invented name a world may use, by kind ("stem", "city", "country"); fixed for all
    worlds (seed :data:`INVENTORY_SEED`), names and stems unique across kinds."""
    rng, used, out = random.Random(INVENTORY_SEED), set(), {}
    for kind, n in INVENTORY_SIZES.items():
        suffixes = {"city": CITY_SUFFIXES, "country": COUNTRY_SUFFIXES}.get(kind, [""])
        names: list[str] = []
        while len(names) < n:
            stem = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((2, 2, 3)))).capitalize()
            if stem not in used:
                used.add(stem)
                names.append(stem + rng.choice(suffixes))
        out[kind] = tuple(names)
    return out
