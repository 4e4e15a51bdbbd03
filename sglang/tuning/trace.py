"""`--trace FILE.jsonl`: real requests replayed at their recorded times.

One JSON object per line:

    {"timestamp": 12.50, "prompt": "What is on this receipt?", "images": ["img/r1.jpg"], "output_len": 96}
    {"timestamp": 12.91, "input_len": 300, "images": ["https://cdn.example.com/a.png", "img/r1.jpg"], "output_len": 40}

- `timestamp` (required): seconds, any origin; requests are sent at `(t - first t) * --trace-time-scale`
  after the start (0.5 replays twice as fast), in timestamp order;
- `prompt` (text) or `input_len` (that many tokens of seeded random text, for traces that kept only lengths);
- `output_len` (required, >= 1): the request's max new tokens (sent with ignore_eos, as bench_serving does);
- `images` (optional): local paths (relative to the trace file's folder), `http(s)://` URLs (fetched by the
  server: mind its media flags), or `data:` URLs; a file named twice is read once and sent as the same bytes,
  so repeated images hit the server's caches as they would in production;
- `images_first` (optional, default true): image parts before the text in the chat message.

Blank lines and lines starting with `#` are skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sglang.benchmark.datasets import DatasetError, RandomText, SampleRequest
from sglang.benchmark.datasets.files import image_url


@dataclass
class Trace:
    requests: list[SampleRequest]
    offsets: np.ndarray  # seconds after the start


def _field(rec: dict, name: str, kind, line: int, required: bool = False):
    value = rec.get(name)
    if value is None:
        if required:
            raise DatasetError(f"trace line {line}: missing {name!r}")
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise DatasetError(f"trace line {line}: {name!r} must be {kind.__name__}, got {value!r}")
    return value


def read_trace_records(path: str | Path) -> list[tuple[int, dict]]:
    """(line number, record) pairs; raises DatasetError with the line on malformed JSON."""
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"--trace {path}: no such file")
    out = []
    for n, raw in enumerate(p.read_text().splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError as e:
            raise DatasetError(f"trace line {n}: not JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise DatasetError(f"trace line {n}: expected a JSON object")
        out.append((n, rec))
    if not out:
        raise DatasetError(f"--trace {path}: no requests")
    return out


def load_trace(path: str | Path, tokenizer, time_scale: float = 1.0, seed: int = 1) -> Trace:
    if time_scale < 0:
        raise DatasetError(f"--trace-time-scale must be >= 0, got {time_scale}")
    base = Path(path).resolve().parent
    text_gen = RandomText(tokenizer, np.random.default_rng(seed)) if tokenizer is not None else None
    images: dict[str, str] = {}
    rows = []
    for line, rec in read_trace_records(path):
        ts = _field(rec, "timestamp", float, line, required=True)
        out_len = _field(rec, "output_len", int, line, required=True)
        if out_len < 1:
            raise DatasetError(f"trace line {line}: output_len must be >= 1")
        prompt = _field(rec, "prompt", str, line)
        if prompt is None:
            n = _field(rec, "input_len", int, line)
            if n is None or n < 1:
                raise DatasetError(f"trace line {line}: give 'prompt' or 'input_len' >= 1")
            if text_gen is None:
                raise DatasetError("a tokenizer is needed for 'input_len' records")
            prompt, count = text_gen.make(n)
        else:
            count = len(tokenizer.encode(prompt, add_special_tokens=False)) if tokenizer is not None else 0
        refs = _field(rec, "images", list, line) or []
        urls = []
        for ref in refs:
            if not isinstance(ref, str):
                raise DatasetError(f"trace line {line}: images must be strings")
            if ref not in images:
                try:
                    images[ref] = image_url(ref, base)
                except DatasetError as e:
                    raise DatasetError(f"trace line {line}: {e}") from None
            urls.append(images[ref])
        first = _field(rec, "images_first", bool, line)
        rows.append((ts, SampleRequest(prompt, count, out_len, urls, images_first=True if first is None else first)))
    rows.sort(key=lambda r: r[0])  # stable: equal timestamps keep file order
    t0 = rows[0][0]
    return Trace([r for _, r in rows], np.array([(t - t0) * time_scale for t, _ in rows], dtype=np.float64))
