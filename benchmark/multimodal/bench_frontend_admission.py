"""Admission of small requests while a huge one is admitted (issue 50, item 5): one chat with 64 1920x1080 JPEGs
goes into an in-process TokenizerManager (scheduler stubbed, as in bench_frontend.py), and while it is being
prepared, 1-image chats (1280x720 JPEG) are sent in a closed loop, `--small-concurrency` at a time; each one's
admission latency (HTTP-less: request in -> ready to send) is recorded until the huge one is ready.

Each configuration (preprocessing worker processes x --mm-max-in-flight-per-request) runs in a fresh process, so
its peak RSS is its own: `peak_rss_mb` is the peak resident set (VmHWM, reset through /proc/<pid>/clear_refs
just before the huge request) of the process doing the pixel work: the tokenizer manager's with 0 workers, the
worker's with 1 (the main process's is reported too). `--bounds 0 auto` compares no bound (0: every image of the
request at once, the path before) with the default bound (half the preprocessing slots, at least 2).

  python benchmark/multimodal/bench_frontend_admission.py --workers 0 1 --bounds 0 auto --output /tmp/admission.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_frontend import StubScheduler, _worker_pids, model_copy  # noqa: E402


def jpeg_data_url(seed: int, w: int, h: int) -> str:
    """A photo-like JPEG (smooth gradients plus mild noise)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = [127 + 100 * np.sin(x / rng.uniform(40, 200) + rng.uniform(0, 6)) * np.cos(y / rng.uniform(40, 200))
            for _ in range(3)]
    arr = np.stack(base, axis=-1) + rng.normal(0, 8, (h, w, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak(pid: int) -> None:
    """VmHWM := VmRSS (Linux clear_refs 5): the peak from now on."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def _chat(urls: list[str]):
    from sglang.srt.managers.io_struct import GenerateReqInput

    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls] + [{"type": "text", "text": "Describe."}]
    return GenerateReqInput(messages=[{"role": "user", "content": parts}], sampling_params={"max_new_tokens": 1})


async def _scenario(tm, sched: StubScheduler, huge: list[str], small: list[str], concurrency: int) -> dict:
    """The huge chat, and 1-image chats `concurrency` at a time until it is ready; latencies in ms."""
    latencies: list[float] = []
    done = asyncio.Event()

    async def admit(urls, rid):
        obj = _chat(urls)
        obj.rid = rid
        tokenized, _ = await tm.tokenize_request(obj)
        sched.admit(tm, tokenized.rid)

    async def huge_one():
        t0 = time.perf_counter()
        try:
            await admit(huge, "huge")
        finally:  # a failed huge request ends the small ones' loop too (its error is raised below)
            done.set()
        return (time.perf_counter() - t0) * 1e3

    async def small_loop(k):
        i = 0
        while not done.is_set():
            t0 = time.perf_counter()
            await admit([small[(k + i * concurrency) % len(small)]], f"s{k}-{i}")
            if not done.is_set():  # only requests admitted while the huge one was being prepared count
                latencies.append((time.perf_counter() - t0) * 1e3)
            i += 1

    huge_task = asyncio.create_task(huge_one())
    await asyncio.sleep(0)  # the huge request is checked and handed to its build thread first
    await asyncio.gather(huge_task, *(small_loop(k) for k in range(concurrency)))
    return {"huge_ms": round(await huge_task, 1), "latencies": latencies}


def run_one(model: str, workers: int, bound: int | None, data: dict, concurrency: int) -> dict:
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.server_args import PortArgs, ServerArgs
    from sglang.srt.utils.network import pick_unused_port

    args = ServerArgs(model_path=model, port=pick_unused_port(), mm_processor_worker_num=workers,
                      limit_mm_per_prompt=len(data["huge"]), mm_max_in_flight_per_request=bound,
                      context_length=1 << 20)  # 64 1080p images: ~130k tokens (nothing is generated)
    port_args = PortArgs.create(args)
    os.rmdir(port_args.ipc_dir)  # nothing is sent: the scheduler is a stub
    tm = TokenizerManager(args, port_args)
    sched = StubScheduler()
    try:
        for i in range(2):  # warm-up: the processor's first call, the workers' first job
            asyncio.run(_scenario_warm(tm, sched, data["small"][i]))
        pids = _worker_pids(tm)
        for pid in [os.getpid(), *pids]:
            _reset_peak(pid)
        rss0 = {pid: _status_kb(pid, "VmRSS") for pid in [os.getpid(), *pids]}
        cpu0, wall0 = time.process_time(), time.perf_counter()
        out = asyncio.run(_scenario(tm, sched, data["huge"], data["small"], concurrency))
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        peaks = {pid: _status_kb(pid, "VmHWM") for pid in [os.getpid(), *pids]}
    finally:
        sched.close()
        tm.builder.close()
        tm._request_pool.shutdown(wait=False)
    lat = sorted(out["latencies"])
    pixel_pid = pids[0] if pids else os.getpid()
    return {
        "workers": workers, "bound": tm.builder.mm_in_flight, "small_requests": len(lat),
        "small_ms_p50": round(statistics.median(lat), 1) if lat else None,
        "small_ms_p99": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1) if lat else None,
        "small_ms_max": round(lat[-1], 1) if lat else None, "huge_ms": out["huge_ms"], "wall_s": round(wall, 2),
        "main_cpu_s": round(cpu, 2),
        "peak_rss_mb": round(peaks[pixel_pid] / 1024, 1), "rss_before_mb": round(rss0[pixel_pid] / 1024, 1),
        "main_peak_rss_mb": round(peaks[os.getpid()] / 1024, 1),
    }


async def _scenario_warm(tm, sched, url):
    obj = _chat([url])
    tokenized, _ = await tm.tokenize_request(obj)
    sched.admit(tm, tokenized.rid)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--huge-images", type=int, default=64)
    ap.add_argument("--small-concurrency", type=int, default=2)
    ap.add_argument("--workers", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--bounds", nargs="+", default=["0", "auto"], help="--mm-max-in-flight-per-request values")
    ap.add_argument("--output", default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one configuration, JSON in a file
    args = ap.parse_args()
    if args.one:
        spec = json.loads(Path(args.one).read_text())
        data = json.loads(Path(spec["data"]).read_text())
        row = run_one(spec["model"], spec["workers"], spec["bound"], data, spec["concurrency"])
        Path(spec["out"]).write_text(json.dumps(row))
        return
    from sglang.benchmark.progress import progress_bar
    from sglang.testing.make_model import ensure_model

    model = model_copy(str(ensure_model("qwen3-vl-tiny", progress=False)))
    tmp = tempfile.mkdtemp(prefix="admission_")
    bar = progress_bar(total=args.huge_images + 32, desc="images")
    huge, small = [], []
    for i in range(args.huge_images + 32):
        big = i < args.huge_images
        (huge if big else small).append(jpeg_data_url(5000 + i, *((1920, 1080) if big else (1280, 720))))
        bar.update(1)
    bar.close()
    Path(tmp, "data.json").write_text(json.dumps({"huge": huge, "small": small}))
    rows, load_before = [], [round(x, 2) for x in os.getloadavg()]
    configs = [(w, None if b == "auto" else int(b)) for w in args.workers for b in args.bounds]
    bar = progress_bar(total=len(configs), desc="configurations")
    for i, (workers, bound) in enumerate(configs):
        spec = {"model": model, "workers": workers, "bound": bound, "data": str(Path(tmp, "data.json")),
                "concurrency": args.small_concurrency, "out": str(Path(tmp, f"row{i}.json"))}
        Path(tmp, f"spec{i}.json").write_text(json.dumps(spec))
        subprocess.run([sys.executable, __file__, "--one", str(Path(tmp, f"spec{i}.json"))], check=True)
        rows.append(json.loads(Path(spec["out"]).read_text()))
        bar.update(1)
    bar.close()
    summary = {"cpu_count": os.cpu_count(), "loadavg_before": load_before,
               "loadavg_after": [round(x, 2) for x in os.getloadavg()], "huge_images": args.huge_images,
               "huge_jpeg_kb_mean": round(statistics.mean(len(u) * 3 / 4 / 1024 for u in huge), 1), "rows": rows}
    text = json.dumps(summary, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text)


if __name__ == "__main__":
    sys.exit(main())
