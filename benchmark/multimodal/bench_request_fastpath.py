"""Main-process CPU of one image chat, piece by piece (issue 50, item 4: measure each fast-path candidate
before building it). The tokenizer manager's process does, per request: the chat template (rendering), the
tokenization of the rendered prompt, the image's identity (base64 decode and digest: single-flight's key),
and the rest of `RequestBuilder.build` (placeholder expansion, M-RoPE positions, the worker round trip, the
pickle). With one preprocessing worker (the default on this machine) all pixel work is in the worker, so
`build` is the whole of the main process's share; each candidate's piece is timed alone on the same request,
in this thread (`time.thread_time`), and reported as a share of the main process's CPU per request.

  python benchmark/multimodal/bench_request_fastpath.py --requests 64 --repeat 200 --output /tmp/fastpath.json

Also counts how often the prompt is tokenized per request (the candidate "no raw-prompt tokenization when the
processor already yields the expanded ids" pays only if it is more than once).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_frontend import jpeg_data_url, model_copy  # noqa: E402


def _chat(url: str, text: str = "Describe this picture."):
    from sglang.srt.managers.io_struct import GenerateReqInput

    return GenerateReqInput(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}],
        sampling_params={"max_new_tokens": 1})


def _per_call_us(fn, repeat: int) -> float:
    fn()  # warm
    t0 = time.thread_time()
    for _ in range(repeat):
        fn()
    return (time.thread_time() - t0) / repeat * 1e6


def _count_calls(obj, name: str):
    real = getattr(obj, name)
    box = {"n": 0}

    def counted(*a, **k):
        box["n"] += 1
        return real(*a, **k)

    setattr(obj, name, counted)
    return box, lambda: setattr(obj, name, real)


def measure(model: str, workers: int, urls: list[str], repeat: int) -> dict:
    from sglang.srt.managers.request_builder import RequestBuilder
    from sglang.srt.multimodal.hashing import content_digest
    from sglang.srt.multimodal.image_io import load_image_bytes
    from sglang.srt.multimodal.transport.cuda_ipc import release_unsent
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.network import pick_unused_port

    b = RequestBuilder(ServerArgs(model_path=model, port=pick_unused_port(), mm_processor_worker_num=workers), model)
    try:
        names: list[str] = []  # unlinked after the timing: scheduler rank 0 unlinks them, not this process

        def build(i: int):
            obj = _chat(urls[i % len(urls)])
            b.build(b.check(obj, f"r{i}"))
            names.extend(b.take_unsent_shm(f"r{i}"))

        build(0)  # warm: the worker's first job, the template's compile
        encodes, undo_enc = _count_calls(b.lanes, "encode")
        ptok, undo_ptok = _count_calls(b.processor, "tokenize")
        cpu0 = time.process_time()
        for i in range(len(urls)):
            build(i)
        main_us = (time.process_time() - cpu0) / len(urls) * 1e6
        undo_enc(), undo_ptok()
        release_unsent(names)
        obj = _chat(urls[0])
        checked = b.check(obj, "x")
        prompt = b._render_chat(checked.messages, obj)
        data = load_image_bytes(urls[0])
        pieces = {
            "check_us": _per_call_us(lambda: b.check(_chat(urls[0]), "x"), repeat),
            "render_us": _per_call_us(lambda: b._render_chat(checked.messages, obj), repeat),
            "render_key_us": _per_call_us(lambda: json.dumps([checked.messages, obj.tools, obj.chat_template_kwargs,
                                                              obj.continue_final_message], sort_keys=True), repeat),
            "tokenize_us": _per_call_us(lambda: b.lanes.encode(prompt, add_special_tokens=False), repeat),
            "identify_us": _per_call_us(lambda: b.image_loader.identify(urls[0]), repeat),
            "base64_decode_us": _per_call_us(lambda: load_image_bytes(urls[0]), repeat),
            "digest_us": _per_call_us(lambda: content_digest(data, b.hash_algo), repeat),
        }
    finally:
        b.close()
    row = {"workers": workers, "main_cpu_us_per_request": round(main_us, 1),
           "prompt_tokenizations_per_request": encodes["n"] / len(urls),
           "processor_tokenizations_per_request": ptok["n"] / len(urls)}
    for k, v in pieces.items():
        row[k] = round(v, 1)
        row[k.replace("_us", "_share_pct")] = round(100 * v / main_us, 1)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--workers", nargs="+", type=int, default=[1])
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    from sglang.benchmark.progress import progress_bar
    from sglang.testing.make_model import ensure_model

    model = model_copy(str(ensure_model("qwen3-vl-tiny", progress=False)))
    urls = [jpeg_data_url(3000 + i) for i in range(args.requests)]
    load_before = [round(x, 2) for x in os.getloadavg()]
    bar = progress_bar(total=len(args.workers), desc="worker counts")
    rows = []
    for w in args.workers:
        rows.append(measure(model, w, urls, args.repeat))
        bar.update(1)
    bar.close()
    summary = {"cpu_count": os.cpu_count(), "loadavg_before": load_before,
               "loadavg_after": [round(x, 2) for x in os.getloadavg()],
               "jpeg_kb_mean": round(statistics.mean(len(u) * 3 / 4 / 1024 for u in urls), 1), "rows": rows}
    text = json.dumps(summary, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text)


if __name__ == "__main__":
    sys.exit(main())
