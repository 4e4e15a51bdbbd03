"""TP broadcast of one multi-image request, pixels pickled (cpu transport, the baseline) vs pixels in
shared memory (shm transport), in one run: two ranks over gloo on this machine.

For each image count, rank 0 broadcasts a TokenizedGenerateReqInput carrying N images of 1280x720
as Qwen3-VL pixel_values (3680 patches x 1536 float32 = 22.6 MB each) the way the scheduler does
(`broadcast_pyobj`), and with shm the ranks then map the segments and rank 0 unlinks them after a
barrier (`Scheduler._unwrap_shm_features`). Reported: broadcast wall time on rank 0, materialize +
barrier + unlink time, and the tokenizer-side cost of writing the segments.

`--carriers float32,uint8` also sends each image the SGLANG_MM_UINT8_PIXELS way (the 736x1280x3 uint8
resized image and its PixelNorm, 2.8 MB) in the same run, and times turning it into the pixel values on
each rank (`raw_pixels.item_pixels`, on the CPU here), the work that moves from the tokenizer to the rank.

  python benchmark/multimodal/bench_tp_broadcast.py --counts 1,2,4,8,16,32
  python benchmark/multimodal/bench_tp_broadcast.py --counts 1,4,16,32 --carriers float32,uint8
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import time
from pathlib import Path

from sglang.srt.utils.network import pick_unused_port

PATCHES_720P = 3680  # smart_resize(720, 1280, 32, 65536, 16777216) -> 736x1280 -> 46x80 patches
PATCH_DIM = 3 * 2 * 16 * 16
RESIZED_720P = (736, 1280, 3)


def _norm():
    from sglang.srt.multimodal.mm_types import PixelNorm

    # Qwen3-VL's image processor: patch 16, temporal patch 2, merge 2, mean/std 0.5, rescale 1/255
    return PixelNorm("image", 16, 2, 2, (0.5,) * 3, (0.5,) * 3, True, 1 / 255, True)


def _request(n_images: int, shm_prefix: str | None, carrier: str = "float32"):
    import torch

    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem, MultimodalInputs
    from sglang.srt.multimodal.transport.shm import mm_items_to_shm
    from sglang.srt.sampling.sampling_params import SamplingParams

    items, ids = [], [1, 2, 3]
    for _ in range(n_images):
        start = len(ids) + 1
        ids += [151652] + [151655] * (PATCHES_720P // 4) + [151653]
        if carrier == "uint8":
            feature, norm = torch.randint(0, 256, RESIZED_720P, dtype=torch.uint8), _norm()
        else:
            feature, norm = torch.rand(PATCHES_720P, PATCH_DIM), None
        items.append(MultimodalDataItem(Modality.IMAGE, feature=feature, image_grid_thw=(1, 46, 80),
                                        offsets=[(start, start + PATCHES_720P // 4)], pixel_norm=norm))
    mm = MultimodalInputs(mm_items=items, mrope_positions=torch.zeros(3, len(ids), dtype=torch.int64))
    write_ms = 0.0
    if shm_prefix is not None:
        t0 = time.perf_counter()
        mm_items_to_shm(mm, shm_prefix)
        write_ms = (time.perf_counter() - t0) * 1e3
    return TokenizedGenerateReqInput("bench", ids, SamplingParams(max_new_tokens=1), mm), write_ms


def _rank(rank: int, port: int, counts: list[int], repeats: int, queue, carriers=("float32",)) -> None:
    import torch
    import torch.distributed as dist

    from sglang.srt.distributed.communication_op import broadcast_pyobj
    from sglang.srt.distributed.parallel_state import init_tp_group
    from sglang.srt.multimodal.raw_pixels import item_pixels
    from sglang.srt.multimodal.transport.shm import materialize_mm_features, segment_prefix, unlink_segments

    torch.set_num_threads(1)
    tp = init_tp_group(2, rank, f"127.0.0.1:{port}", "gloo", 600)
    prefix = segment_prefix(0)
    rows = []
    for n in [counts[0]] + counts:  # the first pass warms up allocators and the gloo pairs
        warmup = not rows
        for carrier, mode in [(c, m) for c in carriers for m in ("cpu", "shm")]:
            for _ in range(repeats):
                msgs, write_ms = ([], 0.0)
                if rank == 0:
                    req, write_ms = _request(n, prefix if mode == "shm" else None, carrier)
                    msgs = [req]
                dist.barrier(group=tp.cpu_group)
                t0 = time.perf_counter()
                got = broadcast_pyobj(msgs, tp)
                bcast_ms = (time.perf_counter() - t0) * 1e3
                t0 = time.perf_counter()
                names = materialize_mm_features(got)
                if names:
                    dist.barrier(group=tp.cpu_group)
                    if rank == 0:
                        unlink_segments(names)
                unwrap_ms = (time.perf_counter() - t0) * 1e3
                t0 = time.perf_counter()  # uint8: the rank finishes the pixel values (the ViT's input)
                shapes = [tuple((item_pixels(it, "cpu") if carrier == "uint8" else it.feature).shape)
                          for it in got[0].mm_inputs.mm_items]
                finish_ms = (time.perf_counter() - t0) * 1e3 if carrier == "uint8" else 0.0
                ok = all(s == (PATCHES_720P, PATCH_DIM) for s in shapes)
                rows.append({"images": n, "mode": mode, "carrier": carrier, "broadcast_ms": bcast_ms,
                             "unwrap_ms": unwrap_ms, "finish_ms": finish_ms, "shm_write_ms": write_ms, "ok": ok,
                             "warmup": warmup})
                del got, msgs
    queue.put((rank, rows))
    dist.barrier(group=tp.cpu_group)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counts", default="1,2,4,8,16,32")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--carriers", default="float32", help="float32 (baseline), uint8 (SGLANG_MM_UINT8_PIXELS) or both")
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    carriers = tuple(args.carriers.split(","))
    port = pick_unused_port()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, counts, args.repeats, q, carriers)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(q.get() for _ in procs)
    for p in procs:
        p.join()
    r0 = results[0]
    assert all(r["ok"] for rs in results.values() for r in rs), "a rank received wrong data"

    def med(n, mode, key, carrier="float32"):
        vals = sorted(r[key] for r in r0
                      if r["images"] == n and r["mode"] == mode and r["carrier"] == carrier and not r["warmup"])
        return vals[len(vals) // 2]

    if carriers != ("float32",):
        _carrier_table(counts, carriers, med, args.output)
        return

    print("TP=2 (gloo, one machine), one request of N x 1280x720 images (22.6 MB of pixels each); median ms, rank 0")
    print(f"{'images':>6} {'MB':>7} {'cpu: broadcast':>15} {'shm: broadcast':>15} {'shm: map+unlink':>16} "
          f"{'shm: write':>11} {'speedup':>8}")
    table = []
    for n in counts:
        row = {"images": n, "mb": n * PATCHES_720P * PATCH_DIM * 4 / 2**20,
               "cpu_broadcast_ms": med(n, "cpu", "broadcast_ms"), "shm_broadcast_ms": med(n, "shm", "broadcast_ms"),
               "shm_unwrap_ms": med(n, "shm", "unwrap_ms"), "shm_write_ms": med(n, "shm", "shm_write_ms")}
        row["speedup"] = row["cpu_broadcast_ms"] / row["shm_broadcast_ms"]
        table.append(row)
        print(f"{n:>6} {row['mb']:>7.0f} {row['cpu_broadcast_ms']:>15.1f} {row['shm_broadcast_ms']:>15.2f} "
              f"{row['shm_unwrap_ms']:>16.2f} {row['shm_write_ms']:>11.1f} {row['speedup']:>7.0f}x")
    if args.output:
        Path(args.output).write_text(json.dumps({"rows": table, "raw": results}, indent=2))


def _carrier_table(counts, carriers, med, output) -> None:
    """One row per image count and carrier: MB per request, broadcast (inline pickle / shm pointers),
    shm map + unlink, shm write (tokenizer side), finishing the pixel values on the rank (uint8 only)."""
    mb = {"float32": PATCHES_720P * PATCH_DIM * 4 / 2**20, "uint8": math.prod(RESIZED_720P) / 2**20}
    print("TP=2 (gloo, one machine), one request of N x 1280x720 images; median ms, rank 0")
    print(f"{'images':>6} {'carrier':>8} {'MB':>7} {'cpu: broadcast':>15} {'shm: broadcast':>15} "
          f"{'shm: map+unlink':>16} {'shm: write':>11} {'finish on rank':>15}")
    table = []
    for n in counts:
        for c in carriers:
            row = {"images": n, "carrier": c, "mb": n * mb[c], "cpu_broadcast_ms": med(n, "cpu", "broadcast_ms", c),
                   "shm_broadcast_ms": med(n, "shm", "broadcast_ms", c), "shm_unwrap_ms": med(n, "shm", "unwrap_ms", c),
                   "shm_write_ms": med(n, "shm", "shm_write_ms", c), "finish_ms": med(n, "shm", "finish_ms", c)}
            table.append(row)
            print(f"{n:>6} {c:>8} {row['mb']:>7.1f} {row['cpu_broadcast_ms']:>15.1f} {row['shm_broadcast_ms']:>15.2f} "
                  f"{row['shm_unwrap_ms']:>16.2f} {row['shm_write_ms']:>11.1f} {row['finish_ms']:>15.1f}")
    if output:
        Path(output).write_text(json.dumps({"rows": table}, indent=2))


if __name__ == "__main__":
    main()
