"""Online serving benchmark, with upstream SGLang's `bench_serving` flags, datasets and result block.

    python -m sglang.bench_serving --backend sglang --dataset-name random --num-prompts 200 \\
        --random-input-len 1024 --random-output-len 256 --random-range-ratio 1 --max-concurrency 16
    python -m sglang.bench_serving --backend sglang-oai-chat --dataset-name random-mm --num-prompts 16 \\
        --random-mm-bucket-config '{(720, 1280, 1): 1.0}' --output-file results.jsonl

Backends, datasets and flags: docs/benchmarks.md. Datasets are synthetic or read from a local --dataset-path;
nothing is downloaded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import aiohttp
import orjson

from sglang.benchmark import backends, datasets, runner
from sglang.benchmark.metrics import calculate_metrics, format_errors, format_result


def _checked(parse):
    """argparse `type` that keeps the parser's own error message."""
    def run(text: str):
        try:
            return parse(text)
        except (ValueError, SyntaxError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    run.__name__ = parse.__name__
    return run


def parse_json_object(text: str) -> dict[str, Any]:
    obj = json.loads(text)
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {text!r}")
    return obj


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang.bench_serving", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--backend", choices=tuple(backends.BACKENDS), default="sglang")
    a("--base-url", default=None, help="server URL, e.g. http://127.0.0.1:30000 (overrides --host/--port)")
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=None, help="default: the backend's (30000; 8000 for vllm and vllm-chat)")
    a("--model", default=None, help="model name sent in requests (default: the first of /v1/models)")
    a("--tokenizer", default=None, help="tokenizer path (default: the server's, from /get_model_info)")
    a("--dataset-name", choices=datasets.DATASETS, default="sharegpt")
    a("--dataset-path", default=None, help="local file for sharegpt and mmmu (never downloaded)")
    a("--num-prompts", type=int, default=1000)
    a("--seed", type=int, default=1)
    a("--request-rate", type=float, default=float("inf"), help="requests/s; inf sends all at once")
    a("--burstiness", type=float, default=1.0, help="gamma shape of the arrival gaps; 1 is Poisson")
    a("--max-concurrency", type=int, default=None)
    a("--disable-ignore-eos", action="store_true", help="let requests stop at EOS (ignore_eos is sent by default)")
    a("--ignore-eos", action=argparse.BooleanOptionalAction, default=None, help=argparse.SUPPRESS)
    a("--disable-stream", action="store_true", help="non-streamed requests (TTFT = latency)")
    a("--apply-chat-template", action="store_true",
      help="render prompts through the tokenizer's chat template (sglang and completions backends)")
    a("--extra-request-body", type=_checked(parse_json_object), default={}, metavar='\'{"key": value}\'',
      help="JSON merged into every request body")
    a("--flush-cache", action="store_true", help="POST /flush_cache after the warmup, before the timed run")
    a("--warmup-requests", type=int, default=1, help="untimed requests sent first")
    a("--tag", default=None, help="stored as `tag` in the result line")
    a("--output-file", default=None, help="append one JSON line with the results of the run")
    a("--output-details", action="store_true", help="add per-request arrays to the result line")
    a("--disable-tqdm", action="store_true")
    s = p.add_argument_group("sharegpt dataset")
    s.add_argument("--sharegpt-output-len", type=int, default=None, help="fixed output length")
    s.add_argument("--sharegpt-context-len", type=int, default=None, help="skip prompt + output longer than this")
    t = p.add_argument_group("random text (random, random-ids, image, random-mm; --random-output-len for mmmu)")
    t.add_argument("--random-input-len", type=int, default=1024)
    t.add_argument("--random-output-len", type=int, default=1024)
    t.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="lengths uniform in [max(int(n*r), 1), n]; random-mm: [floor(n*(1-r)), ceil(n*(1+r))]")
    t.add_argument("--random-prefix-len", type=int, default=0, help="shared random prefix, in tokens")
    g = p.add_argument_group("generated-shared-prefix dataset")
    g.add_argument("--gsp-num-groups", type=int, default=64)
    g.add_argument("--gsp-prompts-per-group", type=int, default=16)
    g.add_argument("--gsp-system-prompt-len", type=int, default=2048)
    g.add_argument("--gsp-question-len", type=int, default=128)
    g.add_argument("--gsp-output-len", type=int, default=256)
    m = p.add_argument_group("random-mm dataset")
    m.add_argument("--random-mm-base-items-per-request", type=int, default=1)
    m.add_argument("--random-mm-num-mm-items-range-ratio", type=float, default=0.0)
    m.add_argument("--random-mm-limit-mm-per-prompt", type=_checked(datasets.parse_limit_mm),
                   default=dict(datasets.DEFAULT_LIMIT_MM), help='JSON, e.g. \'{"image": 3, "video": 0}\'')
    m.add_argument("--random-mm-bucket-config", type=_checked(datasets.parse_bucket_config),
                   default=dict(datasets.DEFAULT_BUCKETS),
                   help="(H, W, T): probability; T > 1 are mp4 videos of T frames at 2 fps, e.g. "
                        "'{(256, 256, 1): 0.5, (360, 640, 8): 0.5}'")
    i = p.add_argument_group("image dataset")
    i.add_argument("--image-count", type=int, default=3)
    i.add_argument("--random-image-count", action="store_true", help="image count uniform in [1, --image-count]")
    i.add_argument("--image-resolution", default="1080p", help="4k, 1080p, 720p, 360p or HxW")
    i.add_argument("--image-format", choices=datasets.IMAGE_FORMATS, default="jpeg")
    i.add_argument("--image-content", choices=("random", "blank"), default="random")
    return p


