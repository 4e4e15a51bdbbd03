"""Microbenchmark for [vit-ulysses-sp]: one Qwen3-VL vision tower forward with TP sharding (today:
column/row-parallel linears, two all-reduces per layer) against Ulysses sequence parallelism (whole
weights on each rank, 1/P of the patches, two all-to-alls per layer), both on the same weights in the
same spawned process group; ViT wall time, collective payload per layer, max difference of the outputs,
and a paper estimate of the bytes moved per layer for the seed's TP8 Hopper setup.

  python benchmark/multimodal/bench_vit_ulysses.py --device cpu --ranks 2 --output /tmp/ulysses.json
  python benchmark/multimodal/bench_vit_ulysses.py --device cuda --ranks 2 --output out.json   # >= 2 GPUs

CPU default: a SCALED tower (hidden 288, 4 heads: head_dim 72 and MLP ratio 4304/1152 as in
Qwen3-VL-235B/8B, depth 2) so the seed's 20 x 960x1280 request (96,000 patches) fits a 2-core machine;
CUDA default: the real 235B-class tower (hidden 1152, 16 heads, intermediate 4304, depth 27, bf16).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vit_op_timing import device_name, print_table, write_json  # noqa: E402

from sglang.srt.distributed.sequence_parallel import bytes_per_layer  # noqa: E402
from sglang.srt.utils.network import pick_unused_port  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# name -> list of (count, width, height)
WORKLOADS = {
    "20x960x1280": [(20, 960, 1280)],
    "4x960x1280": [(4, 960, 1280)],
    "mixed": [(1, 1280, 960), (3, 640, 480), (4, 320, 320)],
    "1x640x480": [(1, 640, 480)],
}
SEED = {"model": "Qwen3-VL-235B, TP8, H100-class", "request": "20 x 960x1280 (~96,000 ViT tokens)",
        "tp_allreduce_share": 0.307, "vit_ms": {"tp": 383, "ulysses": 244}, "ttft_ms": {"tp": 766, "ulysses": 510}}


def grids_for(workload, patch: int) -> list[tuple[int, int, int]]:
    return [(1, h // patch, w // patch) for count, w, h in workload for _ in range(count)]


class ByteCounter:
    """Wraps the torch.distributed calls the towers make and records, per call, the bytes this rank
    puts on the wire: ring all-reduce 2(P-1)/P of the tensor, all-to-all the (P-1)/P not kept,
    all-gather its tensor to each of P-1 peers."""

    def __init__(self, ranks: int):
        import torch.distributed as dist

        self.p, self.calls = ranks, []
        for name in ("all_reduce", "all_to_all_single", "all_gather"):
            setattr(dist, name, self._wrap(name, getattr(dist, name)))

    def _wrap(self, name, orig):
        p = self.p
        factor = {"all_reduce": 2 * (p - 1) / p, "all_to_all_single": (p - 1) / p, "all_gather": p - 1}[name]

        def call(*args, **kwargs):
            t = args[1] if name in ("all_to_all_single", "all_gather") else args[0]
            self.calls.append((name, t.numel() * t.element_size() * factor))
            return orig(*args, **kwargs)

        return call

    def take(self, depth: int) -> dict:
        """Per forward: the blocks' collectives per layer, and the tail (the merger's all-reduce under TP,
        the gather of the merged rows under Ulysses: the last call)."""
        calls, self.calls = self.calls, []
        kinds = sorted({n for n, _ in calls})
        return {"calls": {k: sum(1 for n, _ in calls if n == k) for k in kinds},
                "wire_bytes_per_layer": sum(b for _, b in calls[:-1]) / depth,
                "wire_bytes_tail": calls[-1][1] if calls else 0}


def _build(args, tp, sp, dtype, device, state=None):
    from sglang.srt.configs.model_config import VisionConfig
    from sglang.srt.layers.attention.vision_attention import configure_vision_attention
    from sglang.srt.models.qwen3_vl import Qwen3VisionTransformer

    cfg = VisionConfig(depth=args.depth, hidden_size=args.hidden, intermediate_size=args.intermediate,
                       num_heads=args.heads, out_hidden_size=args.out_hidden, patch_size=16, temporal_patch_size=2,
                       spatial_merge_size=2, num_position_embeddings=2304, deepstack_visual_indexes=())
    with torch.device(device):
        vit = Qwen3VisionTransformer(cfg, tp, dtype, sp=sp)
    if state is None:  # the full weights, same on every rank (seeded)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in vit.parameters():
                p.copy_((torch.randn(p.shape, generator=g) * 0.02).to(dtype))
    else:  # TP shards taken from the full weights by each parameter's loader
        params = dict(vit.named_parameters())
        with torch.no_grad():
            for name, full in state.items():
                loader = getattr(params[name], "weight_loader", None)
                loader(params[name], full) if loader else params[name].copy_(full)
    configure_vision_attention(vit, "triton" if device.type == "cuda" else "sdpa")
    return vit.eval()


def rank_setup(rank: int, args, port: int):
    """(device, TP group) of one benchmark rank: its threads, its GPU, the group over gloo or NCCL."""
    from sglang.srt.distributed.parallel_state import init_tp_group

    torch.set_num_threads(args.threads)
    device = torch.device(f"cuda:{rank}" if args.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device, init_tp_group(args.ranks, rank, f"127.0.0.1:{port}", "nccl" if device.type == "cuda" else "gloo", 1800)


def time_calls(fn, args, tp, device, rank: int, label: str, after=lambda: None):
    """Warm-up plus timed calls of `fn`, all ranks starting together; `after` runs after each call (the
    byte counters). -> (sorted times of the timed calls in ms, the last output, `after`'s last result)."""
    times, out, extra = [], None, None
    for i in range(args.warmup + args.iters):
        if device.type == "cuda":
            torch.cuda.synchronize()
        tp_barrier(tp)
        start = time.perf_counter()
        with torch.inference_mode():
            out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = (time.perf_counter() - start) * 1e3
        extra = after()
        if i >= args.warmup:
            times.append(elapsed)
        if rank == 0:
            print(f"  [{label}] call {i + 1}/{args.warmup + args.iters}: {elapsed:.1f} ms", flush=True)
    return sorted(times), out, extra


def rank_main(rank: int, args, port: int, queue) -> None:
    from sglang.srt.distributed.parallel_state import SINGLE_RANK

    device, tp = rank_setup(rank, args, port)
    dtype = DTYPES[args.dtype]
    ulysses = _build(args, SINGLE_RANK, tp, dtype, device)
    sharded = _build(args, tp, None, dtype, device, state={k: v for k, v in ulysses.state_dict().items()})
    counter = ByteCounter(args.ranks)
    results = {}
    for name in args.workloads:
        grids = grids_for(WORKLOADS[name], 16)
        n = sum(t * h * w for t, h, w in grids)
        pixels = torch.randn(n, 3 * 2 * 16 * 16, generator=torch.Generator().manual_seed(1)).to(device, dtype)
        row = {"patches": n, "images": len(grids)}
        outs = {}
        for mode, vit in (("tp", sharded), ("ulysses", ulysses)):
            times, out, counted = time_calls(lambda: vit(pixels, grids), args, tp, device, rank, f"{name}] {mode}",
                                             lambda: counter.take(args.depth))
            outs[mode] = out.float()
            row[mode] = {"ms_median": times[len(times) // 2], "ms_all": times, **counted}
        row["max_abs_diff"] = (outs["tp"] - outs["ulysses"]).abs().max().item()
        row["speedup"] = row["tp"]["ms_median"] / row["ulysses"]["ms_median"]
        results[name] = row
    queue.put((rank, results))
    import torch.distributed as dist

    dist.destroy_process_group()


def tp_barrier(tp) -> None:
    import torch.distributed as dist

    dist.barrier(group=tp.group)


def paper_estimate(args) -> dict:
    """Bytes each rank sends per layer at the seed's shape and TP8, and the link time they need."""
    tokens = 20 * (960 // 16) * (1280 // 16)
    b = bytes_per_layer(tokens, 1152, 8, 2)
    gbps = args.link_gbps * 1e9
    depth = 27
    return {
        "tokens": tokens, "hidden": 1152, "ranks": 8, "dtype": "bfloat16", "depth": depth,
        "formula": "TP: 2 ring all-reduces x 2(P-1)/P x N*H*b; Ulysses: 4 all-to-all tensors x (P-1)/P x (N/P)*H*b",
        "tp_bytes_per_layer": b["tp"], "ulysses_bytes_per_layer": b["ulysses"], "ratio": b["ratio"],
        "link_GBps_assumed": args.link_gbps,
        "tp_comm_ms_per_forward": b["tp"] * depth / gbps * 1e3,
        "ulysses_comm_ms_per_forward": b["ulysses"] * depth / gbps * 1e3,
        "seed": SEED,
    }


REAL_TOWER = dict(hidden=1152, heads=16, intermediate=4304, out_hidden=4096, depth=27)
SCALED_TOWER = dict(hidden=288, heads=4, intermediate=1076, out_hidden=1024, depth=2)


def resolve_tower_args(args, cpu_workloads: list[str]) -> dict:
    """Fills what the command line left out (the real tower on CUDA, a scaled one with the real head_dim
    and MLP ratio on CPU; dtype, workloads, warm-up and iterations) and returns the payload's common
    head; its "skipped" is set when CUDA has fewer GPUs than ranks."""
    cuda = args.device == "cuda"
    for k, v in (REAL_TOWER if cuda else SCALED_TOWER).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
    args.workloads = args.workloads or (sorted(WORKLOADS) if cuda else cpu_workloads)
    args.warmup = args.warmup if args.warmup is not None else (2 if cuda else 1)
    args.iters = args.iters if args.iters is not None else (10 if cuda else 3)
    tower = {k: getattr(args, k) for k in REAL_TOWER}
    payload = {"device": device_name(args.device), "ranks": args.ranks, "dtype": args.dtype, "tower": tower,
               "tower_note": "real Qwen3-VL-235B/8B-class tower" if tower == REAL_TOWER else
               "SCALED tower: real head_dim (72) and MLP ratio, fewer channels/heads/layers"}
    if cuda and torch.cuda.device_count() < args.ranks:
        payload["skipped"] = f"needs >= {args.ranks} GPUs, found {torch.cuda.device_count()}"
    return payload


def run_ranks(rank_fn, args) -> dict:
    """Runs `rank_fn(rank, args, port, queue)` in one spawned process per rank; rank 0's results."""
    import multiprocessing as mp

    port = pick_unused_port()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=rank_fn, args=(r, args, port, q)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    results = dict(q.get() for _ in procs)
    for p in procs:
        p.join()
    return results[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default float32 on cpu, bfloat16 on cuda")
    ap.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=None)
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--intermediate", type=int, default=None)
    ap.add_argument("--out-hidden", type=int, default=None)
    ap.add_argument("--depth", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (cpu)")
    ap.add_argument("--link-gbps", type=float, default=360.0,
                    help="paper estimate: achieved per-GPU NVLink GB/s (H100 NVLink4: 450 per direction)")
    ap.add_argument("--output")
    args = ap.parse_args()
    payload = resolve_tower_args(args, ["1x640x480", "mixed", "4x960x1280", "20x960x1280"])
    payload["paper_estimate"] = paper_estimate(args)
    if "skipped" in payload:
        print(payload["skipped"])
        write_json(args.output, payload)
        return
    print(f"tower {payload['tower']} ({payload['tower_note']}), {args.ranks} ranks, {args.dtype}, {args.device}",
          flush=True)
    results = payload["results"] = run_ranks(rank_main, args)
    rows = [[name, r["patches"], f"{r['tp']['ms_median']:.1f}", f"{r['ulysses']['ms_median']:.1f}", f"{r['speedup']:.2f}x",
             f"{r['tp']['wire_bytes_per_layer'] / 2**20:.2f}", f"{r['ulysses']['wire_bytes_per_layer'] / 2**20:.2f}",
             f"{r['max_abs_diff']:.1e}"] for name, r in results.items()]
    print_table(["workload", "patches", "TP ms", "Ulysses ms", "speedup", "TP MiB/layer/rank", "Ulysses MiB/layer/rank",
                 "max |diff|"], rows)
    est = payload["paper_estimate"]
    print(f"paper estimate, TP8 bf16, {est['tokens']} tokens, hidden 1152: "
          f"TP {est['tp_bytes_per_layer'] / 2**20:.0f} MiB/layer/rank, Ulysses {est['ulysses_bytes_per_layer'] / 2**20:.0f} "
          f"({est['ratio']:.0f}x less); at {args.link_gbps:g} GB/s over 27 layers: "
          f"{est['tp_comm_ms_per_forward']:.0f} vs {est['ulysses_comm_ms_per_forward']:.0f} ms")
    write_json(args.output, payload)
    if not args.output:
        print(json.dumps(payload["paper_estimate"], indent=1))


if __name__ == "__main__":
    main()
