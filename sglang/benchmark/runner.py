"""Drives one benchmark run: request bodies built up front, warmup, `/flush_cache`, arrivals at
`--request-rate` (gamma-distributed gaps with shape `--burstiness`; 1.0 is Poisson), at most
`--max-concurrency` requests in flight, a progress bar, and the JSONL record of the run."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
import orjson

from sglang.benchmark.backends import TIMEOUT, api_url, build_body, flush_cache, get_backend, prepare_prompt
from sglang.benchmark.client import send_request
from sglang.benchmark.datasets import SampleRequest
from sglang.benchmark.metrics import RESULT_KEYS, RequestOutput, summarize_errors
from sglang.benchmark.progress import progress_bar


@dataclass(frozen=True)
class RunConfig:
    base_url: str
    backend: str
    model: str | None
    request_rate: float = float("inf")
    burstiness: float = 1.0
    max_concurrency: int | None = None
    ignore_eos: bool = True
    disable_tqdm: bool = False
    seed: int = 0
    stream: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)
    apply_chat_template: bool = False
    flush_cache: bool = False


@dataclass
class Prepared:
    body: bytes
    prompt_len: int
    num_images: int


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


def prepare(cfg: RunConfig, requests: list[SampleRequest], tokenizer=None) -> list[Prepared]:
    """Serialized bodies (base64 images are not re-encoded inside the timed loop) and text-token counts."""
    api = get_backend(cfg.backend).api
    out = []
    for r in requests:
        prompt = prepare_prompt(r, api, tokenizer, cfg.apply_chat_template) if api != "chat" else None
        body = build_body(cfg.backend, cfg.model, r, prompt, ignore_eos=cfg.ignore_eos, stream=cfg.stream,
                          extra=cfg.extra_body)
        out.append(Prepared(orjson.dumps(body), prompt.text_len if prompt else r.prompt_len, len(r.images) + len(r.videos)))
    return out


async def _send_all(session: aiohttp.ClientSession, cfg: RunConfig, prepared: list[Prepared],
                    offsets: np.ndarray, desc: str) -> tuple[list[RequestOutput], float]:
    url, api = api_url(cfg.base_url, cfg.backend), get_backend(cfg.backend).api
    sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
    pbar = progress_bar(total=len(prepared), desc=desc, disable=cfg.disable_tqdm)

    async def one(p: Prepared) -> RequestOutput:
        if sem is None:
            out = await send_request(session, url, api, p.body, p.prompt_len, p.num_images, cfg.stream)
        else:
            async with sem:
                out = await send_request(session, url, api, p.body, p.prompt_len, p.num_images, cfg.stream)
        pbar.update(1)
        return out

    loop = asyncio.get_running_loop()
    start = time.perf_counter()
    t0 = loop.time()
    tasks = []
    for p, offset in zip(prepared, offsets):
        delay = t0 + float(offset) - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(p)))
    outputs = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    pbar.close()
    return list(outputs), duration


async def run_benchmark(cfg: RunConfig, requests: list[SampleRequest], warmup: list[SampleRequest] = (),
                        tokenizer=None) -> tuple[list[RequestOutput], float]:
    """Warm up (all at once, untimed), flush the server cache if asked, then send `requests` on schedule.
    Returns (outputs, duration). Raises RuntimeError only when every warmup request fails."""
    timed, warm = prepare(cfg, requests, tokenizer), prepare(cfg, list(warmup), tokenizer)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(timeout=TIMEOUT, connector=connector) as session:
        if warm:
            outs, _ = await _send_all(session, cfg, warm, np.zeros(len(warm)), "warmup")
            if not any(o.success for o in outs):
                raise RuntimeError(f"all {len(outs)} warmup request(s) failed; first error: {outs[0].error} "
                                   "(check the benchmark arguments and the server)")
            failed = sum(not o.success for o in outs)
            if failed:
                print(f"warning: {failed}/{len(outs)} warmup request(s) failed: "
                      f"{next(o.error for o in outs if not o.success)}")
        if cfg.flush_cache:
            err = await flush_cache(session, cfg.base_url)
            print("flushed the server cache" if err is None else f"warning: /flush_cache failed: {err}")
        offsets = arrival_offsets(len(timed), cfg.request_rate, cfg.burstiness, cfg.seed)
        return await _send_all(session, cfg, timed, offsets, "benchmark")


def result_record(args: dict[str, Any], metrics: dict[str, Any], outputs: list[RequestOutput] | None = None,
                  requests: list[SampleRequest] | None = None) -> dict[str, Any]:
    """One JSONL line: `tag` (when given), then upstream's keys in its order, then the dataset-size settings;
    with `outputs`/`requests` (`--output-details`) also per-request arrays (seconds) and errors."""
    rate = args.get("request_rate")
    values = {**metrics, "backend": args.get("backend"), "dataset_name": args.get("dataset_name"),
              "request_rate": "inf" if rate == float("inf") else rate,
              "max_concurrency": args.get("max_concurrency")}
    rec: dict[str, Any] = {"tag": args["tag"]} if args.get("tag") else {}
    rec.update({k: values[k] for k in RESULT_KEYS})
    for k in ("sharegpt_output_len", "random_input_len", "random_output_len", "random_range_ratio"):
        rec[k] = args.get(k)
    if outputs is not None:
        rec.update({
            "input_lens": [o.prompt_len for o in outputs],
            "output_lens": metrics["output_lens"],
            "ttfts": [o.ttft for o in outputs],
            "itls": [o.itl for o in outputs],
            "e2els": [o.latency for o in outputs],
            "num_images": [len(r.images) for r in requests] if requests is not None else None,
            "num_videos": [len(r.videos) for r in requests] if requests is not None else None,
            "generated_texts": [o.generated_text for o in outputs],
            "errors": [o.error for o in outputs],
            "error_summary": [{"count": n, "error": msg} for n, msg in summarize_errors(outputs)],
        })
    return rec
