"""Main-process CPU per video chat with 0 and 1 preprocessing workers (issue 50: videos through the workers).

Each configuration builds, in a fresh process, a `RequestBuilder` on the tiny Qwen3-VL with Qwen3-VL's real video
preprocessing (`video_preprocessor_config.json` written into a copy of the checkpoint: 2 fps, a clip budget of
25165824 pixels), and builds `--requests` chats one after another, each with one short H.264 clip as a data URL
(`sglang.testing.sample_video.make_clip`, distinct clips in turn). It reports per request: the CPU of the
builder's process (`time.process_time`, all its threads: template, tokens, the data URL, and with 0 workers the
decode, resize, normalize, patchify and hash), the worker's CPU (`/proc/<pid>/stat`), and wall time. The
segments each request gets are unlinked after the timing (scheduler rank 0 frees them when serving).

  python benchmark/multimodal/bench_video_frontend.py --workers 0 1 --requests 16 --output /tmp/video_frontend.json

`--media pil`: the same with one 1280x720 PIL image per request (`sglang.Engine`'s input), which a worker gets
as raw RGB in a segment (`pil_handoff.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def model_copy(path: str) -> str:
    """The checkpoint with Qwen3-VL's own video preprocessing config (the tiny preset has none)."""
    out = tempfile.mkdtemp(prefix="video_frontend_model_")
    for name in os.listdir(path):
        os.symlink(os.path.join(path, name), os.path.join(out, name))
    cfg = {"size": {"longest_edge": 25165824, "shortest_edge": 4096}, "patch_size": 16, "temporal_patch_size": 2,
           "merge_size": 2, "fps": 2, "min_frames": 4, "max_frames": 768, "do_sample_frames": True,
           "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
    Path(out, "video_preprocessor_config.json").write_text(json.dumps(cfg))
    return out


def _chat(url: str):
    from sglang.srt.managers.io_struct import GenerateReqInput

    return GenerateReqInput(messages=[{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "What happens here?"}]}],
        sampling_params={"max_new_tokens": 1})


def _pil_request(image):
    from sglang.srt.managers.io_struct import GenerateReqInput

    return GenerateReqInput(text="Describe <|vision_start|><|image_pad|><|vision_end|>", image_data=[image],
                            sampling_params={"max_new_tokens": 1})


def _inputs(media: str, width: int, height: int, seconds: float, fps: float) -> tuple[list, str]:
    """Four distinct inputs (requests cycle through them) and what they are."""
    if media == "pil":  # sglang.Engine's PIL images: photo-like pictures, decoded before the request
        import base64
        import io

        from PIL import Image

        from bench_frontend import jpeg_data_url

        pics = [Image.open(io.BytesIO(base64.b64decode(jpeg_data_url(s).split(",", 1)[1]))).convert("RGB")
                for s in range(4)]
        return [_pil_request(p) for p in pics], f"PIL RGB {pics[0].width}x{pics[0].height}"
    from sglang.testing.sample_video import clip_data_url, make_clip

    clips = [clip_data_url(make_clip(width, height, fps, seconds, seed=s)) for s in range(4)]
    return [_chat(c) for c in clips], f"{width}x{height} {fps:g} fps {seconds:g} s, {len(clips[0]) * 3 // 4 // 1024} kB"


def measure(model: str, workers: int, requests: int, media: str, width: int, height: int, seconds: float,
            fps: float) -> dict:
    import copy

    from sglang.srt.managers.request_builder import RequestBuilder
    from sglang.srt.multimodal.transport.shm import unlink_segments
    from sglang.srt.utils.process_tree import cpu_seconds
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.network import pick_unused_port

    reqs, what = _inputs(media, width, height, seconds, fps)
    b = RequestBuilder(ServerArgs(model_path=model, port=pick_unused_port(), mm_processor_worker_num=workers), model)
    try:
        names: list[str] = []

        def build(i: int):
            obj = copy.copy(reqs[i % len(reqs)])  # the same media objects, a request object of its own
            tokenized, _ = b.build(b.check(obj, f"v{i}"))
            names.extend(b.take_unsent_shm(f"v{i}"))
            return tokenized

        first = build(0)  # warm: the worker's first job, the template
        pids = [w["pid"] for w in b.mm_pool.stats()["workers"]] if b.mm_pool is not None else []
        w0 = [cpu_seconds(p) for p in pids]
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(1, requests + 1):
            build(i)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        wcpu = [cpu_seconds(p) - c for p, c in zip(pids, w0)]
        unlink_segments(names)
        item = first.mm_inputs.mm_items[0]
        return {"workers": workers, "requests": requests, "main_cpu_ms_per_request": cpu / requests * 1e3,
                "worker_cpu_ms_per_request": [c / requests * 1e3 for c in wcpu],
                "wall_ms_per_request": wall / requests * 1e3, "grid_thw": list(item.image_grid_thw),
                "num_frames": item.model_specific_data.get("num_frames"), "media": what}
    finally:
        b.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--media", choices=("video", "pil"), default="video",
                    help="video: one clip per chat (a data URL); pil: one 1280x720 PIL image per request (Engine)")
    ap.add_argument("--size", default="640x360")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--fps", type=float, default=24.0)
    ap.add_argument("--output")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: one configuration, JSON on stdout
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    if args.one is not None:
        print(json.dumps(measure(args.model, args.one, args.requests, args.media, width, height, args.seconds,
                                 args.fps)))
        return
    from sglang.testing.make_model import ensure_model

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_frontend import model_copy as image_model_copy

    # Qwen3-VL's image pixel limits (bench_frontend's copy) and its video config (this file's)
    model = model_copy(image_model_copy(str(ensure_model("qwen3-vl-tiny", progress=False))))
    rows = []
    for n in args.workers:  # a fresh process each: nothing of one configuration warms the other
        out = subprocess.run([sys.executable, __file__, "--one", str(n), "--model", model, "--requests",
                              str(args.requests), "--media", args.media, "--size", args.size, "--seconds", str(args.seconds), "--fps",
                              str(args.fps)], check=True, capture_output=True, text=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"workers={n}: main {row['main_cpu_ms_per_request']:.1f} ms CPU/request, worker "
              f"{[round(c, 1) for c in row['worker_cpu_ms_per_request']]} ms, wall {row['wall_ms_per_request']:.1f} "
              f"ms, grid {row['grid_thw']} ({row['media']})")
    summary = {"rows": rows, "load_avg": os.getloadavg(), "cpus": os.cpu_count(),
               "median_main_cpu_ms": statistics.median(r["main_cpu_ms_per_request"] for r in rows)}
    if args.output:
        Path(args.output).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
