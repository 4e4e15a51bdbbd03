"""Run one static batch through the model without a server: prompt (+ images) -> greedy tokens,
with prefill and decode timings. `python -m sglang.bench_one_batch --help`."""

from __future__ import annotations

import argparse
import json
import time

import torch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang.bench_one_batch", description=__doc__)
    ap.add_argument("--model-path", default=None, help="HF-format model dir (default: the embedded tiny Qwen3-VL)")
    ap.add_argument("--prompt", default="Describe this image.")
    ap.add_argument("--image", action="append", default=None, help="image path/URL/data URL (repeatable); "
                    "default: one built-in test card; pass --no-image for text only")
    ap.add_argument("--no-image", action="store_true")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--chunked-prefill-size", type=int, default=None)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--load-format", default="auto", choices=("auto", "safetensors", "dummy"),
                    help="dummy: random weights made on the device from config.json alone (timings only)")
    ap.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerConfig
    from sglang.srt.model_executor.static_batch import StaticBatchRunner, StaticSeq
    from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor
    from sglang.testing.make_model import ensure_model
    from sglang.testing.sample_image import test_card

    model_path = args.model_path or str(ensure_model("qwen3-vl-tiny"))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    processor = QwenVLProcessor.from_pretrained(model_path, tokenizer)
    images = [] if args.no_image else (args.image or [test_card()])
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": args.prompt}]
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True)

    t0 = time.perf_counter()
    runner = ModelRunner(ModelRunnerConfig(model_path=model_path, dtype=args.dtype, device=args.device,
                                           max_running_requests=max(8, args.batch_size), load_format=args.load_format))
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    prompts = [processor.process(text, images) for _ in range(args.batch_size)]
    process_s = time.perf_counter() - t0
    sb = StaticBatchRunner(runner)
    seqs = [StaticSeq(ids, mm if mm.mm_items else None) for ids, mm in prompts]
    eos = tuple(runner.model_config.eos_token_ids)

    def sync():
        if runner.device.type == "cuda":
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    logits, _ = sb.extend(seqs, args.chunked_prefill_size)
    sync()
    prefill_s = time.perf_counter() - t0
    tokens = logits.argmax(-1).tolist()
    for s, t in zip(seqs, tokens):
        s.output_ids.append(t)
    t0 = time.perf_counter()
    for _ in range(args.output_len - 1):
        live = [s for s in seqs if s.output_ids[-1] not in eos]
        if not live:
            break
        nxt = sb.decode(live, [s.output_ids[-1] for s in live]).argmax(-1).tolist()
        for s, t in zip(live, nxt):
            s.output_ids.append(t)
    sync()
    decode_s = time.perf_counter() - t0
    steps = max(len(s.output_ids) for s in seqs) - 1
    sb.release(seqs)

    result = {
        "model_path": model_path,
        "batch_size": args.batch_size,
        "num_images": len(images),
        "input_len": len(seqs[0].input_ids),
        "output_len": len(seqs[0].output_ids),
        "load_s": round(load_s, 3),
        "preprocess_ms": round(process_s * 1e3, 2),
        "prefill_ms": round(prefill_s * 1e3, 2),
        "decode_ms_per_step": round(decode_s * 1e3 / max(steps, 1), 2),
        "text": tokenizer.decode(seqs[0].output_ids, skip_special_tokens=True),
        "output_ids": seqs[0].output_ids,
    }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>20}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
