"""The same weights in HF transformers (`generate`, batched) against our engine's batch, on one device:
B requests of one image + text, greedy, N new tokens, output tokens per second each way.

    python benchmark/performance/bench_hf_reference.py --model-path DIR --device cuda --dtype bfloat16 \
        --batch-size 32 --output-len 64 --image 1280x720

Without --model-path the embedded tiny Qwen3-VL is used. Target printed (>= 20x at batch 32 on a GPU);
no assertion. Our side here is the engine's model runner with a static batch (no HTTP); the serving
figure comes from `python -m sglang.bench_serving` against a running server.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

TARGET_SPEEDUP = 20.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--image", default="640x360", help="one WxH image per request")
    ap.add_argument("--text-tokens", type=int, default=64)
    ap.add_argument("--output", default=None)
    args = ap.parse_args(argv)

    import transformers

    from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerConfig
    from sglang.srt.model_executor.static_batch import StaticBatchRunner, StaticSeq
    from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor
    from sglang.testing.make_model import ensure_model
    from sglang.testing.sample_image import test_card

    model_path = args.model_path or str(ensure_model("qwen3-vl-tiny"))
    dtype = getattr(torch, args.dtype)
    processor = QwenVLProcessor.from_pretrained(model_path)
    w, h = (int(x) for x in args.image.split("x"))
    g = torch.Generator().manual_seed(0)
    prompts = []
    for i in range(args.batch_size):
        text = torch.randint(100, 5000, (args.text_tokens,), generator=g).tolist()
        prompts.append(processor.process([151652, 151655, 151653] + text, [test_card(w + 32 * (i % 3), h)]))

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    # ---- ours
    runner = ModelRunner(ModelRunnerConfig(model_path=model_path, dtype=args.dtype, device=args.device,
                                           max_running_requests=args.batch_size + 1,
                                           max_total_tokens=args.batch_size * (max(len(i) for i, _ in prompts) + args.output_len + 8)))
    sb = StaticBatchRunner(runner)
    warm = [StaticSeq(list(prompts[0][0]), prompts[0][1])]
    sb.generate_greedy(warm, max_new_tokens=2)
    sb.release(warm)
    seqs = [StaticSeq(list(ids), mm) for ids, mm in prompts]
    sync()
    t0 = time.perf_counter()
    outs = sb.generate_greedy(seqs, max_new_tokens=args.output_len)
    sync()
    ours_s = time.perf_counter() - t0
    sb.release(seqs)
    ours_tokens = sum(len(o) for o in outs)
    del runner, sb

    # ---- transformers: left-padded batch, the same pixel values
    tok = transformers.AutoTokenizer.from_pretrained(model_path)
    hf = transformers.AutoModelForImageTextToText.from_pretrained(model_path, dtype=dtype).eval().to(args.device)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 151643
    longest = max(len(ids) for ids, _ in prompts)
    input_ids = torch.full((len(prompts), longest), pad, dtype=torch.long)
    attn = torch.zeros_like(input_ids)
    for i, (ids, _) in enumerate(prompts):
        input_ids[i, longest - len(ids):] = torch.tensor(ids)
        attn[i, longest - len(ids):] = 1
    pixels = torch.cat([torch.as_tensor(it.feature) for _, mm in prompts for it in mm.mm_items]).to(args.device, dtype)
    grids = torch.tensor([list(it.image_grid_thw) for _, mm in prompts for it in mm.mm_items], device=args.device)
    kw = dict(input_ids=input_ids.to(args.device), attention_mask=attn.to(args.device), pixel_values=pixels,
              image_grid_thw=grids, mm_token_type_ids=(input_ids == 151655).long().to(args.device),
              max_new_tokens=args.output_len, min_new_tokens=args.output_len, do_sample=False)
    sync()
    t0 = time.perf_counter()
    with torch.no_grad():
        hf.generate(**kw)
    sync()
    hf_s = time.perf_counter() - t0
    hf_tokens = len(prompts) * args.output_len

    res = {"model_path": model_path, "device": args.device, "dtype": args.dtype, "batch_size": args.batch_size,
           "output_len": args.output_len, "image": args.image, "ours_s": ours_s, "hf_s": hf_s,
           "ours_tok_per_s": ours_tokens / ours_s, "hf_tok_per_s": hf_tokens / hf_s}
    res["speedup"] = res["ours_tok_per_s"] / res["hf_tok_per_s"]
    print(f"batch {args.batch_size}, {args.output_len} new tokens, one {args.image} image each, {args.device} {args.dtype}")
    print(f"  ours          {ours_s:8.2f} s  {res['ours_tok_per_s']:10.1f} output tok/s")
    print(f"  transformers  {hf_s:8.2f} s  {res['hf_tok_per_s']:10.1f} output tok/s")
    print(f"  speedup {res['speedup']:.2f}x (target >= {TARGET_SPEEDUP:.0f}x at batch 32 on a GPU)")
    if args.output:
        with open(args.output, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
