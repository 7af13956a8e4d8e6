"""fit_observation: passages shortened to fit the observation budget, the frame kept (hand-computed)."""

import pytest

from sleuth.rollout.observation import cut_passages, fit_observation
from sleuth.types import Passage

pytestmark = pytest.mark.unit


class _CharTok:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


class _CharRenderer:
    """One token per character; observation = ``<i>`` + ``title:text`` joined by ``;`` + ``</i>``."""

    tokenizer = _CharTok()

    def render_observation(self, results, question=None):
        return "<i>" + ";".join(f"{p.title}:{p.text}" for _, ps in results for p in ps) + "</i>"

    def observation_ids(self, text, last_token=None):
        return [ord(c) for c in text], text


RESULTS = [("q", [Passage("1", "A", "aaaaaaaaaa"), Passage("2", "B", "bbbbbbbbbb")])]


def test_fits_untouched_when_short_enough():
    # 3 + (2 + 10) + 1 + (2 + 10) + 4 = 32 characters
    ids, text = fit_observation(RESULTS, _CharRenderer(), 32)
    assert text == "<i>A:aaaaaaaaaa;B:bbbbbbbbbb</i>" and len(ids) == 32


def test_passages_cut_to_the_largest_common_length():
    # with each text cut to c characters the length is 12 + 2c; budget 20 -> c = 4
    ids, text = fit_observation(RESULTS, _CharRenderer(), 20)
    assert text == "<i>A:aaaa;B:bbbb</i>" and len(ids) == 20
    # budget 21 still gives c = 4 (c = 5 needs 22)
    assert fit_observation(RESULTS, _CharRenderer(), 21)[1] == "<i>A:aaaa;B:bbbb</i>"


def test_head_and_tail_kept_when_even_empty_passages_do_not_fit():
    # empty texts need 12 characters: "<i>A:;B:</i>"; budget 8 keeps 8 - 2 head + 2 tail (8 // 4 = 2)
    ids, text = fit_observation(RESULTS, _CharRenderer(), 8)
    assert text == "<i>A:;" + "i>" and len(ids) == 8


def test_error_text_is_fitted_too():
    ids, text = fit_observation(None, _CharRenderer(), 8, text="error: the server is down")
    assert len(ids) == 8 and text == "error:" + "wn"


def test_cut_passages_keeps_ids_titles_scores():
    out = cut_passages([("q", [Passage("7", "T", "hello world", 1.5)])], 6)
    assert out == [("q", [Passage("7", "T", "hello", 1.5)])]  # "hello " stripped on the right
