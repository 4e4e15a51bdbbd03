"""Online serving benchmark against an OpenAI-compatible chat endpoint (streaming).

    python -m sglang.bench_serving --backend sglang-oai-chat --port 30000 \\
        --dataset-name random-mm --num-prompts 16 --max-concurrency 4 \\
        --random-input-len 1100 --random-output-len 230 \\
        --random-mm-bucket-config '{(720, 1280, 1): 1.0}' --output-file results.jsonl

Flags and metric definitions follow `vllm bench serve` (random-mm dataset included); the `image` dataset
follows sglang's. The shared `--random-*-len` / `--random-range-ratio` flags size the text of both datasets.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import aiohttp
import orjson

from sglang.benchmark import backends, datasets, runner
from sglang.benchmark.metrics import METRICS, calculate_metrics, format_result


def _checked(parse):
    """argparse `type` that keeps the parser's own error message."""
    def run(text: str):
        try:
            return parse(text)
        except (ValueError, SyntaxError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    run.__name__ = parse.__name__
    return run


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang.bench_serving", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--backend", choices=backends.BACKENDS, default="sglang-oai-chat")
    a("--base-url", default=None, help="server URL, e.g. http://127.0.0.1:30000 (overrides --host/--port)")
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--model", default=None, help="model name sent in requests (default: the first of /v1/models)")
    a("--tokenizer", default=None, help="tokenizer path (default: the server's, from /get_model_info)")
    a("--dataset-name", choices=("random-mm", "image"), default="random-mm")
    a("--num-prompts", type=int, default=1000)
    a("--seed", type=int, default=0)
    a("--request-rate", type=float, default=float("inf"), help="requests/s; inf sends all at once")
    a("--burstiness", type=float, default=1.0, help="gamma shape of the arrival gaps; 1 is Poisson")
    a("--max-concurrency", type=int, default=None)
    a("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
      help="send ignore_eos/min_tokens (sglang-oai-chat only) so every request yields its output length")
    a("--warmup-requests", type=int, default=1, help="untimed requests (fresh samples) sent first")
    a("--output-file", default=None, help="append one JSON line with every metric and per-request arrays")
    a("--disable-tqdm", action="store_true")
    a("--percentile-metrics", default=",".join(METRICS), help="comma list of ttft,tpot,itl,e2el to report")
    a("--metric-percentiles", default="99", help="comma list of percentiles, e.g. 50,90,99")
    t = p.add_argument_group("random text (both datasets)")
    t.add_argument("--random-input-len", type=int, default=1024)
    t.add_argument("--random-output-len", type=int, default=128)
    t.add_argument("--random-prefix-len", type=int, default=0, help="shared random prefix, in tokens")
    t.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="lengths uniform in [floor(n*(1-r)), ceil(n*(1+r))], 0 <= r < 1")
    m = p.add_argument_group("random-mm dataset")
    m.add_argument("--random-mm-base-items-per-request", type=int, default=1)
    m.add_argument("--random-mm-num-mm-items-range-ratio", type=float, default=0.0)
    m.add_argument("--random-mm-limit-mm-per-prompt", type=_checked(datasets.parse_limit_mm),
                   default=dict(datasets.DEFAULT_LIMIT_MM), help='JSON, e.g. \'{"image": 3, "video": 0}\'')
    m.add_argument("--random-mm-bucket-config", type=_checked(datasets.parse_bucket_config),
                   default=dict(datasets.DEFAULT_BUCKETS), help="e.g. '{(256, 256, 1): 0.5, (720, 1280, 1): 0.5}'")
    i = p.add_argument_group("image dataset")
    i.add_argument("--image-count", type=int, default=3)
    i.add_argument("--random-image-count", action="store_true", help="image count uniform in [1, --image-count]")
    i.add_argument("--image-resolution", default="1080p", help="4k, 1080p, 720p, 360p or HxW")
    i.add_argument("--image-format", choices=datasets.IMAGE_FORMATS, default="jpeg")
    i.add_argument("--image-content", choices=("random", "blank"), default="random")
    return p


