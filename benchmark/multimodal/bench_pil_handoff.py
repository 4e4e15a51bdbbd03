"""Does handing a PIL image (`sglang.Engine`) to a preprocessing worker pay? (issue 50; `pil_handoff.py`)

Times, in this thread (`time.thread_time`), on one photo-like 1280x720 RGB image with Qwen3-VL's image limits:
  in-process  what the tokenizer process pays without workers: preprocess (resize, normalize, patchify), hash
              (xxh3_128), write the pixels to a segment;
  hand-off    what it pays with a worker: `pil_handoff.to_segment` (load_image's checks and RGB conversion,
              the RGB copied into a segment);
  worker      what the worker then pays: map the RGB, preprocess, hash, write its segment.

  python benchmark/multimodal/bench_pil_handoff.py --repeat 20 --runs 2
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_frontend import jpeg_data_url, model_copy  # noqa: E402


def _ms(fn, repeat: int) -> float:
    fn()  # warm
    t0 = time.thread_time()
    for _ in range(repeat):
        fn()
    return (time.thread_time() - t0) / repeat * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    from PIL import Image
    from transformers import AutoTokenizer

    from sglang.srt.multimodal.image_flight import load_processed_image
    from sglang.srt.multimodal.pil_handoff import from_segment, to_segment
    from sglang.srt.multimodal.processor_spec import ProcessorSpec
    from sglang.srt.multimodal.transport.shm import unlink_segments, write_segment
    from sglang.srt.server_args import ServerArgs
    from sglang.testing.make_model import ensure_model

    model = model_copy(str(ensure_model("qwen3-vl-tiny", progress=False)))
    proc = ProcessorSpec.from_server_args(ServerArgs(model_path=model), model).build(AutoTokenizer.from_pretrained(model))
    pil = Image.open(io.BytesIO(base64.b64decode(jpeg_data_url(0).split(",", 1)[1]))).convert("RGB")
    prefix = f"sglang_mm_pilbench_{os.getpid()}_"
    names: list[str] = []

    def in_process():
        pim = load_processed_image(proc, None, pil, None, "xxh3_128")
        names.append(write_segment(torch.from_numpy(pim.pixel_values), prefix).name)

    def hand_off():
        names.append(to_segment(pil, proc.max_image_pixels, prefix).name)

    ptr = to_segment(pil, proc.max_image_pixels, prefix)  # the worker's input, kept to the end

    def worker():
        pim = load_processed_image(proc, None, from_segment(ptr), None, "xxh3_128")
        names.append(write_segment(torch.from_numpy(pim.pixel_values), prefix).name)

    try:
        for run in range(1, args.runs + 1):
            a, b, c = _ms(in_process, args.repeat), _ms(hand_off, args.repeat), _ms(worker, args.repeat)
            print(f"run {run}: in-process {a:.2f} ms, hand-off {b:.2f} ms, worker {c:.2f} ms "
                  f"(load {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs)")
            unlink_segments(names)
            names.clear()
    finally:
        unlink_segments(names + [ptr.name])


if __name__ == "__main__":
    main()
