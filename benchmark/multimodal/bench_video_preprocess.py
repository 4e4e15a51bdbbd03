"""Tokenizer-side cost of one video: PyAV decode of the sampled frames, then resize / normalize / patchify,
for both Qwen-VL families' default video settings (transformers' class defaults, 2 fps), per clip size,
length and frame rate; plus the vision tokens the video costs.

  python benchmark/multimodal/bench_video_preprocess.py --output /tmp/video_preprocess.json
  python benchmark/multimodal/bench_video_preprocess.py --clips 640x360@30x4,1280x720@30x10 --repeats 5

Clips are H.264 mp4 (yuv420p, `ultrafast`) of a bar sweeping over noise, generated before timing. Times
are medians over --repeats, one worker thread (the server runs one such job per video in parallel).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vit_op_timing import device_name, print_table, write_json  # noqa: E402

from sglang.srt.multimodal.processors.qwen_video import QwenVLVideoProcessor, load_and_process_video  # noqa: E402

DEFAULT_CLIPS = "640x360@30x4,1280x720@30x4,1280x720@30x10,1920x1080@30x10,1280x720@60x30"


def make_h264(width: int, height: int, fps: int, seconds: float) -> bytes:
    import io

    import av
    import numpy as np

    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        s = out.add_stream("libx264", rate=fps)
        s.width, s.height, s.pix_fmt = width, height, "yuv420p"
        s.options = {"preset": "ultrafast", "crf": "23"}
        n = int(round(fps * seconds))
        for i in range(n):
            frame = noise.copy()
            x = int(i * (width - 8) / max(1, n - 1))
            frame[:, x : x + 8] = 255
            for p in s.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    return buf.getvalue()


def parse_clips(spec: str) -> list[tuple[int, int, int, float]]:
    out = []
    for part in spec.split(","):
        size, rest = part.split("@")
        fps, secs = rest.split("x")
        w, h = size.split("x")
        out.append((int(w), int(h), int(fps), float(secs)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", default=DEFAULT_CLIPS, help="WxH@FPSxSECONDS, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--output", default=None, help="JSON file for the results")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows, records = [], []
    for w, h, fps, secs in parse_clips(args.clips):
        data = make_h264(w, h, fps, secs)
        for family, label in (("qwen3", "Qwen3-VL"), ("qwen2", "Qwen2.5-VL")):
            cfg = QwenVLVideoProcessor.defaults(family)
            runs = [load_and_process_video(data, cfg) for _ in range(args.repeats)]
            pv = runs[-1]
            t, gh, gw = pv.grid_thw
            tokens = t * gh * gw // cfg.merge_size**2
            dec = statistics.median(r.decode_ms for r in runs)
            pre = statistics.median(r.preprocess_ms for r in runs)
            rows.append([f"{w}x{h}", f"{secs:g} s @ {fps}", label, pv.num_frames, f"{t}x{gh}x{gw}", tokens,
                         f"{len(data) / 2**20:.2f}", dec, pre, dec + pre])
            records.append({"width": w, "height": h, "fps": fps, "seconds": secs, "model": label,
                            "frames_sampled": pv.num_frames, "grid_thw": [t, gh, gw], "tokens": tokens,
                            "file_mib": len(data) / 2**20, "decode_ms": dec, "preprocess_ms": pre})
    print(f"device: {device_name('cpu')}, torch threads 1, repeats {args.repeats}")
    print_table(["clip", "length", "model", "frames", "grid t*h*w", "tokens", "MiB", "decode ms", "preprocess ms",
                 "total ms"], rows)
    write_json(args.output, {"device": device_name("cpu"), "repeats": args.repeats, "results": records})


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"done in {time.perf_counter() - t0:.1f} s")
