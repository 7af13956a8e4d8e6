"""Hand-computed retrieval maths: RRF fusion, top-k selection, prefixes, argument checks."""

import numpy as np
import pytest

from sleuth.retrieval.bm25 import check_k, top_rows
from sleuth.retrieval.dense import default_search_params
from sleuth.retrieval.hybrid import rrf_fuse
from sleuth.retrieval.prefixes import BGE_EN_INSTRUCTION, encoder_prefixes

pytestmark = pytest.mark.unit


def test_rrf_fuse_hand_computed():
    # list A ranks rows 5, 7, 9; list B ranks rows 7, 3.  With rrf_k = 60:
    #   row 7: 1/(60+2) + 1/(60+1) = 0.016129 + 0.016393 = 0.032522
    #   row 5: 1/61 = 0.016393;  row 3: 1/62 = 0.016129;  row 9: 1/63 = 0.015873
    rows, scores = rrf_fuse([np.array([5, 7, 9]), np.array([7, 3])], k=4, rrf_k=60)
    assert rows.tolist() == [7, 5, 3, 9]
    np.testing.assert_allclose(scores, [1 / 62 + 1 / 61, 1 / 61, 1 / 62, 1 / 63])


def test_rrf_ties_break_by_best_rank_then_row():
    # rows 4 and 2 are each ranked 1st in one list: equal score 1/61, equal best rank -> lower row first.
    rows, _ = rrf_fuse([np.array([4]), np.array([2])], k=2, rrf_k=60)
    assert rows.tolist() == [2, 4]
    # k = 1 keeps one; empty lists fuse to nothing.
    assert rrf_fuse([np.array([4]), np.array([2])], k=1)[0].tolist() == [2]
    assert rrf_fuse([np.array([], dtype=np.int64)] * 2, k=3)[0].tolist() == []


def test_rrf_small_k_weights_top_ranks_more():
    # Rows 1 and 3 are ranked 1st and 3rd, row 2 is 2nd in both lists.
    # rrf_k = 0:  rows 1, 3 = 1/1 + 1/3 = 1.333 > row 2 = 1/2 + 1/2 = 1.0.
    # rrf_k = 60: rows 1, 3 = 1/61 + 1/63 = 0.0322661 > row 2 = 2/62 = 0.0322581 (by a hair).
    a, b = np.array([1, 2, 3]), np.array([3, 2, 1])
    assert rrf_fuse([a, b], k=1, rrf_k=0)[0].tolist() == [1]
    rows, scores = rrf_fuse([a, b], k=3, rrf_k=60)
    np.testing.assert_allclose(scores, [1 / 61 + 1 / 63] * 2 + [2 / 62])
    assert rows.tolist() == [1, 3, 2]  # rows 1 and 3 tie on score and best rank -> row order


def test_top_rows_keeps_positive_scores_best_first():
    scores = np.array([0.0, 2.0, 5.0, 2.0, -1.0, 3.0], dtype=np.float32)
    rows, s = top_rows(scores, 3)
    assert rows.tolist() == [2, 5, 1] and s.tolist() == [5.0, 3.0, 2.0]
    rows, _ = top_rows(scores, 100)  # huge k: every positive row, zero/negative rows excluded
    assert rows.tolist() == [2, 5, 1, 3]
    assert top_rows(np.zeros(4), 2)[0].tolist() == []


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "3"])
def test_check_k_rejects(bad):
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        check_k(bad)


def test_encoder_prefixes_by_family():
    assert encoder_prefixes("intfloat/e5-base-v2") == ("query: ", "passage: ")
    assert encoder_prefixes("intfloat/multilingual-e5-small") == ("query: ", "passage: ")
    assert encoder_prefixes("BAAI/bge-small-en-v1.5") == (BGE_EN_INSTRUCTION, "")
    assert encoder_prefixes("BAAI/bge-m3") == ("", "")
    assert encoder_prefixes("sentence-transformers/all-MiniLM-L6-v2") == ("", "")
    assert encoder_prefixes("some/model-e5x") == ("", "")  # 'e5' must be a name part


def test_default_search_params():
    assert default_search_params("Flat") == ""
    assert default_search_params("IVF256,PQ32") == "nprobe=32"
    assert default_search_params("HNSW32") == "efSearch=128"
