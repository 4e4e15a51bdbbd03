"""Writes a --trace file for python -m sglang.tune whose requests reuse a few images (a product catalogue, a
document asked about several times): N requests over K noise images, one per request, a shared instruction,
sent every GAP seconds.

    python benchmark/tuning/make_repeat_trace.py --out /tmp/repeat --requests 24 --images 3
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="folder for trace.jsonl and img/")
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--images", type=int, default=3)
    p.add_argument("--size", default="320x240", help="WxH of each image")
    p.add_argument("--gap", type=float, default=0.05, help="seconds between requests")
    p.add_argument("--output-len", type=int, default=16)
    a = p.parse_args()
    out = Path(a.out)
    (out / "img").mkdir(parents=True, exist_ok=True)
    w, h = (int(x) for x in a.size.split("x"))
    rng = np.random.default_rng(0)
    for i in range(a.images):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(out / "img" / f"{i}.png")
    questions = ["What is shown here?", "List the colours.", "Is there any text?", "Describe the layout."]
    with open(out / "trace.jsonl", "w") as f:
        for k in range(a.requests):
            rec = {"timestamp": round(k * a.gap, 3), "images": [f"img/{k % a.images}.png"],
                   "prompt": "You are a careful assistant for a product catalogue. " + questions[k % len(questions)],
                   "output_len": a.output_len}
            f.write(json.dumps(rec) + "\n")
    print(out / "trace.jsonl")


if __name__ == "__main__":
    main()
