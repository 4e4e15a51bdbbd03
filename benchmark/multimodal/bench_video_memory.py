"""Peak memory of loading and preprocessing one hostile or long video, each case in a fresh process.

  python benchmark/multimodal/bench_video_memory.py --output /tmp/video_memory.json
  python benchmark/multimodal/bench_video_memory.py --cases png_list,two_mp4

Cases (inputs generated once into --workdir, outside the measured process):
- png_list: 12 solid 8000x8000 PNGs (~3 MB in all) as a frame list, Qwen3-VL defaults;
- two_mp4: two 8000x8000 H.264 mp4s of 10 solid frames at 5 fps, loaded at once in two threads (one chat
  with two videos), Qwen3-VL defaults;
- hd_170s / hd_174s / hd_3600s: a static 1920x1080 clip of 170 s and 174 s at 2 fps (340 and 348 frames,
  either side of what 2 GiB of full-size frames held) and of 3600 s at 0.5 fps (sampled at 2 fps: 768
  frames), both families' defaults.

Measured: the process's peak resident memory (VmHWM, reset after the inputs are read and the modules
imported) minus its resident memory at that point; and the outcome (the grid, or the refusal's text).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

# this checkout's sglang, whatever is installed (the children run this file directly)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from sglang.testing.sample_video import solid_clip, solid_png  # noqa: E402

CASES = ("png_list", "two_mp4", "hd_170s_qwen3", "hd_170s_qwen2", "hd_174s_qwen3", "hd_174s_qwen2", "hd_3600s_qwen3",
         "hd_3600s_qwen2")


def make_inputs(workdir: str, cases) -> None:
    os.makedirs(workdir, exist_ok=True)

    def need(name, make):
        path = os.path.join(workdir, name)
        if not os.path.exists(path):
            with open(path + ".tmp", "wb") as f:
                f.write(make())
            os.replace(path + ".tmp", path)

    if "png_list" in cases:
        for i in range(12):
            need(f"solid_{i}.png", lambda i=i: solid_png(8000, (i * 20, 255 - i * 20, 128)))
    if "two_mp4" in cases:
        need("big_a.mp4", lambda: solid_clip(8000, 8000, 5, 10))
        need("big_b.mp4", lambda: solid_clip(8000, 8000, 5, 10))
    if any(c.startswith("hd_170s") for c in cases):
        need("hd_170s.mp4", lambda: solid_clip(1920, 1080, 2, 340))
    if any(c.startswith("hd_174s") for c in cases):
        need("hd_174s.mp4", lambda: solid_clip(1920, 1080, 2, 348))
    if any(c.startswith("hd_3600s") for c in cases):
        need("hd_3600s.mp4", lambda: solid_clip(1920, 1080, 0.5, 1800))


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def run_case(case: str, workdir: str) -> dict:
    """In this (fresh) process: read the inputs, reset the peak, load + preprocess, report."""
    from concurrent.futures import ThreadPoolExecutor

    from sglang.srt.multimodal.processors.qwen_video import QwenVLVideoProcessor, load_and_process_video

    read = lambda name: open(os.path.join(workdir, name), "rb").read()  # noqa: E731
    family = "qwen2" if case.endswith("qwen2") else "qwen3"
    cfg = QwenVLVideoProcessor.defaults(family)
    if case == "png_list":
        sources = [[read(f"solid_{i}.png") for i in range(12)]]
    elif case == "two_mp4":
        sources = [read("big_a.mp4"), read("big_b.mp4")]
    else:
        sources = [read(case.rsplit("_", 1)[0] + ".mp4")]
    input_bytes = sum(sum(map(len, s)) if isinstance(s, list) else len(s) for s in sources)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size
    base = _status("VmRSS")

    def one(src):
        try:
            pv = load_and_process_video(src, cfg)
            return {"grid": list(pv.grid_thw), "frames": pv.num_frames}
        except ValueError as e:
            return {"refused": str(e)[:300]}

    with ThreadPoolExecutor(len(sources)) as pool:
        outcomes = list(pool.map(one, sources))
    return {"case": case, "input_bytes": input_bytes, "peak_rss_growth_mib": round((_status("VmHWM") - base) / 2**20),
            "outcomes": outcomes}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--workdir", default="/tmp/video_memory_inputs")
    ap.add_argument("--output")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_case(args.child, args.workdir)))
        return
    cases = args.cases.split(",")
    make_inputs(args.workdir, cases)
    results = []
    for case in cases:
        out = subprocess.run([sys.executable, __file__, "--child", case, "--workdir", args.workdir],
                             capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
