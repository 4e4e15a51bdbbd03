"""gpu-jpeg-decode microbenchmark: preprocessing of one request's JPEGs, baseline (PIL in the tokenizer,
float32 pixels sent) vs deferred (header only in the tokenizer, compressed bytes sent, decoded where the
vision tower runs), in one process; bytes per request crossing the transport; accuracy against PIL.

Stages, per request (all images), median of --iters runs:
  baseline  b64 decode | PIL decode (+EXIF, RGB) | resize+normalize+patchify (PIL/numpy) | to device
  deferred  b64 decode | header + grid (tokenizer) | decode (nvJPEG batched, or PIL) | orient+resize+
            normalize+patchify (device; on CPU the PIL path does this inside `decode`) | to device
"to device" is the concatenation into one (patches, 1536) tensor on the device, as get_image_feature does.
Bytes: pickled size of the request's items (what ZMQ and the TP broadcast carry without shm).

Accuracy (--accuracy): photographic-like test cards + noise, several sizes, 4:2:0 and 4:4:4, each
EXIF-rotated too: max / mean |diff| of pixel_values and PSNR (range [-1, 1] -> 2.0 peak) against the
baseline, for the deferred path on --device (PIL on CPU: must be 0) and, on CPU, for the device pipeline
fed with PIL's decode (what the CUDA path does after nvJPEG). --greedy adds greedy-token agreement on
the tiny Qwen3-VL model (transformers, float32) with each path's pixels.

  python benchmark/multimodal/bench_image_decode.py --device cpu --accuracy --greedy --output out.json
  python benchmark/multimodal/bench_image_decode.py --device cuda --accuracy --greedy --output out.json
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import pickle
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sglang.srt.multimodal import deferred_decode as dd  # noqa: E402
from sglang.srt.multimodal.image_io import decode_base64, load_image  # noqa: E402
from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem  # noqa: E402
from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor, process_image  # noqa: E402

# Qwen3-VL's preprocessor_config.json
QWEN3 = QwenVLImageProcessor(patch_size=16, image_mean=(0.5,) * 3, image_std=(0.5,) * 3,
                             min_pixels=65536, max_pixels=16777216)


def card(w: int, h: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([255 * x / w, 255 * y / h, 127 + 100 * np.sin(x / 37.0 + y / 53.0)], -1)
    for _ in range(12):
        cx, cy, r = rng.integers(0, w), rng.integers(0, h), rng.integers(10, max(11, min(w, h) // 4))
        img[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.integers(0, 256, 3)
    img[:, (np.arange(w) // 8) % 16 == 0] = 255  # thin lines: chroma edges
    img += rng.normal(0, 5, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def jpeg(w, h, seed, subsampling=2, orientation=None, quality=90) -> bytes:
    save = {"quality": quality, "subsampling": subsampling}
    if orientation is not None:
        ex = Image.Exif()
        ex[0x0112] = orientation
        save["exif"] = ex.tobytes()
    buf = io.BytesIO()
    Image.fromarray(card(w, h, seed)).save(buf, "JPEG", **save)
    return buf.getvalue()


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device):
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return out, (time.perf_counter() - t) * 1e3


def run_baseline(b64s, device):
    st = {}
    datas, st["b64_decode"] = timed(lambda: [decode_base64(s) for s in b64s], "cpu")
    imgs, st["decode"] = timed(lambda: [load_image(d) for d in datas], "cpu")
    outs, st["resize_normalize_patchify"] = timed(lambda: [process_image(im, QWEN3) for im in imgs], "cpu")
    feats = [torch.from_numpy(pv) for pv, _ in outs]
    pixels, st["to_device"] = timed(lambda: torch.cat([f.to(device) for f in feats]), device)
    items = [MultimodalDataItem(Modality.IMAGE, feature=f, image_grid_thw=g) for f, (_, g) in zip(feats, outs)]
    return pixels, st, items


def run_deferred(b64s, device):
    st = {}
    datas, st["b64_decode"] = timed(lambda: [decode_base64(s) for s in b64s], "cpu")
    encs, st["header_grid"] = timed(lambda: [dd.defer_jpeg(d, QWEN3, None) for d in datas], "cpu")
    assert all(e is not None for e in encs)
    if torch.device(device).type == "cuda" and dd.torchvision_available():
        u8, st["decode"] = timed(lambda: dd._nvjpeg_decode(encs, torch.device(device)), device)
        assert len(u8) == len(encs), "nvJPEG refused an image"
        outs, st["resize_normalize_patchify"] = timed(
            lambda: [dd.device_pixels(u8[i], e, device) for i, e in enumerate(encs)], device)
    else:  # PIL in the model process: decode + preprocessing in one call per image
        outs, st["decode"] = timed(lambda: [dd.pil_pixels(e) for e in encs], "cpu")
    pixels, st["to_device"] = timed(lambda: torch.cat([o.to(device) for o in outs]), device)
    items = [MultimodalDataItem(Modality.IMAGE, feature=e, image_grid_thw=e.grid_thw) for e in encs]
    return pixels, st, items


def median_stages(runs):
    keys = runs[0].keys()
    out = {k: statistics.median(r[k] for r in runs) for k in keys}
    out["total"] = statistics.median(sum(r.values()) for r in runs)
    return out


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    d = (a.float().cpu() - b.float().cpu()).abs()
    mse = float((d.double() ** 2).mean())
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()),
            "psnr_db": float("inf") if mse == 0 else 10 * np.log10(4.0 / mse)}


def accuracy(device) -> list[dict]:
    rows = []
    for (w, h) in ((960, 1280), (1280, 720), (640, 480), (333, 517)):
        for ss, name in ((2, "4:2:0"), (0, "4:4:4")):
            for orient in (1, 6):
                data = jpeg(w, h, w + h + ss, ss, orient)
                ref, grid = process_image(load_image(data), QWEN3)
                ref = torch.from_numpy(ref)
                enc = dd.defer_jpeg(data, QWEN3, None)
                row = {"size": f"{w}x{h}", "subsampling": name, "orientation": orient, "grid": list(grid)}
                row["deferred_" + torch.device(device).type] = compare(dd.decode_images([enc], device)[0], ref)
                raw = torch.from_numpy(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).copy()).permute(2, 0, 1)
                row["device_pipeline_on_pil_decode"] = compare(dd.device_pixels(raw, enc, "cpu"), ref)
                rows.append(row)
    return rows


def greedy(device, n_tokens=16) -> dict:
    """Greedy tokens of the tiny Qwen3-VL (transformers, float32) with baseline vs deferred pixels."""
    import tempfile

    import transformers

    from sglang.testing.make_model import make_model

    tmp = tempfile.mkdtemp()
    path = make_model("qwen3-vl-tiny", Path(tmp) / "model", seed=0, progress=False)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval().to(device)
    from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor

    proc = QwenVLProcessor.from_pretrained(str(path), tok)
    agree, total, same_seq, cases = 0, 0, 0, 0
    for seed in range(6):
        data = jpeg(320 + 32 * seed, 240 + 16 * seed, 100 + seed, 2 if seed % 2 == 0 else 0, 1 + seed % 8)
        text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe.<|im_end|>\n<|im_start|>assistant\n"
        ids = tok.encode(text, add_special_tokens=False)
        out_ids, mm = proc.process(ids, [data])
        proc.deferred_jpeg = True
        _, mm_d = proc.process(ids, [data])
        proc.deferred_jpeg = False
        seqs = []
        for pixels in (mm.mm_items[0].feature, dd.decode_images([mm_d.mm_items[0].feature], device)[0]):
            t = torch.tensor([out_ids], device=device)
            with torch.no_grad():
                o = model.generate(input_ids=t, attention_mask=torch.ones_like(t), max_new_tokens=n_tokens,
                                   do_sample=False, pixel_values=pixels.to(device),
                                   image_grid_thw=torch.tensor([list(mm.mm_items[0].image_grid_thw)], device=device),
                                   mm_token_type_ids=(t == mm.im_token_id).long())
            seqs.append(o[0, len(out_ids):].tolist())
        cases += 1
        same_seq += seqs[0] == seqs[1]
        n = min(len(seqs[0]), len(seqs[1]))
        agree += sum(a == b for a, b in zip(seqs[0][:n], seqs[1][:n]))
        total += n
    return {"cases": cases, "identical_sequences": same_seq, "token_agreement": agree / max(total, 1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--images", type=int, default=20)
    ap.add_argument("--width", type=int, default=960)
    ap.add_argument("--height", type=int, default=1280)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    dev = args.device

    b64s = [base64.b64encode(jpeg(args.width, args.height, k)).decode() for k in range(args.images)]
    base_runs, def_runs = [], []
    for it in range(args.iters + 1):  # first run warms up (allocator, LUT, nvJPEG handles)
        pb, sb, items_b = run_baseline(b64s, dev)
        pd, sd, items_d = run_deferred(b64s, dev)
        if it:
            base_runs.append(sb)
            def_runs.append(sd)
    res = {"device": dev, "images": args.images, "size": f"{args.width}x{args.height}", "iters": args.iters,
           "torch": torch.__version__, "torchvision": dd.torchvision_available(),
           "baseline_ms": median_stages(base_runs), "deferred_ms": median_stages(def_runs),
           "same_request_pixels": compare(pd, pb)}
    bytes_b = len(pickle.dumps(items_b, protocol=pickle.HIGHEST_PROTOCOL))
    bytes_d = len(pickle.dumps(items_d, protocol=pickle.HIGHEST_PROTOCOL))
    res["bytes_per_request"] = {"baseline_float32": bytes_b, "deferred_jpeg": bytes_d, "ratio": bytes_b / bytes_d,
                                "base64_in": sum(len(s) for s in b64s)}
    print(f"device={dev}  {args.images} images {args.width}x{args.height}, median of {args.iters}")
    for name in ("baseline_ms", "deferred_ms"):
        print(f"  {name:12s} " + "  ".join(f"{k}={v:.1f}" for k, v in res[name].items()))
    print(f"  speedup (total) {res['baseline_ms']['total'] / res['deferred_ms']['total']:.2f}x")
    print(f"  bytes/request: float32 pixels {bytes_b:,} vs JPEG {bytes_d:,} ({res['bytes_per_request']['ratio']:.1f}x)")
    print(f"  same request, deferred vs baseline pixels: {res['same_request_pixels']}")
    if args.accuracy:
        res["accuracy"] = accuracy(dev)
        for r in res["accuracy"]:
            print("  ", json.dumps(r))
    if args.greedy:
        res["greedy"] = greedy(dev)
        print("  greedy:", res["greedy"])
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
