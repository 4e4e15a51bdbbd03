"""NCCL group start-up on GPUs: two ranks join through init_tp_group, all-reduce on the device and
broadcast an object over the gloo CPU group, as the schedulers do at TP=2."""

from __future__ import annotations

import pytest
import torch

from sglang.testing.ranks import run_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                       reason="an NCCL group of two ranks needs two CUDA devices (NCCL refuses two ranks on one GPU)"),
]


def _rank_main(rank: int, port: int, q) -> None:
    from sglang.srt.distributed.communication_op import broadcast_pyobj
    from sglang.srt.distributed.parallel_state import init_tp_group

    torch.cuda.set_device(rank)
    tp = init_tp_group(2, rank, f"127.0.0.1:{port}", "nccl", 60)
    import torch.distributed as dist

    t = torch.full((4,), float(rank + 1), device="cuda")
    dist.all_reduce(t, group=tp.group)
    obj = broadcast_pyobj([{"rid": "x", "rank0": True}] if rank == 0 else [], tp)
    q.put((rank, t.cpu().tolist(), obj))
    dist.destroy_process_group()


def test_nccl_group_of_two_reduces_and_broadcasts():
    results = run_ranks(_rank_main)
    for rank in (0, 1):
        vals, obj = results[rank]
        assert vals == [3.0] * 4
        assert obj == [{"rid": "x", "rank0": True}]