def make_dataset(args: argparse.Namespace, tokenizer, num: int, seed: int) -> list[datasets.SampleRequest]:
    progress = not args.disable_tqdm and num > 1
    text = datasets.TextLenConfig(args.random_input_len, args.random_output_len, args.random_prefix_len,
                                  args.random_range_ratio)
    if args.dataset_name == "random-mm":
        cfg = datasets.RandomMMConfig(text, args.random_mm_base_items_per_request,
                                      args.random_mm_num_mm_items_range_ratio, args.random_mm_limit_mm_per_prompt,
                                      args.random_mm_bucket_config)
        return datasets.sample_random_mm(tokenizer, num, cfg, seed, progress)
    cfg = datasets.ImageDatasetConfig(text, args.image_count, args.random_image_count, args.image_resolution,
                                      args.image_format, args.image_content)
    return datasets.sample_image_dataset(tokenizer, num, cfg, seed, progress)


async def _resolve_server(args: argparse.Namespace) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        if args.model is None:
            args.model = await backends.default_model(session, args.base_url)
        if args.tokenizer is None:
            args.tokenizer = await backends.server_model_path(session, args.base_url) or args.model


def _json_args(args: argparse.Namespace) -> dict[str, Any]:
    out = dict(vars(args))
    out["request_rate"] = "inf" if args.request_rate == float("inf") else args.request_rate
    out["random_mm_bucket_config"] = {str(k): v for k, v in args.random_mm_bucket_config.items()}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    args.base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    percentiles = [float(x) for x in args.metric_percentiles.split(",") if x.strip()]
    selected = [x.strip() for x in args.percentile_metrics.split(",") if x.strip()]
    unknown = set(selected) - set(METRICS)
    if unknown:
        raise SystemExit(f"--percentile-metrics: unknown {sorted(unknown)}; choose from {METRICS}")

    try:
        asyncio.run(_resolve_server(args))
    except (aiohttp.ClientError, asyncio.TimeoutError, RuntimeError) as e:
        raise SystemExit(f"cannot query {args.base_url} for the model ({type(e).__name__}: {e}); "
                         "is the server up? (or pass --model and --tokenizer)")
    try:
        tokenizer = datasets.load_tokenizer(args.tokenizer)
    except Exception as e:  # noqa: BLE001 - say which tokenizer and how to override it
        raise SystemExit(f"cannot load tokenizer {args.tokenizer!r} ({type(e).__name__}: {e}); pass --tokenizer")
    print(f"model={args.model} tokenizer={args.tokenizer} dataset={args.dataset_name} prompts={args.num_prompts}")
    requests = make_dataset(args, tokenizer, args.num_prompts, args.seed)
    # Warmup samples come from another seed so they do not pre-fill caches for the timed requests.
    warmup = make_dataset(args, tokenizer, args.warmup_requests, args.seed + 1_000_003) if args.warmup_requests > 0 else []

    cfg = runner.RunConfig(args.base_url, args.backend, args.model, args.request_rate, args.burstiness,
                           args.max_concurrency, args.ignore_eos, args.disable_tqdm, args.seed)
    try:
        outputs, duration = asyncio.run(runner.run_benchmark(cfg, requests, warmup))
    except RuntimeError as e:
        raise SystemExit(str(e))
    metrics = calculate_metrics(outputs, duration, percentiles, selected)
    errors = runner.format_errors(outputs)
    if errors:
        print(errors)
    print(format_result(metrics, args.max_concurrency, args.request_rate))
    record = runner.result_record(_json_args(args), metrics, outputs, requests)
    if args.output_file:
        with open(args.output_file, "ab") as f:
            f.write(orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    return record


if __name__ == "__main__":
    sys.exit(0 if main()["completed"] > 0 else 1)
