"""The retrieval server's result cache: an LRU of ``(query, k) -> passages`` bounded by entries
and by approximate bytes (``sleuth serve --cache-mb``)."""

from __future__ import annotations

import sys
from collections import OrderedDict

from sleuth.types import Passage

PASSAGE_OVERHEAD_BYTES = 200
"""Memory of a cached ``Passage`` besides its strings: the object, its attribute dict, the score,
the list slot (measured ~190 bytes on CPython 3.11)."""


def result_nbytes(key: tuple[str, int], passages: list[Passage]) -> int:
    """Approximate memory of one cache entry: its strings' sizes plus a fixed overhead per passage."""
    n = sys.getsizeof(key[0]) + 64 + PASSAGE_OVERHEAD_BYTES * len(passages)
    for p in passages:
        n += sys.getsizeof(p.id) + sys.getsizeof(p.title) + sys.getsizeof(p.text)
        if p.raw_contents is not None:
            n += sys.getsizeof(p.raw_contents)
    return n


class ResultCache:
    """LRU map of ``(query, k) -> passages`` bounded by entries and by approximate bytes
    (:func:`result_nbytes`); either bound 0 disables it. Used from the event loop only (no lock).
    An entry larger than the whole byte budget is not kept."""

    def __init__(self, max_entries: int, max_bytes: int):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.nbytes = 0
        self._data: OrderedDict[tuple[str, int], tuple[list[Passage], int]] = OrderedDict()

    def get(self, key: tuple[str, int]) -> list[Passage] | None:
        item = self._data.get(key)
        if item is None:
            return None
        self._data.move_to_end(key)
        return item[0]

    def put(self, key: tuple[str, int], passages: list[Passage]) -> None:
        size = result_nbytes(key, passages)
        if self.max_entries <= 0 or size > self.max_bytes:
            return
        old = self._data.pop(key, None)
        if old is not None:
            self.nbytes -= old[1]
        self._data[key] = (passages, size)
        self.nbytes += size
        while len(self._data) > self.max_entries or self.nbytes > self.max_bytes:
            self.nbytes -= self._data.popitem(last=False)[1][1]

    def __len__(self) -> int:
        return len(self._data)
