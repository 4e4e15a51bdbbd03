"""The benchmark of one run against a started server.

Dataset workloads go through `sglang.bench_serving.main` in this process with the user's flags (its printout
goes to the configuration's log file); `--trace` workloads are replayed here with bench_serving's request
builder and sender, at the trace's own times. Either way the result is bench_serving's record (upstream's
keys), trimmed of per-request arrays, plus `failed` and the most frequent error messages.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import io
import json
from pathlib import Path
from typing import Any

# bench_serving flags the tuner sets itself.
OWNED = ("--base-url", "--host", "--port", "--output-file", "--output-details", "--max-concurrency", "--tag")
# The tuner's workload when none is given: a small multimodal smoke test (bench_serving's own defaults
# read a ShareGPT file and ask 1000 prompts x 1024 tokens). Real tuning passes real traffic.
DEFAULTS = {"--dataset-name": "random-mm", "--num-prompts": "64", "--random-input-len": "128",
            "--random-output-len": "32", "--random-mm-bucket-config": "{(256, 256, 1): 1.0}"}
ARRAY_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "e2els", "num_images", "generated_texts", "errors")


def bench_parser() -> argparse.ArgumentParser:
    from sglang.bench_serving import build_parser

    return build_parser()


def _given(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def with_defaults(passthrough: list[str]) -> list[str]:
    """The user's bench_serving flags, plus the tuner's workload defaults for those not given (only when no
    --dataset-name is given: another dataset keeps bench_serving's own defaults)."""
    argv = list(passthrough)
    if not _given(argv, "--dataset-name"):
        for flag, value in DEFAULTS.items():
            if not _given(argv, flag):
                argv += [flag, value]
    if not _given(argv, "--disable-tqdm"):
        argv.append("--disable-tqdm")
    return argv


def check_passthrough(passthrough: list[str]) -> argparse.Namespace:
    """Parses the bench flags once up front (a typo fails before any server starts)."""
    for flag in OWNED:
        if _given(passthrough, flag):
            raise SystemExit(f"{flag} is set by the tuner (use --max-concurrency V1 V2 ... for concurrency)")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns, unknown = bench_parser().parse_known_args(with_defaults(passthrough))
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        raise SystemExit("python -m sglang.tune: bench_serving flag " + (lines[-1].split("error: ", 1)[-1]
                                                                         if lines else "error")) from None
    if unknown:
        raise SystemExit(f"python -m sglang.tune: unknown flag(s), neither the tuner's nor bench_serving's: "
                         f"{' '.join(unknown)} (python -m sglang.tune --help; python -m sglang.bench_serving --help)")
    return ns


def fingerprint(parts: dict[str, Any]) -> str:
    """Short hash of what a result depends on besides its configuration (workload, model, common flags)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha1(blob).hexdigest()[:12]


def trace_fingerprint(path: str) -> str:
    return hashlib.sha1(Path(path).read_bytes()).hexdigest()[:12]


def trim(record: dict[str, Any]) -> dict[str, Any]:
    """Drops per-request arrays; keeps `failed` and the first three error summaries."""
    out = {k: v for k, v in record.items() if k not in ARRAY_KEYS and k != "error_summary"}
    summary = record.get("error_summary") or []
    out["failed"] = sum(e["count"] for e in summary)
    out["error_summary"] = summary[:3]
    return out


@contextlib.contextmanager
def _output_to(log_path: Path):
    with open(log_path, "a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        yield


def run_dataset(passthrough: list[str], base_url: str, concurrency: int | None, log_path: Path) -> dict[str, Any]:
    """bench_serving in-process; raises RuntimeError with its message when it gives up (SystemExit)."""
    from sglang import bench_serving

    argv = with_defaults(passthrough) + ["--base-url", base_url, "--output-details"]
    if concurrency is not None:
        argv += ["--max-concurrency", str(concurrency)]
    with _output_to(log_path):
        try:
            record = bench_serving.main(argv)
        except SystemExit as e:
            raise RuntimeError(f"bench_serving: {e.code}") from None
    return trim(record)


def run_trace(trace_path: str, time_scale: float, passthrough: list[str], base_url: str,
              concurrency: int | None, log_path: Path) -> dict[str, Any]:
    """Replays the trace; bench flags that apply: --backend, --model, --tokenizer, --seed, --disable-stream,
    --disable-ignore-eos, --extra-request-body, --apply-chat-template, --warmup-requests, --flush-cache."""
    from sglang import bench_serving
    from sglang.benchmark import datasets, runner
    from sglang.benchmark.metrics import calculate_metrics, format_result
    from sglang.tuning.trace import load_trace

    args = bench_parser().parse_args(list(passthrough) + ["--base-url", base_url])
    args.base_url = base_url
    args.max_concurrency = concurrency
    with _output_to(log_path):
        asyncio.run(bench_serving._resolve_server(args))
        tokenizer = datasets.load_tokenizer(args.tokenizer)
        trace = load_trace(trace_path, tokenizer, time_scale, args.seed)
        warmup = [datasets.SampleRequest("Hello, warm up.", 4, 4) for _ in range(max(0, args.warmup_requests))]
        cfg = runner.RunConfig(base_url, args.backend, args.model, max_concurrency=concurrency,
                               ignore_eos=not args.disable_ignore_eos, disable_tqdm=True, seed=args.seed,
                               stream=not args.disable_stream, extra_body=args.extra_request_body,
                               apply_chat_template=args.apply_chat_template, flush_cache=args.flush_cache)
        outputs, duration = asyncio.run(_replay(cfg, trace, warmup, tokenizer))
        metrics = calculate_metrics(outputs, duration, lambda t: len(tokenizer.encode(t, add_special_tokens=False)))
        print(format_result(metrics, args.backend, float("inf"), concurrency))
    vals = vars(args) | {"dataset_name": "trace", "request_rate": float("inf")}
    return trim(runner.result_record(vals, metrics, outputs, trace.requests))


async def _replay(cfg, trace, warmup, tokenizer):
    """runner.run_benchmark with the trace's own send times instead of --request-rate arrivals."""
    import aiohttp
    import numpy as np

    from sglang.benchmark import runner
    from sglang.benchmark.backends import TIMEOUT, flush_cache

    timed, warm = runner.prepare(cfg, trace.requests, tokenizer), runner.prepare(cfg, warmup, tokenizer)
    async with aiohttp.ClientSession(timeout=TIMEOUT, connector=aiohttp.TCPConnector(limit=0)) as session:
        if warm:
            outs, _ = await runner._send_all(session, cfg, warm, np.zeros(len(warm)), "warmup")
            if not any(o.success for o in outs):
                raise RuntimeError(f"all warmup requests failed: {outs[0].error}")
        if cfg.flush_cache:
            await flush_cache(session, cfg.base_url)
        return await runner._send_all(session, cfg, timed, trace.offsets, "trace")


def registered_env() -> dict[str, str]:
    """The SGLANG_* switches set in this environment (servers inherit them), for the fingerprint."""
    from sglang.srt.environ import envs

    return {v.name: str(v.get()) for v in envs.all() if v.is_set()}
