"""broadcast_pyobj's timing on a receiving rank covers the transfer, not the wait for the source rank
to arrive: with rank 0 held back for DELAY_S before broadcasting, rank 1's figure stays far below it."""

from __future__ import annotations

import time


from sglang.testing.ranks import run_ranks

DELAY_S = 1.0


def _rank_main(rank: int, port: int, q) -> None:
    import torch.distributed as dist

    from sglang.srt.distributed.communication_op import broadcast_pyobj
    from sglang.srt.distributed.parallel_state import init_tp_group

    tp = init_tp_group(2, rank, f"127.0.0.1:{port}", "gloo", 60)
    dist.barrier(group=tp.cpu_group)  # both ranks start together
    if rank == 0:
        time.sleep(DELAY_S)  # the stimulus: rank 0 still busy (e.g. polling its socket)
    timing: dict = {}
    t0 = time.perf_counter()
    got = broadcast_pyobj({"payload": list(range(1000))} if rank == 0 else None, tp, timing=timing)
    elapsed = time.perf_counter() - t0
    q.put((rank, timing["wall_ms"], elapsed, got["payload"][-1]))
    dist.destroy_process_group()


def test_receiver_times_the_transfer_not_the_wait():
    res = run_ranks(_rank_main)
    ms1, elapsed1, last1 = res[1]
    assert last1 == 999  # the object arrived
    assert elapsed1 >= DELAY_S * 0.9  # rank 1 really waited inside the call ...
    assert ms1 < DELAY_S * 1e3 / 2  # ... and its figure leaves the wait out
