"""Multi-image TTFT probe: one streaming request at a time with N images (default 1, 2, 4, 8, 16, 32) of one
resolution, fresh noise images on every request so no cache can hit. Prints a table (images, TTFT, e2e and,
when the server reports `meta_info.stage_timings_ms`, one column per stage; medians over `--repeats`), writes
`--output-json` and a PNG plot of TTFT against the image count (stacked stages when present).

    python benchmark/multimodal/ttft_probe.py --port 30000 --counts 1,2,4,8,16,32 --resolution 1280x720

`--api native` (default) streams from `/generate` with an `image_data` list, whose final chunk carries
`meta_info`; `--api openai` streams from `/v1/chat/completions` and picks up stage timings where a chunk
has them (`meta_info.stage_timings_ms` or `stage_timings_ms`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

import aiohttp
import numpy as np
import orjson

from sglang.benchmark.backends import CHAT_PATH, JSON_HEADERS, TIMEOUT, default_model, http_error, iter_sse
from sglang.benchmark.datasets import RESOLUTIONS, make_image

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


def parse_resolution(spec: str) -> tuple[int, int]:
    """'WIDTHxHEIGHT' (e.g. 1280x720) or a preset (4k/1080p/720p/360p) -> (height, width)."""
    s = spec.strip().lower()
    if s in RESOLUTIONS:
        return RESOLUTIONS[s]
    w, _, h = s.partition("x")
    if not (w.isdigit() and h.isdigit() and int(w) > 0 and int(h) > 0):
        raise argparse.ArgumentTypeError(f"resolution must be WIDTHxHEIGHT or one of {sorted(RESOLUTIONS)}: {spec!r}")
    return int(h), int(w)


def _stage_values(raw: Any) -> dict[str, float]:
    """stage -> ms; a list (one value per rank) counts as its slowest entry."""
    out: dict[str, float] = {}
    for k, v in (raw or {}).items() if isinstance(raw, dict) else ():
        if isinstance(v, (int, float)):
            out[k] = float(v)
        elif isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v):
            out[k] = float(max(v))
    return out


def _stages_in(obj: dict) -> dict[str, float]:
    meta = obj.get("meta_info") if isinstance(obj.get("meta_info"), dict) else {}
    return _stage_values(meta.get("stage_timings_ms") or obj.get("stage_timings_ms"))


async def _stream(session: aiohttp.ClientSession, url: str, body: dict, is_token) -> dict[str, Any]:
    """POST `body`, stream the reply; TTFT is the first event `is_token` accepts."""
    st = time.perf_counter()
    ttft = None
    last = st
    stages: dict[str, float] = {}
    async with session.post(url, data=orjson.dumps(body), headers=JSON_HEADERS) as resp:
        if resp.status != 200:
            raise RuntimeError(await http_error(resp))
        async for data in iter_sse(resp):
            if data == "[DONE]":
                break
            now = time.perf_counter()
            obj = orjson.loads(data)
            if "error" in obj:
                raise RuntimeError(f"stream error: {obj['error']}")
            if ttft is None and is_token(obj):
                ttft = now - st
            stages = _stages_in(obj) or stages
            last = now
    if ttft is None:
        raise RuntimeError("the stream produced no token")
    return {"ttft_ms": ttft * 1e3, "e2e_ms": (last - st) * 1e3, "stages": stages}


async def probe_once(session, args, model: str | None, images: list[str]) -> dict[str, Any]:
    if args.api == "native":
        text = f"<|im_start|>user\n{IMAGE_PLACEHOLDER * len(images)}{args.prompt}<|im_end|>\n<|im_start|>assistant\n"
        body = {"text": text, "image_data": images, "stream": True,
                "sampling_params": {"max_new_tokens": args.output_len, "temperature": 0.0, "ignore_eos": True}}
        return await _stream(session, args.base_url + "/generate", body, lambda o: bool(o.get("output_ids")))
    content = [{"type": "image_url", "image_url": {"url": u}} for u in images] + [{"type": "text", "text": args.prompt}]
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": args.output_len,
            "temperature": 0.0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}

    def has_content(o: dict) -> bool:
        return any((c.get("delta") or {}).get("content") for c in o.get("choices") or [])

    return await _stream(session, args.base_url + CHAT_PATH, body, has_content)


async def run_probe(args) -> list[dict[str, Any]]:
    h, w = args.resolution
    rng = np.random.default_rng(args.seed)

    def fresh(n: int) -> list[str]:
        return [make_image(rng, h, w, "random", args.image_format) for _ in range(n)]

    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        model = args.model or (await default_model(session, args.base_url) if args.api == "openai" else None)
        for _ in range(args.warmup):
            await probe_once(session, args, model, fresh(1))
        rows = []
        for n in args.counts:
            runs, error = [], None
            for _ in range(args.repeats):
                images = fresh(n)  # encoded before the clock starts
                try:
                    runs.append(await probe_once(session, args, model, images))
                except (RuntimeError, aiohttp.ClientError) as e:
                    error = str(e)[:300]
                    break
            rows.append(_summarize(n, runs, error))
            if not args.quiet:
                print(f"  {n} image(s): " + (f"TTFT {rows[-1]['ttft_ms']:.1f} ms" if runs else f"error: {error}"),
                      file=sys.stderr)
    return rows


def _summarize(n: int, runs: list[dict], error: str | None) -> dict[str, Any]:
    names = list(dict.fromkeys(k for r in runs for k in r["stages"]))
    row: dict[str, Any] = {
        "images": n,
        "ttft_ms": statistics.median(r["ttft_ms"] for r in runs) if runs else None,
        "e2e_ms": statistics.median(r["e2e_ms"] for r in runs) if runs else None,
        "ttft_ms_all": [r["ttft_ms"] for r in runs],
        "e2e_ms_all": [r["e2e_ms"] for r in runs],
        "stage_timings_ms": {s: statistics.median(r["stages"][s] for r in runs if s in r["stages"]) for s in names},
    }
    if error:
        row["error"] = error
    return row


# Pipeline order of the stage timer (sglang/srt/metrics/stage_timer.py); unknown names go last.
PIPELINE_ORDER = ("processor", "hash", "send", "recv", "broadcast", "vit_encode", "embed_merge", "llm_prefill",
                  "first_token", "decode")


def stage_names(rows: list[dict]) -> list[str]:
    names = dict.fromkeys(s for r in rows for s in r["stage_timings_ms"])
    return sorted(names, key=lambda s: PIPELINE_ORDER.index(s) if s in PIPELINE_ORDER else len(PIPELINE_ORDER))


def format_table(rows: list[dict]) -> str:
    stages = stage_names(rows)
    heads = ["images", "TTFT ms", "e2e ms"] + stages
    widths = [max(9, len(x) + 1) for x in heads]
    lines = ["".join(f"{x:>{wd}}" for x, wd in zip(heads, widths))]
    for r in rows:
        if r["ttft_ms"] is None:
            lines.append(f"{r['images']:>{widths[0]}}  error: {r.get('error', '')}")
            continue
        cells = [f"{r['images']}", f"{r['ttft_ms']:.1f}", f"{r['e2e_ms']:.1f}"]
        cells += [f"{r['stage_timings_ms'][s]:.1f}" if s in r["stage_timings_ms"] else "-" for s in stages]
        lines.append("".join(f"{x:>{wd}}" for x, wd in zip(cells, widths)))
    return "\n".join(lines)


def save_plot(rows: list[dict], path: str, title: str, skip_stages: set[str]) -> None:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("the PNG plot needs matplotlib: `pip install matplotlib`, or pass --plot none") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["ttft_ms"] is not None]
    x = np.arange(len(ok))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    bottom = np.zeros(len(ok))
    for s in [s for s in stage_names(ok) if s not in skip_stages]:
        vals = np.array([r["stage_timings_ms"].get(s, 0.0) for r in ok])
        ax.bar(x, vals, bottom=bottom, label=s, width=0.6)
        bottom += vals
    ax.plot(x, [r["ttft_ms"] for r in ok], "k-o", label="TTFT (measured)")
    ax.set_xticks(x, [str(r["images"]) for r in ok])
    ax.set_xlabel("images per request")
    ax.set_ylabel("ms")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--api", choices=("native", "openai"), default="native")
    p.add_argument("--model", default=None, help="for --api openai (default: the first of /v1/models)")
    p.add_argument("--counts", default="1,2,4,8,16,32", help="comma list of image counts")
    p.add_argument("--resolution", type=parse_resolution, default=(720, 1280), help="WIDTHxHEIGHT or preset")
    p.add_argument("--image-format", choices=("jpeg", "png"), default="jpeg")
    p.add_argument("--prompt", default="Describe the images.")
    p.add_argument("--output-len", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3, help="requests per count; the median is reported")
    p.add_argument("--warmup", type=int, default=1, help="untimed one-image requests first")
    p.add_argument("--seed", type=int, default=None,
                   help="image seed (default: new images on every run, so a warm server gets no cache hit)")
    p.add_argument("--output-json", default="ttft_probe.json")
    p.add_argument("--plot", default="ttft_probe.png", help="PNG path, or 'none'")
    # first_token is itself a server-side TTFT (it spans the other stages): stacking it double counts
    p.add_argument("--plot-skip-stages", default="first_token,decode", help="stages left out of the stacked bars")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = build_parser().parse_args(argv)
    args.base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    args.counts = [int(c) for c in args.counts.split(",") if c.strip()]
    if not args.counts or min(args.counts) < 1 or args.repeats < 1:
        raise SystemExit("--counts needs positive image counts and --repeats at least 1")
    rows = asyncio.run(run_probe(args))
    print(format_table(rows))
    h, w = args.resolution
    config = {k: v for k, v in vars(args).items() if k != "resolution"} | {"resolution": f"{w}x{h}"}
    with open(args.output_json, "w") as f:
        json.dump({"config": config, "results": rows}, f, indent=2)
    if args.plot and args.plot.lower() != "none":
        skip = {s.strip() for s in args.plot_skip_stages.split(",") if s.strip()}
        save_plot(rows, args.plot, f"TTFT vs images ({w}x{h}, {args.api} API)", skip)
        print(f"wrote {args.output_json} and {args.plot}")
    return rows


if __name__ == "__main__":
    main()
