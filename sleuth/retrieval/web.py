"""Web search as a Retriever: Serper, SerpAPI and Brave adapters.

Each adapter reads its API key from the environment (``SERPER_API_KEY``, ``SERPAPI_API_KEY``,
``BRAVE_API_KEY``) unless one is passed, sends one request per query (a few in parallel over
one connection pool), and maps each organic result to a :class:`~sleuth.types.Passage`:
``id`` = the result URL, ``title`` = its title, ``text`` = its snippet (HTML tags removed),
``score`` = ``1 / rank`` (the APIs give ranks, not scores). ``base_url`` is overridable, which
is how the tests point the adapters at a loopback stub that answers in each API's real shape.

Response shapes used (from each provider's documentation):

* Serper ``POST {base}/search`` body ``{"q", "num"}``, header ``X-API-KEY``
  -> ``{"organic": [{"title", "link", "snippet", "position"}, ...]}``
* SerpAPI ``GET {base}/search.json?engine=google&q=&num=&api_key=``
  -> ``{"organic_results": [{"title", "link", "snippet", "position"}, ...]}``; a query with no
  results may come back as HTTP 200 with ``{"error": "Google hasn't returned any results ..."}``
* Brave ``GET {base}/res/v1/web/search?q=&count=`` header ``X-Subscription-Token``
  -> ``{"web": {"results": [{"title", "url", "description"}, ...]}}`` (``web`` absent if none)

Transport errors, timeouts, 5xx and 429 are retried with backoff; anything else that fails is a
:class:`~sleuth.retrieval.base.RetrievalError` naming the provider and the cause.
"""

from __future__ import annotations

import html
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from sleuth.errors import ConfigError
from sleuth.retrieval.base import RetrievalError
from sleuth.retrieval.retry import send_with_retries
from sleuth.types import Passage

_TAG = re.compile(r"<[^>]+>")


class MissingAPIKeyError(ConfigError):
    """The adapter's API key is neither passed nor in its environment variable."""


def clean_snippet(text: Any) -> str:
    """Strip HTML tags (Brave marks matches with <strong>) and unescape entities."""
    return html.unescape(_TAG.sub("", str(text or ""))).strip()


class WebSearchRetriever:
    """Base class: key handling, the retried per-query request, result -> Passage mapping.

    Subclasses set ``name``, ``env_var``, ``default_base_url``, ``max_k`` and implement
    ``_request(q, k)`` and ``_items(data)`` (the list of result dicts), plus ``link_field``.
    """

    name = "web"
    env_var = ""
    default_base_url = ""
    max_k = 10
    link_field = "link"
    snippet_field = "snippet"

    def __init__(
        self,
        api_key: str | None = None,
        *,
        base_url: str | None = None,
        timeout_s: float = 20.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        max_concurrency: int = 4,
    ):
        key = api_key or os.environ.get(self.env_var, "")
        if not key.strip():
            raise MissingAPIKeyError(
                f"{self.name} web search needs an API key: set the {self.env_var} environment variable"
            )
        self.api_key = key.strip()
        self.base_url = (base_url or self.default_base_url).rstrip("/")
        self.retries, self.backoff_s = retries, backoff_s
        self.max_concurrency = max(1, max_concurrency)
        self._http = httpx.Client(timeout=timeout_s)
        self._sleep = time.sleep  # replaced in tests

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """One request per query (up to ``max_concurrency`` at a time); at most ``k`` results each."""
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        k = min(k, self.max_k)
        if len(queries) <= 1 or self.max_concurrency == 1:
            return [self._search_one(q, k) for q in queries]
        with ThreadPoolExecutor(min(self.max_concurrency, len(queries))) as pool:
            return list(pool.map(lambda q: self._search_one(q, k), queries))

    def _search_one(self, query: str, k: int) -> list[Passage]:
        query = query.strip()
        if not query:
            return []
        resp = send_with_retries(
            lambda: self._request(query, k), url=f"{self.name} ({self.base_url})",
            retries=self.retries, backoff_s=self.backoff_s, sleep=self._sleep,
        )
        try:
            data = resp.json()
        except ValueError:
            raise RetrievalError(
                f"{self.name} ({self.base_url}) answered with non-JSON: {resp.text[:200]!r}") from None
        if not isinstance(data, dict):
            raise RetrievalError(f"{self.name} ({self.base_url}) answered {type(data).__name__}, not an object")
        return self._to_passages(self._items(data), k)

    def _to_passages(self, items: Any, k: int) -> list[Passage]:
        if not isinstance(items, list):
            raise RetrievalError(f"{self.name}: unexpected response shape (result list is {type(items).__name__})")
        out = []
        for item in items:
            if not isinstance(item, dict) or not item.get(self.link_field):
                continue  # ads, widgets and the like
            title = clean_snippet(item.get("title"))
            out.append(Passage(str(item[self.link_field]), title, clean_snippet(item.get(self.snippet_field)),
                               1.0 / (len(out) + 1)))
            if len(out) == k:
                break
        return out

    def _request(self, query: str, k: int) -> httpx.Response:  # pragma: no cover - abstract
        raise NotImplementedError

    def _items(self, data: dict) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:
        self._http.close()


class SerperRetriever(WebSearchRetriever):
    """Google results through serper.dev."""

    name, env_var, default_base_url, max_k = "serper", "SERPER_API_KEY", "https://google.serper.dev", 100

    def _request(self, query: str, k: int) -> httpx.Response:
        return self._http.post(f"{self.base_url}/search", json={"q": query, "num": k},
                               headers={"X-API-KEY": self.api_key})

    def _items(self, data: dict) -> Any:
        return data.get("organic", [])


class SerpAPIRetriever(WebSearchRetriever):
    """Google results through serpapi.com."""

    name, env_var, default_base_url, max_k = "serpapi", "SERPAPI_API_KEY", "https://serpapi.com", 100

    def _request(self, query: str, k: int) -> httpx.Response:
        params = {"engine": "google", "q": query, "num": k, "api_key": self.api_key, "output": "json"}
        return self._http.get(f"{self.base_url}/search.json", params=params)

    def _items(self, data: dict) -> Any:
        if "organic_results" not in data and data.get("error"):
            if "returned any results" in str(data["error"]):
                return []
            raise RetrievalError(f"serpapi ({self.base_url}) reported an error: {data['error']}")
        return data.get("organic_results", [])


class BraveRetriever(WebSearchRetriever):
    """Brave Search web results."""

    name, env_var, default_base_url, max_k = "brave", "BRAVE_API_KEY", "https://api.search.brave.com", 20
    link_field, snippet_field = "url", "description"

    def _request(self, query: str, k: int) -> httpx.Response:
        headers = {"X-Subscription-Token": self.api_key, "Accept": "application/json"}
        return self._http.get(f"{self.base_url}/res/v1/web/search", params={"q": query, "count": k},
                              headers=headers)

    def _items(self, data: dict) -> Any:
        return (data.get("web") or {}).get("results", [])


PROVIDERS: dict[str, type[WebSearchRetriever]] = {
    "serper": SerperRetriever,
    "serpapi": SerpAPIRetriever,
    "brave": BraveRetriever,
}


def make_web_retriever(provider: str, **kwargs: Any) -> WebSearchRetriever:
    """Build the adapter named ``provider`` (serper | serpapi | brave)."""
    try:
        cls = PROVIDERS[provider.lower()]
    except KeyError:
        raise ConfigError(f"unknown web search provider {provider!r}; choose one of {sorted(PROVIDERS)}") from None
    return cls(**kwargs)
