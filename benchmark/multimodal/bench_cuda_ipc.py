"""Microbenchmark for [cuda-ipc-handle-cache]: a receiving rank (another process) turning N pool
pointers into tensors with the pool's handle opened once and kept (SGLANG_USE_IPC_POOL_HANDLE_CACHE=1)
against opening and closing it for every item (=0, the baseline); plus the tokenizer-side copy into the
pool and the slice allocator / release board on their own.

  python benchmark/multimodal/bench_cuda_ipc.py --device cuda --output /tmp/cuda_ipc.json
  python benchmark/multimodal/bench_cuda_ipc.py --device cpu --counts 1,2,4,8,16,32

Items are Qwen-VL pixel values of one 1280x720 image (3680 patches x 1536 float32 = 22.6 MB each).
--device cuda: the pool is GPU memory exported with CUDA IPC, the receiver copies each item to its own
device (what a scheduler rank does). --device cpu: the pool is the /dev/shm stand-in, "open" is a
mapping of it (the same protocol with host memory; the CUDA handle costs are what the GPU run measures).
Receiver times are per request of N items, median over --repeats, after one warm-up request.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vit_op_timing import device_name, print_table, write_json  # noqa: E402

from sglang.srt.multimodal.transport.slice_allocator import SliceAllocator  # noqa: E402

ITEM_SHAPE = (3680, 1536)  # 1280x720 -> Qwen-VL patches (14 px, merge 2) x 3*2*14*14


def _receiver(conn, device: str) -> None:
    from sglang.srt.multimodal.transport.cuda_ipc import CudaIpcReceiver
    from sglang.srt.multimodal.transport.cuda_ipc_handle_cache import IpcHandleCache

    if device == "cuda":
        torch.cuda.set_device(0)
    rx = {True: CudaIpcReceiver(0, IpcHandleCache(enabled=True)),
          False: CudaIpcReceiver(0, IpcHandleCache(enabled=False))}
    while True:
        msg = conn.recv()
        if msg is None:
            break
        ptrs, cached = msg
        r = rx[cached]
        t0 = time.perf_counter()
        outs = [r.materialize(p) for p in ptrs]
        if device == "cuda":
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        r.poll()
        outs.clear()  # drop the tensors before the next request
        conn.send((ms, r.stats()))
    for r in rx.values():
        r.close()


def bench_transport(args) -> list[dict]:
    from sglang.srt.multimodal.transport.cuda_ipc import CudaIpcSender
    from sglang.srt.multimodal.transport.cuda_ipc_pool import CudaIpcPool
    from sglang.srt.multimodal.transport.shm import segment_prefix

    counts = [int(c) for c in args.counts.split(",")]
    item = torch.randn(ITEM_SHAPE, generator=torch.Generator().manual_seed(0))
    nbytes = item.numel() * item.element_size()
    kind = "cuda" if args.device == "cuda" else "host"
    pool = CudaIpcPool(max(counts) * (nbytes + 4096) + (1 << 20), 1, segment_prefix(0, os.getpid()), kind=kind,
                       device="cuda:0" if kind == "cuda" else None, max_slots=256)
    sender = CudaIpcSender(pool, None, wait_s=1.0)
    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=_receiver, args=(child_conn, args.device))
    proc.start()
    rows = []
    try:
        for n in counts:
            times = {True: [], False: [], "send": []}
            for rep in range(args.repeats + 1):
                for cached in (True, False):
                    t0 = time.perf_counter()
                    ptrs = [sender.to_pool(item) for _ in range(n)]
                    send_ms = (time.perf_counter() - t0) * 1e3
                    conn.send((ptrs, cached))
                    ms, _ = conn.recv()
                    if rep:  # the first round is a warm-up (the cached receiver opens the pool there)
                        times[cached].append(ms)
                        times["send"].append(send_ms)
                    while pool.reclaim() < n and pool.num_outstanding:
                        time.sleep(0.001)
            on, off = statistics.median(times[True]), statistics.median(times[False])
            rows.append({"items": n, "pixel_mb": round(n * nbytes / 1e6, 1), "send_ms": statistics.median(times["send"]),
                         "recv_cached_ms": on, "recv_uncached_ms": off, "per_item_cached_ms": on / n,
                         "per_item_uncached_ms": off / n, "speedup": off / on})
        conn.send(None)
        proc.join(60)
    finally:
        if proc.is_alive():
            proc.kill()
        sender.close()
    return rows


def bench_allocator(iters: int) -> dict:
    """Steady state of a 4 GiB pool with 64 live slices of 0.5-23 MB: alloc + free pairs per second."""
    rng = random.Random(0)
    a = SliceAllocator(4 << 30, 512)
    live = []
    sizes = [rng.randint(1 << 19, 23 * 10**6) for _ in range(4096)]
    for i in range(64):
        live.append(a.alloc(sizes[i]))
    t0 = time.perf_counter()
    for i in range(iters):
        a.free(live.pop(rng.randrange(len(live))))
        off = a.alloc(sizes[i % 4096])
        if off is not None:
            live.append(off)
    dt = time.perf_counter() - t0
    return {"allocator_pairs_per_s": iters / dt, "allocator_us_per_pair": dt / iters * 1e6}


def bench_reclaim(outstanding: int, repeats: int) -> dict:
    """The owner's release check over `outstanding` slices (all stamped: the worst case, it frees them)."""
    from sglang.srt.multimodal.transport.cuda_ipc_pool import CudaIpcPool
    from sglang.srt.multimodal.transport.shm import segment_prefix

    pool = CudaIpcPool(outstanding * 512, 2, segment_prefix(0, os.getpid()), kind="host", max_slots=8192)
    try:
        times = []
        for _ in range(repeats):
            slices = [pool.alloc(1) for _ in range(outstanding)]
            for s in slices:
                pool.board.stamp(s.slot, 0, s.generation)
                pool.board.stamp(s.slot, 1, s.generation)
            t0 = time.perf_counter()
            assert pool.reclaim() == outstanding
            times.append((time.perf_counter() - t0) * 1e6)
        # nothing stamped: the common check during allocation when ranks are behind
        slices = [pool.alloc(1) for _ in range(outstanding)]
        t0 = time.perf_counter()
        for _ in range(repeats):
            pool.reclaim()
        idle = (time.perf_counter() - t0) / repeats * 1e6
    finally:
        pool.close()
    return {"reclaim_outstanding": outstanding, "reclaim_all_stamped_us": statistics.median(times),
            "reclaim_none_stamped_us": idle}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    ap.add_argument("--counts", default="1,2,4,8,16,32")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--allocator-iters", type=int, default=200_000)
    ap.add_argument("--skip-transport", action="store_true", help="allocator and release board only")
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device")
    payload = {"device": device_name(args.device if args.device == "cpu" else "cuda:0"), "kind": args.device}
    alloc = bench_allocator(args.allocator_iters)
    rec = bench_reclaim(1024, 20)
    payload.update(alloc)
    payload.update(rec)
    print(f"device: {payload['device']}")
    print(f"slice allocator, 4 GiB, 64 live: {alloc['allocator_pairs_per_s']:,.0f} alloc+free pairs/s "
          f"({alloc['allocator_us_per_pair']:.2f} us)")
    print(f"release check over 1024 outstanding slices: {rec['reclaim_all_stamped_us']:.1f} us all stamped (freed), "
          f"{rec['reclaim_none_stamped_us']:.1f} us none stamped")
    if not args.skip_transport:
        rows = bench_transport(args)
        payload["transport"] = rows
        print_table(["items", "pixel MB", "send ms", "recv cached ms", "recv per-item-open ms", "per item cached",
                     "per item open", "speed-up"],
                    [[r["items"], r["pixel_mb"], r["send_ms"], r["recv_cached_ms"], r["recv_uncached_ms"],
                      r["per_item_cached_ms"], r["per_item_uncached_ms"], r["speedup"]] for r in rows])
    write_json(args.output, payload)


if __name__ == "__main__":
    main()
