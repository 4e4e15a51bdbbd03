"""SGLANG_MM_UINT8_PIXELS off vs on, both in one process, through the VLM stage timer: two request
builders (the tokenizer side, switch read at construction) and one in-process scheduler (the model side
needs no switch: it finishes whichever carrier arrives), interleaved rounds on the same images.

Per request of N 1280x720 PNG images (data URLs; Qwen3-VL's preprocessing: 736x1280, 3680 patches each)
on the tiny Qwen3-VL (its preprocessor's max_pixels raised to Qwen3-VL's 16777216 in a copy of the
checkpoint directory): the stage timer's processor, hash, recv (send + transfer + unpickle), vit_encode
(includes finishing uint8 pixels), llm_prefill and first_token (server-side TTFT), plus the bytes of the
pickled request and of its shared-memory segments.

  OMP_NUM_THREADS=1 python benchmark/multimodal/bench_uint8_pixels.py --images 4 --rounds 5
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
from inprocess_scheduler import BenchScheduler  # noqa: E402

STAGES = ("processor", "hash", "recv", "vit_encode", "embed_merge", "llm_prefill", "first_token")


def _model_copy(path: str) -> str:
    """The checkpoint with Qwen3-VL's real pixel limits (the tiny preset caps images at 512x512)."""
    out = tempfile.mkdtemp(prefix="uint8px_model_")
    for name in os.listdir(path):
        if name != "preprocessor_config.json":
            os.symlink(os.path.join(path, name), os.path.join(out, name))
    cfg = json.loads(Path(path, "preprocessor_config.json").read_text())
    cfg["size"] = {"shortest_edge": 65536, "longest_edge": 16777216}
    cfg.pop("min_pixels", None)
    cfg.pop("max_pixels", None)
    Path(out, "preprocessor_config.json").write_text(json.dumps(cfg))
    return out


def _data_url(seed: int) -> str:
    arr = np.random.default_rng(seed).integers(0, 256, (720, 1280, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _builder(model: str, uint8: bool, port: int):
    from sglang.srt.managers.request_builder import RequestBuilder
    from sglang.srt.server_args import ServerArgs

    os.environ["SGLANG_MM_UINT8_PIXELS"] = "1" if uint8 else "0"  # read once, by the builder's constructor
    try:
        return RequestBuilder(ServerArgs(model_path=model, port=port, enable_vlm_stage_timer=True), model)
    finally:
        del os.environ["SGLANG_MM_UINT8_PIXELS"]


def _run(builder, bench: BenchScheduler, urls: list[str], rid: str) -> dict:
    import pickle

    from sglang.srt.managers.io_struct import BatchTokenIDOut, GenerateReqInput

    text = "".join("<|vision_start|><|image_pad|><|vision_end|>" for _ in urls) + "Describe."
    obj = GenerateReqInput(text=text, image_data=list(urls), sampling_params={"max_new_tokens": 1, "temperature": 0})
    tok, payload = builder.build(builder.check(obj, rid))
    shm_bytes = sum(getattr(it.feature, "nbytes", 0) for it in tok.mm_inputs.mm_items)
    msg = pickle.loads(payload)  # what the scheduler's socket delivers
    bench.sched._unwrap_shm_features([msg])  # what recv_requests does after the broadcast: map, then unlink
    bench.sched.process_input_requests([msg])
    meta = {}
    while not bench.sched.is_idle() or bench.sent:
        bench.sched.step()
        for out in bench.sent:
            if isinstance(out, BatchTokenIDOut) and rid in out.rids:
                meta = out.meta_info[out.rids.index(rid)]
        bench.sent.clear()
    builder.take_unsent_shm(rid)  # the scheduler mapped and unlinked them; drop the tokenizer's record
    return {"payload_bytes": len(payload), "shm_bytes": shm_bytes, **meta.get("stage_timings_ms", {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--output", default=None)
    args = ap.parse_args()

    from sglang.testing.make_model import ensure_model

    logging.getLogger("sglang.vlm_stage_timer").setLevel(logging.WARNING)
    model = _model_copy(str(ensure_model("qwen3-vl-tiny")))
    builders = {on: _builder(model, on, 31990 + on) for on in (False, True)}
    bench = BenchScheduler(model_path=model, enable_vlm_stage_timer=True, disable_radix_cache=True)
    rows: dict[bool, list[dict]] = {False: [], True: []}
    for r in range(args.rounds + 1):  # round 0 warms both paths up and is dropped
        urls = [_data_url(1000 * r + k) for k in range(args.images)]
        for on in (False, True):  # same images both ways, interleaved so machine drift hits both alike
            row = _run(builders[on], bench, urls, f"r{r}-{int(on)}")
            if r:
                rows[on].append(row)
    for b in builders.values():
        b.close()

    def med(on, key):
        return statistics.median(row.get(key, 0.0) for row in rows[on])

    print(f"{args.images} x 1280x720 PNG per request, tiny Qwen3-VL (736x1280 per image), median of {args.rounds} "
          f"rounds, load {os.getloadavg()[0]:.2f}")
    print(f"{'stage / bytes':<16} {'switch off':>14} {'switch on':>14} {'off / on':>9}")
    table = {}
    for key in ("payload_bytes", "shm_bytes", *STAGES):
        off, on = med(False, key), med(True, key)
        table[key] = {"off": off, "on": on}
        ratio = f"{off / on:.2f}x" if on else "-"
        fmt = "{:>14,.0f}" if key.endswith("bytes") else "{:>14.1f}"
        print(f"{key + ('' if key.endswith('bytes') else ' ms'):<16} {fmt.format(off)} {fmt.format(on)} {ratio:>9}")
    if args.output:
        out = {"median": table, "rows": {str(k): v for k, v in rows.items()}}
        Path(args.output).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
