"""Forward-pass performance tables: decode step time against the weight-bandwidth floor, prefill
tokens/s and MFU, ViT MFU. One model, one device, no server: `ModelRunner` + `StaticBatchRunner`.

    python benchmark/performance/bench_forward.py --model-path DIR --device cuda --dtype bfloat16 \
        --decode-batch-sizes 1,8,32,64 --prefill-batch-sizes 1,8 --vit-images 20 --output out.json

Without --model-path the embedded tiny Qwen3-VL is used (CPU rows). Figures, not assertions: the
targets (decode <= 1.3x the bandwidth floor at batch 1, ViT MFU >= 50%) are printed beside the results.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

# Dense bf16 peak and HBM bandwidth of known devices (datasheet, SXM). Elsewhere both are measured.
DEVICE_SPECS = {"H100": (989e12, 3.35e12), "H200": (989e12, 4.8e12)}
DECODE_FLOOR_TARGET = 1.3
VIT_MFU_TARGET = 0.50


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, device, repeat: int) -> float:
    """Median wall time of `fn()` in seconds (after one warm-up call)."""
    fn()
    _sync(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def device_peaks(device: torch.device, dtype: torch.dtype) -> dict:
    """Peak FLOP/s and memory bandwidth: datasheet figures for known GPUs, else measured here
    (a large matmul and a large copy), so MFU on a CPU is relative to what this CPU reaches."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    for key, (flops, bw) in DEVICE_SPECS.items():
        if key in name:
            return {"device": name, "peak_flops": flops, "bandwidth": bw, "source": "datasheet"}
    n = 8192 if device.type == "cuda" else 2048
    a = torch.randn(n, n, device=device, dtype=dtype)
    mm_s = _timed(lambda: a @ a, device, 5)
    buf = torch.empty(64 * 2**20 // 4, device=device, dtype=torch.float32)
    cp_s = _timed(lambda: buf.clone(), device, 5)
    return {"device": name, "peak_flops": 2 * n**3 / mm_s, "bandwidth": 2 * buf.numel() * 4 / cp_s, "source": "measured"}


def param_split(model) -> tuple[int, int, int]:
    """(text-side parameters incl. embeddings and lm_head, of which embedding/lm_head matrices, vision
    parameters). Embedding rows are gathered, not multiplied, and lm_head runs on one position per
    request: neither counts per prompt token in the FLOP estimate."""
    vision = sum(p.numel() for n, p in model.named_parameters() if n.startswith("visual."))
    vocab = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" in n or n.startswith("lm_head"))
    total = sum(p.numel() for p in model.parameters())
    return total - vision, vocab, vision


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--decode-batch-sizes", default="1,8,32,64")
    ap.add_argument("--decode-context", type=int, default=1024, help="tokens already in the KV cache per request")
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--prefill-batch-sizes", default="1,8")
    ap.add_argument("--prefill-image", default="1280x720", help="one image of WxH per prefill request")
    ap.add_argument("--prefill-text-tokens", type=int, default=128)
    ap.add_argument("--vit-images", type=int, default=20)
    ap.add_argument("--vit-image-size", default="960x1280", help="WxH of each ViT benchmark image")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--output", default=None, help="write the figures as JSON")
    ap.add_argument("--load-format", default="auto", choices=("auto", "safetensors", "dummy"),
                    help="dummy: weights made on the device from config.json alone (a config-only folder)")
    ap.add_argument("--mm-attention-backends", default="",
                    help="comma list (triton, sdpa): time the ViT under each, beside the default's row")
    args = ap.parse_args(argv)

    from sglang.srt.layers.attention.vision_attention import configure_vision_attention
    from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerConfig
    from sglang.srt.model_executor.static_batch import StaticBatchRunner, StaticSeq
    from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor
    from sglang.testing.make_model import ensure_model
    from sglang.testing.sample_image import test_card

    model_path = args.model_path or str(ensure_model("qwen3-vl-tiny"))
    dec_bs = [int(x) for x in args.decode_batch_sizes.split(",") if x]
    pre_bs = [int(x) for x in args.prefill_batch_sizes.split(",") if x]
    max_bs = max(dec_bs + pre_bs)
    kv_tokens = max_bs * (args.decode_context + args.decode_steps + 8) + 16384
    runner = ModelRunner(ModelRunnerConfig(model_path=model_path, dtype=args.dtype, device=args.device,
                                           max_total_tokens=kv_tokens, max_running_requests=max_bs + 1,
                                           context_length=max(8192, args.decode_context + 64),
                                           load_format=args.load_format))
    device, dtype, model = runner.device, runner.dtype, runner.model
    sb = StaticBatchRunner(runner)
    processor = QwenVLProcessor.from_pretrained(model_path)
    peaks = device_peaks(device, dtype)
    text_params, vocab_params, vision_params = param_split(model)
    dense_params = text_params - vocab_params
    hidden = runner.model_config.text.hidden_size
    vocab_rows = runner.model_config.text.vocab_size
    weight_bytes = text_params * dtype.itemsize
    text_cfg = runner.model_config.text
    attn_dim = text_cfg.num_attention_heads * text_cfg.head_dim
    out = {"model_path": model_path, "dtype": str(dtype).removeprefix("torch."), **peaks,
           "text_params": text_params, "vision_params": vision_params, "decode": [], "prefill": [], "vit": {}}
    floor_s = weight_bytes / peaks["bandwidth"]
    print(f"device {peaks['device']} ({peaks['source']}: {peaks['peak_flops'] / 1e12:.1f} TFLOP/s, "
          f"{peaks['bandwidth'] / 1e9:.1f} GB/s); text weights {weight_bytes / 1e9:.3f} GB -> "
          f"bandwidth floor {floor_s * 1e3:.3f} ms per decode step")

    # ---- decode: B requests with `decode_context` cached tokens each, time one decode step
    g = torch.Generator().manual_seed(0)
    print(f"\n{'batch':>6} {'step ms':>9} {'floor ms':>9} {'x floor':>8} {'tok/s':>10}")
    for bs in dec_bs:
        seqs = [StaticSeq(torch.randint(100, 5000, (args.decode_context,), generator=g).tolist()) for _ in range(bs)]
        logits, _ = sb.extend(seqs)
        toks = logits.argmax(-1).tolist()
        steps = []
        for _ in range(args.decode_steps):
            t0 = time.perf_counter()
            toks = sb.decode(seqs, toks).argmax(-1).tolist()  # .tolist() syncs: the step is complete
            steps.append(time.perf_counter() - t0)
        sb.release(seqs)
        step = statistics.median(steps[1:] or steps)
        row = {"batch_size": bs, "context": args.decode_context, "step_ms": step * 1e3, "floor_ms": floor_s * 1e3,
               "x_floor": step / floor_s, "tokens_per_s": bs / step}
        out["decode"].append(row)
        print(f"{bs:>6} {step * 1e3:>9.3f} {floor_s * 1e3:>9.3f} {step / floor_s:>8.2f} {bs / step:>10.1f}")
    print(f"target: <= {DECODE_FLOOR_TARGET}x the floor at batch 1")

    # ---- prefill: B requests of one image + text, whole prompt in one extend
    w, h = (int(x) for x in args.prefill_image.split("x"))
    img = test_card(w, h)
    text_ids = torch.randint(100, 5000, (args.prefill_text_tokens,), generator=g).tolist()
    ids, mm = processor.process([151652, 151655, 151653] + text_ids, [img])
    n_tok = len(ids)
    vit_tokens = sum(it.feature.shape[0] for it in mm.mm_items)
    print(f"\nprefill: one {w}x{h} image + {args.prefill_text_tokens} text tokens = {n_tok} tokens "
          f"({vit_tokens} ViT patches)")
    print(f"{'batch':>6} {'ms':>9} {'tok/s':>10} {'MFU':>7}")
    for bs in pre_bs:
        def run():
            seqs = [StaticSeq(list(ids), mm) for _ in range(bs)]
            sb.extend(seqs)
            sb.release(seqs)
            runner_cache_clear(runner)

        t = _timed(run, device, args.repeat)
        # causal attention: QK^T and AV over n*(n+1)/2 pairs, 2 FLOPs per multiply-add, both matmuls
        flops = bs * (2 * dense_params * n_tok + 2 * text_cfg.num_hidden_layers * attn_dim * n_tok * (n_tok + 1)
                      + 2 * hidden * vocab_rows + 2 * vision_params * vit_tokens)
        row = {"batch_size": bs, "tokens": bs * n_tok, "ms": t * 1e3, "tokens_per_s": bs * n_tok / t,
               "mfu": flops / t / peaks["peak_flops"]}
        out["prefill"].append(row)
        print(f"{bs:>6} {t * 1e3:>9.1f} {bs * n_tok / t:>10.1f} {row['mfu']:>7.1%}")

    # ---- ViT alone: N images in one call
    if args.vit_images > 0:
        w, h = (int(x) for x in args.vit_image_size.split("x"))
        _, vmm = processor.process([151652, 151655, 151653] * args.vit_images,
                                   [test_card(w, h) for _ in range(args.vit_images)])
        items = vmm.mm_items
        patches = sum(it.feature.shape[0] for it in items)
        per_img = [it.feature.shape[0] for it in items]
        vcfg = runner.model_config.vision
        with torch.no_grad():
            t = _timed(lambda: model.get_image_feature(items), device, args.repeat)
        flops = 2 * vision_params * patches + 4 * vcfg.depth * vcfg.hidden_size * sum(n * n for n in per_img)
        out["vit"] = {"images": args.vit_images, "size": args.vit_image_size, "patches": patches, "ms": t * 1e3,
                      "mfu": flops / t / peaks["peak_flops"]}
        print(f"\nViT: {args.vit_images} images of {w}x{h}, {patches} patches: {t * 1e3:.1f} ms, "
              f"MFU {out['vit']['mfu']:.1%} (target >= {VIT_MFU_TARGET:.0%} on GPU)")
        out["vit_by_backend"] = {}
        for backend in [b for b in args.mm_attention_backends.split(",") if b]:
            configure_vision_attention(model, backend, runner.cfg.attention_fp32_precision)
            with torch.no_grad():
                tb = _timed(lambda: model.get_image_feature(items), device, args.repeat)
            out["vit_by_backend"][backend] = {"ms": tb * 1e3, "mfu": flops / tb / peaks["peak_flops"],
                                              "head_dim": vcfg.hidden_size // vcfg.num_heads}
            print(f"ViT, --mm-attention-backend {backend}: {tb * 1e3:.1f} ms, MFU "
                  f"{out['vit_by_backend'][backend]['mfu']:.1%}")
        if out["vit_by_backend"]:  # back to the server's own choice
            configure_vision_attention(model, runner.mm_attention_backend, runner.cfg.attention_fp32_precision)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def runner_cache_clear(runner) -> None:
    """Repeated prefills of the same image must encode it each time, not hit the embedding cache."""
    runner.mm_embedder.clear()


if __name__ == "__main__":
    raise SystemExit(main())
