"""Front-end cost of image chats: main-process CPU per image and admission rate of a burst of 1280x720 JPEG
chats through an in-process TokenizerManager (its RequestBuilder: chat template, tokenize, base64 decode,
JPEG decode, resize, normalize, patchify, hash, shared memory, pickle), the scheduler stubbed: a prepared
request counts as admitted (ready to send) and its segments are unlinked by another process at once (as
scheduler rank 0 unlinks them), nothing is sent or generated.

Main-process CPU is `time.process_time()` of this process (every thread: the event loop and the worker
pools) over the burst, divided by the images in it; the utilisation is that CPU over the burst's wall time
(2.0 = two cores busy). Modes, each on a fresh manager (the switches are read at construction):

  unique   every chat its own image (the cost today's front end pays per image)
  shared   every chat the same image (single-flight: concurrent chats with one image process it once)
  compact  unique images with SGLANG_MM_COMPACT_STILL_IMAGES=1 (one temporal frame per still image)

  python benchmark/multimodal/bench_frontend.py --requests 64 --concurrency 16 --output /tmp/frontend.json

`--workers 0 1 2` runs every mode with each count of preprocessing worker processes (--mm-processor-worker-num;
0: the tokenizer manager's own threads). The workers' CPU is read from /proc and reported apart
(`worker_cpu_s`, `worker_cpu_utilisation`): main-process CPU is what the tokenizer manager's process pays.

Admission of 1-image chats while a 64-image chat is admitted (--mm-max-in-flight-per-request), and its peak
RSS: `bench_frontend_admission.py`, built on this file's model copy and stub scheduler. Main-process CPU of
each request-local fast-path candidate: `bench_request_fastpath.py`.

Qwen3-VL's preprocessing on the tiny Qwen3-VL (its preprocessor's pixel limits raised to Qwen3-VL's in a copy
of the checkpoint directory): 1280x720 -> 736x1280, 3680 patches per image.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

MODES = ("unique", "shared", "compact")


def model_copy(path: str) -> str:
    """The checkpoint with Qwen3-VL's real pixel limits (the tiny preset caps images smaller)."""
    out = tempfile.mkdtemp(prefix="frontend_model_")
    for name in os.listdir(path):
        if name != "preprocessor_config.json":
            os.symlink(os.path.join(path, name), os.path.join(out, name))
    cfg = json.loads(Path(path, "preprocessor_config.json").read_text())
    cfg["size"] = {"shortest_edge": 65536, "longest_edge": 16777216}
    cfg.pop("min_pixels", None)
    cfg.pop("max_pixels", None)
    Path(out, "preprocessor_config.json").write_text(json.dumps(cfg))
    return out


def jpeg_data_url(seed: int) -> str:
    """A photo-like 1280x720 JPEG (smooth gradients plus mild noise: ~100-200 kB, not a noise bomb)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:720, 0:1280].astype(np.float32)
    base = [127 + 100 * np.sin(x / rng.uniform(40, 200) + rng.uniform(0, 6)) * np.cos(y / rng.uniform(40, 200))
            for _ in range(3)]
    arr = np.stack(base, axis=-1) + rng.normal(0, 8, (720, 1280, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def make_manager(model: str, compact: bool, workers: int = 0):
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.server_args import PortArgs, ServerArgs
    from sglang.srt.utils.network import pick_unused_port

    os.environ["SGLANG_MM_COMPACT_STILL_IMAGES"] = "1" if compact else "0"  # read once, at construction
    try:
        args = ServerArgs(model_path=model, port=pick_unused_port(), mm_processor_worker_num=workers)
        port_args = PortArgs.create(args)
        os.rmdir(port_args.ipc_dir)  # no sockets: nothing is sent (the scheduler is a stub)
        return TokenizerManager(args, port_args)
    finally:
        del os.environ["SGLANG_MM_COMPACT_STILL_IMAGES"]


# The stub scheduler's other half: a separate process that unlinks each admitted request's segments, as scheduler
# rank 0 does once it has mapped them (freeing 21.6 MB of tmpfs pages costs ~3 ms of system time: the real
# tokenizer manager's process does not pay it, so neither does this one).
_UNLINKER = """import os, sys
for line in sys.stdin:
    try:
        os.unlink("/dev/shm/" + line.strip())
    except (FileNotFoundError, IsADirectoryError):
        pass
"""


class StubScheduler:
    """Admits a prepared request: takes its shared-memory names from the tokenizer manager (as sending does)
    and hands them to another process, which unlinks them."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", _UNLINKER], stdin=subprocess.PIPE, text=True)

    def admit(self, tm, rid: str) -> None:
        names = tm.builder.take_unsent_shm(rid)
        tm._forget_preparing(rid)
        if names:
            self.proc.stdin.write("".join(n + "\n" for n in names))
            self.proc.stdin.flush()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