async def _resolve_server(args: argparse.Namespace) -> None:
    native = backends.get_backend(args.backend).api == "generate"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        if args.model is None:
            try:
                args.model = await backends.default_model(session, args.base_url)
            except (aiohttp.ClientError, asyncio.TimeoutError, RuntimeError):
                if not native or args.tokenizer is None:  # /generate needs no model name
                    raise
        if args.tokenizer is None:
            args.tokenizer = await backends.server_model_path(session, args.base_url) or args.model


def _warmup(args: argparse.Namespace, tokenizer, requests: list) -> list:
    if args.warmup_requests <= 0:
        return []
    if args.dataset_name in ("sharegpt", "mmmu", "generated-shared-prefix"):
        return requests[: args.warmup_requests]
    # Synthetic samples from another seed, so the warmup does not pre-fill caches for the timed requests.
    return datasets.get_dataset(args, tokenizer, args.warmup_requests, args.seed + 1_000_003)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    backend = backends.get_backend(args.backend)
    port = args.port if args.port is not None else backend.default_port
    args.base_url = (args.base_url or f"http://{args.host}:{port}").rstrip("/")
    ignore_eos = not args.disable_ignore_eos and args.ignore_eos is not False
    if backend.api == "completions" and args.dataset_name in datasets.IMAGE_DATASETS:
        raise SystemExit(f"--dataset-name {args.dataset_name} has images, which the completions API of "
                         f"--backend {args.backend} cannot take; use --backend sglang or a *-chat backend")
    if args.dataset_name in ("sharegpt", "mmmu"):
        try:
            datasets.check_dataset_path(args.dataset_path, args.dataset_name)
        except datasets.DatasetError as e:
            raise SystemExit(str(e))

    try:
        asyncio.run(_resolve_server(args))
    except (aiohttp.ClientError, asyncio.TimeoutError, RuntimeError) as e:
        raise SystemExit(f"cannot query {args.base_url} for the model ({type(e).__name__}: {e}); "
                         "is the server up? (or pass --model and --tokenizer)")
    try:
        tokenizer = datasets.load_tokenizer(args.tokenizer)
    except Exception as e:  # noqa: BLE001 - say which tokenizer and how to override it
        raise SystemExit(f"cannot load tokenizer {args.tokenizer!r} ({type(e).__name__}: {e}); pass --tokenizer")
    print(f"backend={args.backend} url={args.base_url} model={args.model} tokenizer={args.tokenizer} "
          f"dataset={args.dataset_name}")
    try:
        requests = datasets.get_dataset(args, tokenizer, args.num_prompts, args.seed)
        warmup = _warmup(args, tokenizer, requests)
    except ValueError as e:  # DatasetError included: one line naming the flag
        raise SystemExit(str(e))

    cfg = runner.RunConfig(args.base_url, args.backend, args.model, args.request_rate, args.burstiness,
                           args.max_concurrency, ignore_eos, args.disable_tqdm, args.seed,
                           stream=not args.disable_stream, extra_body=args.extra_request_body,
                           apply_chat_template=args.apply_chat_template, flush_cache=args.flush_cache)
    try:
        outputs, duration = asyncio.run(runner.run_benchmark(cfg, requests, warmup, tokenizer))
    except (RuntimeError, ValueError) as e:
        raise SystemExit(str(e))
    metrics = calculate_metrics(outputs, duration, lambda t: len(tokenizer.encode(t, add_special_tokens=False)))
    errors = format_errors(outputs)
    if errors:
        print(errors)
    if metrics["completed"] == 0:
        print("All requests failed: check the benchmark arguments and the server log.")
    print("\n" + format_result(metrics, args.backend, args.request_rate, args.max_concurrency))
    record = runner.result_record(vars(args), metrics, outputs if args.output_details else None, requests)
    if args.output_file:
        with open(args.output_file, "ab") as f:
            f.write(orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    return record


if __name__ == "__main__":
    sys.exit(0 if main()["completed"] > 0 else 1)
