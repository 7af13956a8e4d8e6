"""The one retriever interface every backend implements, and its typed error."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from sleuth.errors import DataError, ServiceError
from sleuth.types import Passage


class RetrievalError(ServiceError):
    """A search could not be served (server down, timeout, bad response). The rollout turns it
    into an observation saying the search failed, counts it, and goes on."""


class RetrieverDownError(RetrievalError):
    """Every search of a training step failed, after the client's retries: the run stops (``sleuth
    train`` prints the message and exits 1) instead of training on failed searches."""


@runtime_checkable
class Retriever(Protocol):
    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Batched search: one list of at most ``k`` passages (best first, with scores) per query."""
        ...


class IndexFileError(DataError):
    """A file of a built index is missing or corrupt. ``load_index`` names the index directory
    and adds the command that rebuilds it."""


def index_file_error(where, e: BaseException) -> IndexFileError:
    """An IndexFileError for ``where`` (a file or folder of an index) that could not be read
    because of ``e``; keeps only the first sentence of the library's text."""
    if isinstance(e, FileNotFoundError) and e.filename:
        return IndexFileError(f"{e.filename} is missing")
    if "allow_pickle" in str(e):  # numpy's way of saying "not a .npy file"; its advice would mislead
        return IndexFileError(f"cannot read {where} (a .npy file is not a valid array)")
    first = str(e).strip().splitlines()[0].split(". ")[0][:160] if str(e).strip() else ""
    return IndexFileError(f"cannot read {where} ({type(e).__name__}: {first})")
