"""Cost of the VLM stage timer: the same requests through one in-process scheduler with the timer
off and on, interleaved, in one process. Prints the per-request time of each and the difference.

  python benchmark/multimodal/bench_stage_timer_overhead.py --requests 40 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
from inprocess_scheduler import BenchScheduler  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None, help="default: the embedded tiny Qwen3-VL")
    ap.add_argument("--requests", type=int, default=40, help="requests per round and mode")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--output-len", type=int, default=8)
    ap.add_argument("--output", default=None)
    args = ap.parse_args()

    from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor
    from sglang.testing.make_model import ensure_model

    path = args.model_path or str(ensure_model("qwen3-vl-tiny"))
    proc = QwenVLProcessor.from_pretrained(path)
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (96, 128, 3), dtype=np.uint8))
    ids, mm = proc.process([1, 2, 151652, 151655, 151653, 3, 4], [img])
    benches = {on: BenchScheduler(model_path=path, enable_vlm_stage_timer=on, disable_radix_cache=True)
               for on in (False, True)}
    import logging

    logging.getLogger("sglang.vlm_stage_timer").setLevel(logging.WARNING)  # time the measuring, not the printing
    per_req = {False: [], True: []}
    for _ in range(args.rounds):
        for on, bench in benches.items():  # interleaved so machine drift hits both modes alike
            start = time.perf_counter()
            for _ in range(args.requests):
                bench.run_request(ids, mm, args.output_len)
            per_req[on].append((time.perf_counter() - start) * 1e3 / args.requests)
    off, on = statistics.median(per_req[False]), statistics.median(per_req[True])
    print(f"{args.requests} requests x {args.rounds} rounds, one image, {args.output_len} output tokens, tiny Qwen3-VL")
    print(f"{'timer':<6} {'ms/request (median of rounds)':>30}  rounds")
    print(f"{'off':<6} {off:>30.3f}  {[round(x, 2) for x in per_req[False]]}")
    print(f"{'on':<6} {on:>30.3f}  {[round(x, 2) for x in per_req[True]]}")
    print(f"on vs off: {100 * (on - off) / off:+.2f}%")
    if args.output:
        Path(args.output).write_text(json.dumps({"off_ms": off, "on_ms": on, "rounds": per_req}, default=str))


if __name__ == "__main__":
    main()
