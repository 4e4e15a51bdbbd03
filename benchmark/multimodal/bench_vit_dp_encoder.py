"""Microbenchmark for [vit-dp-encoder]: the ViT stage of one encode call (`get_image_feature`) with the
vision tower TP-sharded (today: every rank runs every image through column/row-parallel linears, two
all-reduces per layer) against the data-parallel encoder (`--mm-enable-dp-encoder`: whole weights on each
rank, the call's images split over the ranks balanced by patch count, one all-gather of the embeddings),
both on the same weights in the same spawned process group; wall time, collective calls and bytes, the
per-rank patch split, and the max difference of the embeddings.

  python benchmark/multimodal/bench_vit_dp_encoder.py --device cpu --ranks 2 --output /tmp/dp_encoder.json
  python benchmark/multimodal/bench_vit_dp_encoder.py --device cuda --ranks 2 --output out.json   # >= 2 GPUs

Tower shapes as in bench_vit_ulysses.py (CPU: the SCALED Qwen3-VL tower, hidden 288, 4 heads, depth 2;
CUDA: the real 235B-class tower, bf16).
"""

from __future__ import annotations

import argparse
import os
import sys
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_vit_ulysses import (  # noqa: E402
    DTYPES, ByteCounter, _build, grids_for, rank_setup, resolve_tower_args, run_ranks, time_calls,
)
from vit_op_timing import device_name, print_table, write_json  # noqa: E402


# name -> list of (count, width, height)
WORKLOADS = {
    "1x640x480": [(1, 640, 480)],
    "2x640x480": [(2, 640, 480)],
    "mixed": [(1, 1280, 960), (3, 640, 480), (4, 320, 320)],
    "4x960x1280": [(4, 960, 1280)],
    "8x640x480": [(8, 640, 480)],
}


def _encoder(tower, cfg, group):
    """The models' `get_image_feature` around a bare tower: `vision_dp` set = the data-parallel path."""
    from sglang.srt.models.vlm_base import QwenVLForConditionalGenerationBase

    m = QwenVLForConditionalGenerationBase(SimpleNamespace(vision=cfg))
    m.visual = tower
    m.vision_dp = group
    return m


def rank_main(rank: int, args, port: int, queue) -> None:
    from sglang.srt.distributed.dp_encoder import balanced_split
    from sglang.srt.distributed.parallel_state import SINGLE_RANK
    from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem

    device, tp = rank_setup(rank, args, port)
    dtype = DTYPES[args.dtype]
    whole = _build(args, SINGLE_RANK, None, dtype, device)
    sharded = _build(args, tp, None, dtype, device, state={k: v for k, v in whole.state_dict().items()})
    cfg = whole.cfg
    encoders = {"tp": _encoder(sharded, cfg, None), "dp": _encoder(whole, cfg, tp)}
    counter = ByteCounter(args.ranks)
    results = {}
    for name in args.workloads:
        grids = grids_for(WORKLOADS[name], 16)
        g = torch.Generator().manual_seed(1)
        items = [MultimodalDataItem(modality=Modality.IMAGE, image_grid_thw=grid,
                                    feature=torch.randn(grid[0] * grid[1] * grid[2], 3 * 2 * 16 * 16, generator=g).to(dtype))
                 for grid in grids]
        costs = [t * h * w for t, h, w in grids]
        row = {"patches": sum(costs), "images": len(grids),
               "dp_patches_per_rank": [sum(costs[i] for i in idx) for idx in balanced_split(costs, args.ranks)]}
        outs = {}
        for mode, enc in encoders.items():
            def take():
                calls, counter.calls = counter.calls, []
                return calls

            times, out, calls = time_calls(lambda: enc.get_image_feature(items), args, tp, device, rank,
                                           f"{name}] {mode}", take)
            outs[mode] = torch.cat(out).float()
            kinds = sorted({n for n, _ in calls})
            row[mode] = {"ms_median": times[len(times) // 2], "ms_all": times,
                         "calls": {k: sum(1 for n, _ in calls if n == k) for k in kinds},
                         "wire_bytes": sum(b for _, b in calls)}
        row["max_abs_diff"] = (outs["tp"] - outs["dp"]).abs().max().item()
        row["speedup"] = row["tp"]["ms_median"] / row["dp"]["ms_median"]
        results[name] = row
    queue.put((rank, results))
    import torch.distributed as dist

    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default float32 on cpu, bfloat16 on cuda")
    ap.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=None)
    for k in ("hidden", "heads", "intermediate", "out-hidden", "depth", "warmup", "iters"):
        ap.add_argument(f"--{k}", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (cpu)")
    ap.add_argument("--output")
    args = ap.parse_args()
    payload = resolve_tower_args(args, list(WORKLOADS))
    if "skipped" in payload:
        print(payload["skipped"])
        write_json(args.output, payload)
        return
    print(f"tower {payload['tower']} ({payload['tower_note']}), {args.ranks} ranks, {args.dtype}, {args.device}",
          flush=True)
    results = payload["results"] = run_ranks(rank_main, args)
    rows = [[name, r["images"], r["patches"], "/".join(map(str, r["dp_patches_per_rank"])),
             f"{r['tp']['ms_median']:.1f}", f"{r['dp']['ms_median']:.1f}", f"{r['speedup']:.2f}x",
             f"{r['tp']['wire_bytes'] / 2**20:.2f}", f"{r['dp']['wire_bytes'] / 2**20:.2f}", f"{r['max_abs_diff']:.1e}"]
            for name, r in results.items()]
    print_table(["workload", "images", "patches", "DP patches/rank", "TP-sharded ms", "DP ms", "speedup",
                 "TP MiB sent/rank", "DP MiB sent/rank", "max |diff|"], rows)
    write_json(args.output, payload)


if __name__ == "__main__":
    main()
