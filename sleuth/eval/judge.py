"""An optional LLM-as-judge metric over any OpenAI-compatible chat-completions endpoint.

EM misses correct answers written differently ("JFK" vs "John F. Kennedy"); a judge model reads
the question, the gold answers and the prediction and says yes or no. Used by ``sleuth eval
--judge-url URL --judge-model NAME``; the API key comes from the environment
(``SLEUTH_JUDGE_API_KEY``, else ``OPENAI_API_KEY``; none is fine for local servers).

A judge never crashes an eval: a request that fails (after ``retries``), times out or returns
text that is not a verdict leaves the row's ``judge`` as ``None`` and is counted in
``judge_failures``. A row without an answer is judged ``0.0`` without a request.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor

import httpx

from sleuth.errors import ConfigError, ServiceError

KEY_ENVS = ("SLEUTH_JUDGE_API_KEY", "OPENAI_API_KEY")

JUDGE_SYSTEM = "You grade answers to trivia questions. Reply with exactly one word: yes or no."
JUDGE_TEMPLATE = (
    "Question: {question}\n"
    "Gold answers (any one is correct): {golds}\n"
    "Predicted answer: {prediction}\n"
    "Does the predicted answer mean the same as one of the gold answers? Reply yes or no."
)
_VERDICT = re.compile(r"\b(yes|no|correct|incorrect)\b", re.IGNORECASE)


class JudgeError(ServiceError):
    """The judge endpoint failed or answered something that is not a verdict."""


def chat_url(url: str) -> str:
    """Accept a base URL (``http://host:port/v1``) or the full ``…/chat/completions`` endpoint."""
    url = url.rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


def parse_verdict(text: str) -> float:
    """``1.0`` for yes/correct, ``0.0`` for no/incorrect (the first such word wins)."""
    m = _VERDICT.search(text or "")
    if m is None:
        raise JudgeError(f"judge reply is not a verdict: {text[:80]!r}")
    return 1.0 if m.group(1).lower() in ("yes", "correct") else 0.0


class LLMJudge:
    """Judges rows with ``question``, ``golden_answers`` and ``answer`` fields, ``max_workers`` at a time."""

    def __init__(self, url: str, model: str, *, api_key: str | None = None, timeout_s: float = 30.0,
                 retries: int = 1, max_workers: int = 4):  # fmt: skip
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--judge-url must be an http(s) URL, got {url!r}")
        self.url, self.model = chat_url(url), model
        if api_key is None:
            api_key = next((os.environ[k] for k in KEY_ENVS if os.environ.get(k)), None)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=timeout_s, headers=headers)
        self.retries, self.max_workers = retries, max_workers
        self.failures = 0
        self.last_error: str | None = None

    def judge_one(self, question: str, golds: list[str], prediction: str) -> float:
        """One verdict; raises :class:`JudgeError` when the endpoint cannot give one."""
        body = {
            "model": self.model,
            "temperature": 0.0,
            "max_tokens": 8,
            "messages": [
                {"role": "system", "content": JUDGE_SYSTEM},
                {"role": "user", "content": JUDGE_TEMPLATE.format(
                    question=question, golds="; ".join(golds), prediction=prediction)},
            ],
        }  # fmt: skip
        error = "no attempt"
        for _ in range(self.retries + 1):
            try:
                resp = self.client.post(self.url, json=body)
                if resp.status_code != 200:
                    error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                    continue
                content = resp.json()["choices"][0]["message"]["content"]
                return parse_verdict(content)
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
                error = f"{type(e).__name__}: {e}"
        raise JudgeError(f"judge at {self.url} failed: {error}")

    def _judge_row(self, row: dict) -> float | None:
        if row.get("answer") is None:
            return 0.0
        try:
            return self.judge_one(row["question"], list(row["golden_answers"]), row["answer"])
        except JudgeError as e:
            self.last_error = str(e)
            return None

    def judge_rows(self, rows: list[dict]) -> None:
        """Set ``row["judge"]`` (1.0 / 0.0 / None on failure) on every row, in parallel."""
        with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            verdicts = list(pool.map(self._judge_row, rows))
        for row, v in zip(rows, verdicts):
            row["judge"] = v
        self.failures += sum(v is None for v in verdicts)

    def close(self) -> None:
        self.client.close()
