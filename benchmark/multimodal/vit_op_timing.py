"""Timing helpers shared by the ViT operator microbenchmarks (before/after in one process).

Each operator is timed as the median of `iters` calls after `warmup` calls. On CUDA the device is
synchronized before and after every call, so a figure is the wall time the caller waits for the
result, host-side work (index building, copies, launches) included, as in the seed's measurements.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from typing import Callable

import torch
from tqdm import tqdm


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_ms(fn: Callable[[], object], device: str, warmup: int, iters: int, desc: str) -> float:
    """Median wall time of one call, in milliseconds."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in tqdm(range(iters), desc=desc, leave=False):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {torch.get_num_threads()} threads"


def check_device(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda requested but CUDA is not available")


def print_table(headers: list[str], rows: list[list]) -> None:
    cells = [[str(h) for h in headers]] + [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for k, r in enumerate(cells):
        print(" | ".join(c.rjust(w) for c, w in zip(r, widths)))
        if k == 0:
            print("-+-".join("-" * w for w in widths))


def write_json(path: str | None, payload: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(payload, f, indent=2)
        print(f"wrote {path}")
