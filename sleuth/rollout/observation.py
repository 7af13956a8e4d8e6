"""Fit an observation into its token budget (``rollout.max_obs_tokens``) without losing its frame.

The budget counts every injected token of the observation (for tool messages: the template's
wrapping too). When the rendered observation is too long, every passage text is cut to the same
number of characters, the largest that fits (binary search, re-rendering through the format, so
the ``</information>``-style closing tag and the per-passage titles survive). If even empty passage
texts do not fit (many passages, long titles, a long error message), the token ids are cut in the
middle: the head and the last ``min(16, budget // 4)`` tokens are kept, so the closing tag is
still there.
"""

from __future__ import annotations

from sleuth.types import Passage

Results = list[tuple[str, list[Passage]]]


def cut_passages(results: Results, max_chars: int) -> Results:
    """Each passage text shortened to at most ``max_chars`` characters (titles and ids kept)."""
    return [
        (q, [Passage(p.id, p.title, p.text[:max_chars].rstrip(), p.score) for p in passages])
        for q, passages in results
    ]


def fit_observation(
    results: Results | None, render, max_tokens: int, last_token: int | None = None, text: str | None = None,
    question: str | None = None,
) -> tuple[list[int], str]:
    """Ids and text of the observation for ``results`` (or of ``text``, e.g. an error), within budget.

    ``render`` is a :class:`sleuth.rollout.chat.ChatRenderer`; ``last_token`` is the eos that
    ended the policy turn, if any (see ``ChatRenderer.observation_ids``); ``question`` is the row's, for a
    format that re-asks it after the passages (kept whole: only passage texts are cut).
    """

    def build(res: Results) -> tuple[list[int], str]:
        return render.observation_ids(render.render_observation(res, question), last_token)

    if results is None:
        ids, out = render.observation_ids(text or "", last_token)
    else:
        ids, out = build(results)
        if len(ids) > max_tokens:
            lo, hi = 0, max((len(p.text) for _, ps in results for p in ps), default=0)
            while lo < hi:  # largest per-passage character cap that fits
                mid = (lo + hi + 1) // 2
                if len(build(cut_passages(results, mid))[0]) <= max_tokens:
                    lo = mid
                else:
                    hi = mid - 1
            ids, out = build(cut_passages(results, lo))
    if len(ids) > max_tokens:
        tail = min(16, max_tokens // 4)
        ids = ids[: max_tokens - tail] + (ids[-tail:] if tail else [])
        out = render.tokenizer.decode(ids, skip_special_tokens=False)
    return ids, out
