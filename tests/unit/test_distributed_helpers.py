"""The small helpers of sharded evaluation: interleave undoes ``items[rank::world]``."""

import pytest

from sleuth.train import reduce as par

pytestmark = pytest.mark.unit


def test_interleave_undoes_strided_shards():
    items = list("abcdefg")  # 7 items over 3 ranks: a d g | b e | c f
    shards = [items[r::3] for r in range(3)]
    assert shards == [["a", "d", "g"], ["b", "e"], ["c", "f"]]
    assert par.interleave(shards) == items
    assert par.interleave([["x"], []]) == ["x"]  # fewer items than ranks: a rank may hold none
    assert par.interleave([[]]) == []


def test_interleave_refuses_shards_of_the_wrong_sizes():
    with pytest.raises(ValueError, match="shard 0 holds 1 items; a 2-way split of 4 gives it 2"):
        par.interleave([["a"], ["b", "c", "d"]])


def test_all_gather_objects_in_one_process_is_the_object():
    assert par.all_gather_objects({"rows": [1]}, world_size=1) == [{"rows": [1]}]
