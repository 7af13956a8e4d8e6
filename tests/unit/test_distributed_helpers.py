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


def test_a_gpu_rank_sets_its_device_before_nccl_joins(monkeypatch):
    """Under torchrun each rank binds its own GPU before the process group exists, and NCCL gets that
    device (else every rank's first NCCL context lands on GPU 0). A GPU is faked."""
    import torch
    import torch.distributed as dist

    from sleuth.train import distributed

    calls = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.append(("init", kw)))
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    ctx = distributed.init_distributed()
    assert (ctx.rank, ctx.world_size, ctx.local_rank) == (1, 2, 1)
    assert calls == [("set_device", 1), ("init", {"backend": "nccl", "device_id": torch.device("cuda", 1)})]
