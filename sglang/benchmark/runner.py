"""Drives one benchmark run: warmup, arrivals at `--request-rate` (gamma-distributed gaps with shape
`--burstiness`; 1.0 is Poisson), at most `--max-concurrency` requests in flight, a progress bar, and the
JSONL record of the run."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aiohttp
import numpy as np
import orjson

from sglang.benchmark.backends import CHAT_PATH, TIMEOUT, build_chat_body, stream_chat
from sglang.benchmark.datasets import SampleRequest
from sglang.benchmark.metrics import BenchmarkMetrics, RequestOutput, summarize_errors


@dataclass(frozen=True)
class RunConfig:
    base_url: str
    backend: str
    model: str
    request_rate: float = float("inf")
    burstiness: float = 1.0
    max_concurrency: int | None = None
    ignore_eos: bool = True
    disable_tqdm: bool = False
    seed: int = 0


def arrival_offsets(n: int, rate: float, burstiness: float, seed: int) -> np.ndarray:
    """Send time of each request relative to the start; gaps ~ Gamma(shape=b, scale=1/(rate*b)), mean 1/rate."""
    if burstiness <= 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    if rate <= 0:
        raise ValueError(f"request rate must be positive, got {rate}")
    if n == 0 or rate == float("inf"):
        return np.zeros(n)
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def _progress(total: int, disable: bool, desc: str):
    from tqdm.asyncio import tqdm

    return tqdm(total=total, disable=disable, desc=desc)


async def _send_all(
    session: aiohttp.ClientSession, cfg: RunConfig, requests: list[SampleRequest], offsets: np.ndarray, desc: str
) -> tuple[list[RequestOutput], float]:
    url = cfg.base_url + CHAT_PATH
    # Serialize up front so base64 images are not re-encoded inside the timed loop.
    bodies = [orjson.dumps(build_chat_body(cfg.backend, cfg.model, r, cfg.ignore_eos)) for r in requests]
    sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
    pbar = _progress(len(requests), cfg.disable_tqdm, desc)

    async def one(body: bytes, req: SampleRequest) -> RequestOutput:
        if sem is None:
            out = await stream_chat(session, url, body, req.prompt_len)
        else:
            async with sem:
                out = await stream_chat(session, url, body, req.prompt_len)
        pbar.update(1)
        return out

    loop = asyncio.get_running_loop()
    start = time.perf_counter()
    t0 = loop.time()
    tasks = []
    for body, req, offset in zip(bodies, requests, offsets):
        delay = t0 + float(offset) - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(body, req)))
    outputs = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    pbar.close()
    return list(outputs), duration


async def run_benchmark(
    cfg: RunConfig, requests: list[SampleRequest], warmup: list[SampleRequest] = ()
) -> tuple[list[RequestOutput], float]:
    """Warm up (all at once, untimed), then send `requests` on schedule. Returns (outputs, duration)."""
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(timeout=TIMEOUT, connector=connector) as session:
        if warmup:
            outs, _ = await _send_all(session, cfg, list(warmup), np.zeros(len(warmup)), "warmup")
            if not any(o.success for o in outs):
                raise RuntimeError(f"all {len(outs)} warmup request(s) failed; first error: {outs[0].error}")
            failed = sum(not o.success for o in outs)
            if failed:
                print(f"warning: {failed}/{len(outs)} warmup request(s) failed: {outs[0].error or ''}")
        offsets = arrival_offsets(len(requests), cfg.request_rate, cfg.burstiness, cfg.seed)
        return await _send_all(session, cfg, requests, offsets, "benchmark")


def format_errors(outputs: list[RequestOutput]) -> str:
    rows = summarize_errors(outputs)
    if not rows:
        return ""
    total = sum(n for n, _ in rows)
    return "\n".join([f"{total} request(s) failed:"] + [f"  {n:>5} x {msg}" for n, msg in rows])


def result_record(
    args: dict[str, Any], metrics: BenchmarkMetrics, outputs: list[RequestOutput], requests: list[SampleRequest]
) -> dict[str, Any]:
    """One JSONL line: run settings, every metric (`*_ms` in milliseconds) and per-request arrays in seconds,
    as vLLM's result file has them (failed requests: 0 latency, 0 output tokens, their error text)."""
    return {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        **{k: args.get(k) for k in ("backend", "base_url", "model", "tokenizer", "dataset_name", "num_prompts",
                                    "request_rate", "burstiness", "max_concurrency", "seed", "ignore_eos")},
        "args": args,
        **metrics.to_dict(),
        "error_summary": [{"count": n, "error": msg} for n, msg in summarize_errors(outputs)],
        "ttfts": [o.ttft for o in outputs],
        "itls": [o.itl for o in outputs],
        "e2els": [o.latency for o in outputs],
        "input_lens": [r.prompt_len for r in requests],
        "output_lens": metrics.output_lens,
        "server_prompt_tokens": [o.server_prompt_tokens for o in outputs],
        "num_images": [len(r.images) for r in requests],
        "errors": [o.error for o in outputs],
    }
