"""ViT time with and without the token-budget graphs (SGLANG_VIT_ENABLE_CUDA_GRAPH), both in one process
on the same tower: eager `tower(pixels, grids)` against `ViTCudaGraphRunner` (captured on CUDA; on CPU
the padded path runs eagerly, so the CPU figure is the cost of padding to the bucket, not a graph gain).

    python benchmark/multimodal/bench_vit_cuda_graph.py --images 1,4,16 --image-size 448x448
    python benchmark/multimodal/bench_vit_cuda_graph.py --model-path /tmp/qwen3-vl-4b --device cuda \
        --dtype bfloat16 --images 1,4,16 --image-size 448x448
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _timed(fn, device: torch.device, repeat: int) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", default=None, help="default: the generated qwen3-vl-tiny")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--images", default="1,4,16")
    ap.add_argument("--image-size", default="448x448", help="WxH of every image")
    ap.add_argument("--buckets", default=None, help="patch budgets (default: the runner's)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--output", default=None)
    args = ap.parse_args(argv)

    from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerConfig
    from sglang.srt.model_executor.vit_cuda_graph_runner import ViTCudaGraphRunner, token_buckets
    from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor
    from sglang.testing.make_model import ensure_model
    from sglang.testing.sample_image import test_card

    path = args.model_path or str(ensure_model("qwen3-vl-tiny"))
    runner = ModelRunner(ModelRunnerConfig(model_path=path, dtype=args.dtype, device=args.device, max_total_tokens=1024,
                                           max_running_requests=2, context_length=1024))
    device, model, tower = runner.device, runner.model, runner.model.visual
    graphs = ViTCudaGraphRunner(tower, token_buckets(args.buckets, tower.merge**2), capture=device.type == "cuda")
    processor = QwenVLProcessor.from_pretrained(path)
    w, h = (int(x) for x in args.image_size.split("x"))
    rows = []
    print(f"{'images':>7} {'patches':>8} {'bucket':>7} {'eager ms':>9} {'graph ms':>9} {'speedup':>8} {'max diff':>9}")
    for n in (int(x) for x in args.images.split(",") if x):
        _, mm = processor.process([151652, 151655, 151653] * n, [test_card(w, h) for _ in range(n)])
        grids = [tuple(int(v) for v in it.image_grid_thw) for it in mm.mm_items]
        px = model._pixels(mm.mm_items, device)
        with torch.no_grad():
            eager = _timed(lambda: tower(px, grids), device, args.repeat)
            graph = _timed(lambda: graphs(px, grids), device, args.repeat)
            diff = (graphs(px, grids).float() - tower(px, grids).float()).abs().max().item()
        bucket = next((b for b in graphs.buckets if b >= px.shape[0]), None)
        rows.append({"images": n, "patches": px.shape[0], "bucket": bucket, "eager_ms": eager * 1e3,
                     "graph_ms": graph * 1e3, "max_abs_diff": diff})
        print(f"{n:>7} {px.shape[0]:>8} {bucket or '-':>7} {eager * 1e3:>9.2f} {graph * 1e3:>9.2f} "
              f"{eager / graph:>7.2f}x {diff:>9.2e}")
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"device": str(device), "model_path": path, "captured": graphs.capture, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