async def burst(tm, urls: list[str], concurrency: int, bar, sched: StubScheduler) -> list[float]:
    """Every chat prepared (admitted) with at most `concurrency` in flight; each one's latency in ms."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(i: int, url: str) -> None:
        msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": "Describe this picture."}]}]
        async with sem:
            t0 = time.perf_counter()
            tokenized, _ = await tm.tokenize_request(GenerateReqInput(messages=msgs, rid=f"b{i}",
                                                                      sampling_params={"max_new_tokens": 1}))
            latencies.append((time.perf_counter() - t0) * 1e3)
            sched.admit(tm, tokenized.rid)  # the stub scheduler: admitted, released in another process
            bar.update(1)

    await asyncio.gather(*(one(i, u) for i, u in enumerate(urls)))
    return latencies


def _worker_pids(tm) -> list[int]:
    pool = tm.builder.mm_pool
    return [w["pid"] for w in pool.stats()["workers"]] if pool is not None else []


def run_mode(model: str, mode: str, warm: list[str], urls: list[str], concurrency: int, workers: int = 0) -> dict:
    from sglang.benchmark.progress import progress_bar
    from sglang.srt.utils.process_tree import cpu_seconds

    tm = make_manager(model, compact=mode == "compact", workers=workers)
    sched = StubScheduler()
    try:
        wbar = progress_bar(total=len(warm), desc=f"{mode} warm-up ({workers} workers)")
        asyncio.run(burst(tm, warm, concurrency, wbar, sched))
        wbar.close()
        images = [urls[0]] * len(urls) if mode == "shared" else urls
        before_stats = tm.builder.image_loader.stats()
        bar = progress_bar(total=len(images), desc=f"{mode} ({workers} workers)")
        pids = _worker_pids(tm)
        wcpu0 = [cpu_seconds(p) for p in pids]
        cpu0, ru0, wall0 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        latencies = asyncio.run(burst(tm, images, concurrency, bar, sched))
        cpu, wall, ru1 = time.process_time() - cpu0, time.perf_counter() - wall0, resource.getrusage(resource.RUSAGE_SELF)
        wcpu = [round(cpu_seconds(p) - c, 3) for p, c in zip(pids, wcpu0)]
        bar.close()
        after_stats = tm.builder.image_loader.stats()
    finally:
        sched.close()
        tm.builder.close()
        tm._request_pool.shutdown(wait=False)
    n = len(images)
    lat = sorted(latencies)
    return {
        "mode": mode, "workers": workers, "requests": n, "images": n, "concurrency": concurrency,
        "wall_s": round(wall, 3), "worker_cpu_s": wcpu, "worker_cpu_utilisation": [round(c / wall, 2) for c in wcpu],
        "main_process_cpu_s": round(cpu, 3), "cpu_ms_per_image": round(cpu / n * 1e3, 2),
        "user_s": round(ru1.ru_utime - ru0.ru_utime, 3), "sys_s": round(ru1.ru_stime - ru0.ru_stime, 3),
        "cpu_utilisation": round(cpu / wall, 2), "images_per_s": round(n / wall, 2), "requests_per_s": round(n / wall, 2),
        "latency_ms_p50": round(statistics.median(lat), 1), "latency_ms_p99": round(lat[min(n - 1, int(0.99 * n))], 1),
        "images_processed": after_stats["mm_images_processed"] - before_stats["mm_images_processed"],
        "images_shared": after_stats["mm_images_shared"] - before_stats["mm_images_shared"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=64, help="chats per burst (one image each)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=4, help="chats prepared before the measured burst")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--workers", nargs="+", type=int, default=[0],
                    help="preprocessing worker processes to run each mode with (0: the in-process threads)")
    ap.add_argument("--output", default=None, help="write the JSON summary here too")
    args = ap.parse_args()
    from sglang.testing.make_model import ensure_model

    model = model_copy(str(ensure_model("qwen3-vl-tiny", progress=False)))
    urls = [jpeg_data_url(1000 + i) for i in range(args.requests + args.warmup)]
    warm, urls = urls[: args.warmup], urls[args.warmup:]
    rows = []
    load_before = [round(x, 2) for x in os.getloadavg()]
    for workers in args.workers:
        for mode in args.modes:
            rows.append(run_mode(model, mode, warm, urls, args.concurrency, workers))
    summary = {"cpu_count": os.cpu_count(), "torch_threads": _torch_threads(),
               "loadavg_before": load_before, "loadavg_after": [round(x, 2) for x in os.getloadavg()],
               "jpeg_kb_mean": round(statistics.mean(len(u) * 3 / 4 / 1024 for u in urls), 1), "modes": rows}
    text = json.dumps(summary, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    sys.exit(main())
