"""Where a forward's time goes: torch.profiler over a few eager decode steps and one ViT call, printed as
the ops with the most host time and the most device time. For the case where bench_forward.py's step is
far above its floor and the question is whether the host, a sync, or a kernel is the cause.

    python benchmark/performance/profile_forward.py --model-path /tmp/qwen3-vl-4b-4l --device cuda \
        --dtype bfloat16 --batch-size 1 --vit-images 2 --top 25 --trace /tmp/forward_trace.json
"""

from __future__ import annotations

import argparse
import time

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _table(prof, sort_by: str, top: int) -> str:
    return prof.key_averages().table(sort_by=sort_by, row_limit=top, max_name_column_width=60)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=3, help="profiled decode steps (after 3 unprofiled ones)")
    ap.add_argument("--vit-images", type=int, default=2)
    ap.add_argument("--vit-image-size", default="960x1280")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--trace", default=None, help="also write a Chrome trace of the decode steps")
    args = ap.parse_args(argv)

    from torch.profiler import ProfilerActivity, profile

    from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerConfig
    from sglang.srt.model_executor.static_batch import StaticBatchRunner, StaticSeq
    from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor
    from sglang.testing.make_model import ensure_model
    from sglang.testing.sample_image import test_card

    model_path = args.model_path or str(ensure_model("qwen3-vl-tiny"))
    bs = args.batch_size
    runner = ModelRunner(ModelRunnerConfig(model_path=model_path, dtype=args.dtype, device=args.device,
                                           max_total_tokens=bs * (args.context + 64) + 16384,
                                           max_running_requests=bs + 1, context_length=max(8192, args.context + 64)))
    device = runner.device
    sb = StaticBatchRunner(runner)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort_dev = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"

    g = torch.Generator().manual_seed(0)
    seqs = [StaticSeq(torch.randint(100, 5000, (args.context,), generator=g).tolist()) for _ in range(bs)]
    logits, _ = sb.extend(seqs)
    toks = logits.argmax(-1).tolist()
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        toks = sb.decode(seqs, toks).argmax(-1).tolist()
        walls.append(time.perf_counter() - t0)
    print(f"decode batch {bs}, context {args.context}: unprofiled steps " + ", ".join(f"{w * 1e3:.2f}" for w in walls) + " ms")
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            toks = sb.decode(seqs, toks).argmax(-1).tolist()
    sb.release(seqs)
    print(f"\n== decode x{args.steps}: by host time ==\n{_table(prof, 'cpu_time_total', args.top)}")
    if device.type == "cuda":
        print(f"\n== decode x{args.steps}: by device time ==\n{_table(prof, sort_dev, args.top)}")
    if args.trace:
        prof.export_chrome_trace(args.trace)

    if args.vit_images > 0:
        w, h = (int(x) for x in args.vit_image_size.split("x"))
        processor = QwenVLProcessor.from_pretrained(model_path)
        _, vmm = processor.process([151652, 151655, 151653] * args.vit_images,
                                   [test_card(w, h) for _ in range(args.vit_images)])
        with torch.no_grad():
            runner.model.get_image_feature(vmm.mm_items)
            _sync(device)
            t0 = time.perf_counter()
            runner.model.get_image_feature(vmm.mm_items)
            _sync(device)
            print(f"\nViT {args.vit_images} x {w}x{h}: unprofiled {1e3 * (time.perf_counter() - t0):.1f} ms")
            with profile(activities=activities) as vprof:
                runner.model.get_image_feature(vmm.mm_items)
                _sync(device)
        print(f"\n== ViT: by host time ==\n{_table(vprof, 'cpu_time_total', args.top)}")
        if device.type == "cuda":
            print(f"\n== ViT: by device time ==\n{_table(vprof, sort_dev, args.top)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
