"""Serving metrics with upstream SGLang's definitions, and its result block.

Over the successful requests of a run lasting `duration` seconds:
- input tokens: text tokens (the client's tokenizer) + vision tokens; a request with images has
  vision tokens = the server's prompt_tokens - its text tokens (0 where the server reports no usage);
- output tokens: the server's completion token count (retokenized text where it reports none);
  "retokenized": the generated text encoded again by the client's tokenizer;
- throughputs: requests, input, output, input + output tokens, each / duration;
  concurrency: the sum of the requests' latencies / duration;
- E2E latency, TTFT, ITL (all gaps of all requests), TPOT = (latency - TTFT) / (output tokens - 1) for requests
  with more than one output token; mean / median / percentiles in ms, 0 where there is no value.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

# The result keys, in upstream's order (tag, when given, goes first).
RESULT_KEYS = (
    "backend", "dataset_name", "request_rate", "max_concurrency", "completed", "duration", "total_input_tokens",
    "total_input_text_tokens", "total_input_vision_tokens", "total_output_tokens",
    "total_output_tokens_retokenized", "request_throughput", "input_throughput", "output_throughput",
    "total_throughput", "concurrency", "mean_e2e_latency_ms", "median_e2e_latency_ms", "p90_e2e_latency_ms",
    "p99_e2e_latency_ms", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "median_itl_ms",
    "p95_itl_ms", "p99_itl_ms", "max_itl_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
)
BANNER = "{:=^50}".format(" Serving Benchmark Result ")


@dataclass
class RequestOutput:
    success: bool = False
    error: str = ""
    start_time: float = 0.0  # time.perf_counter() when the request was sent
    ttft: float = 0.0  # seconds
    itl: list[float] = field(default_factory=list)  # seconds
    latency: float = 0.0  # E2E latency, seconds
    output_tokens: int | None = None  # the server's completion token count; None when it sent none
    server_prompt_tokens: int | None = None  # the server's prompt token count (image tokens included)
    prompt_len: int = 0  # text tokens counted by the client
    generated_text: str = ""
    num_images: int = 0


def _stats(values: list[float], kinds: tuple[str, ...]) -> dict[str, float]:
    if not values:
        return {k: 0.0 for k in kinds}
    arr = np.asarray(values, dtype=np.float64) * 1000.0
    out = {}
    for k in kinds:
        if k == "mean":
            out[k] = float(arr.mean())
        elif k == "median":
            out[k] = float(np.median(arr))
        elif k == "max":
            out[k] = float(arr.max())
        else:
            out[k] = float(np.percentile(arr, float(k[1:])))
    return out


def output_len_of(o: RequestOutput, count_tokens: Callable[[str], int] | None = None) -> int:
    if o.output_tokens is not None:
        return int(o.output_tokens)
    if count_tokens is not None:
        return count_tokens(o.generated_text)
    return len(o.itl) + 1 if o.generated_text else 0


def vision_tokens_of(o: RequestOutput) -> int:
    if not o.num_images or o.server_prompt_tokens is None:
        return 0
    return max(0, int(o.server_prompt_tokens) - o.prompt_len)


def calculate_metrics(outputs: list[RequestOutput], duration: float,
                      count_tokens: Callable[[str], int] | None = None) -> dict[str, Any]:
    """The metric part of the result (every RESULT_KEYS entry from `completed` on), plus `output_lens`
    (0 for failed requests) and `failed`, which the result record does not keep."""
    ok = [o for o in outputs if o.success]
    output_lens = [output_len_of(o, count_tokens) if o.success else 0 for o in outputs]
    ok_lens = [n for n, o in zip(output_lens, outputs) if o.success]
    text = sum(o.prompt_len for o in ok)
    vision = sum(vision_tokens_of(o) for o in ok)
    total_output = sum(ok_lens)
    if count_tokens is not None:
        retok = sum(count_tokens(o.generated_text) for o in ok)
    else:
        retok = total_output
    dur = duration if duration > 0 else float("nan")
    e2e = [o.latency for o in ok]
    tpots = [(o.latency - o.ttft) / (n - 1) for o, n in zip(ok, ok_lens) if n > 1]
    m: dict[str, Any] = {
        "completed": len(ok), "duration": duration, "total_input_tokens": text + vision,
        "total_input_text_tokens": text, "total_input_vision_tokens": vision, "total_output_tokens": total_output,
        "total_output_tokens_retokenized": retok, "request_throughput": len(ok) / dur,
        "input_throughput": (text + vision) / dur, "output_throughput": total_output / dur,
        "total_throughput": (text + vision + total_output) / dur, "concurrency": sum(e2e) / dur,
    }
    for name, values, kinds in (("e2e_latency", e2e, ("mean", "median", "p90", "p99")),
                                ("ttft", [o.ttft for o in ok], ("mean", "median", "p99")),
                                ("itl", [g for o in ok for g in o.itl], ("mean", "median", "p95", "p99", "max")),
                                ("tpot", tpots, ("mean", "median", "p99"))):
        for k, v in _stats(values, kinds).items():
            m[f"{k}_{name}_ms"] = v
    m["output_lens"] = output_lens
    m["failed"] = len(outputs) - len(ok)
    return m


def summarize_errors(outputs: list[RequestOutput], width: int = 200) -> list[tuple[int, str]]:
    """(count, message) for each distinct failure message, most frequent first."""
    counts = Counter((o.error or "unknown error").strip()[:width] for o in outputs if not o.success)
    return [(n, msg) for msg, n in counts.most_common()]


def format_errors(outputs: list[RequestOutput], first: int = 5) -> str:
    rows = summarize_errors(outputs)
    if not rows:
        return ""
    total = sum(n for n, _ in rows)
    lines = [f"{total} of {len(outputs)} request(s) failed; first error messages:"]
    lines += [f"  {n:>5} x {msg}" for n, msg in rows[:first]]
    if len(rows) > first:
        lines.append(f"  ... and {len(rows) - first} other message(s)")
    return "\n".join(lines)


def format_result(m: dict[str, Any], backend: str, request_rate: float, max_concurrency: int | None) -> str:
    """The block upstream prints: `{:<40} {:<10}` columns, floats with two decimals."""
    def kv(label: str, value) -> str:
        return "{:<40} {:<10.2f}".format(label, value) if isinstance(value, float) else "{:<40} {:<10}".format(
            label, value)

    def ms(label: str, key: str) -> str:
        return kv(label, float(m[key]))

    lines = [
        BANNER,
        kv("Backend:", backend),
        kv("Traffic request rate:", "inf" if request_rate == float("inf") else str(request_rate)),
        kv("Max request concurrency:", max_concurrency if max_concurrency else "not set"),
        kv("Successful requests:", m["completed"]),
        kv("Benchmark duration (s):", float(m["duration"])),
        kv("Total input tokens:", m["total_input_tokens"]),
        kv("Total input text tokens:", m["total_input_text_tokens"]),
        kv("Total input vision tokens:", m["total_input_vision_tokens"]),
        kv("Total generated tokens:", m["total_output_tokens"]),
        kv("Total generated tokens (retokenized):", m["total_output_tokens_retokenized"]),
        kv("Request throughput (req/s):", float(m["request_throughput"])),
        kv("Input token throughput (tok/s):", float(m["input_throughput"])),
        kv("Output token throughput (tok/s):", float(m["output_throughput"])),
        kv("Total token throughput (tok/s):", float(m["total_throughput"])),
        kv("Concurrency:", float(m["concurrency"])),
        "{:-^50}".format("End-to-End Latency"),
        ms("Mean E2E Latency (ms):", "mean_e2e_latency_ms"),
        ms("Median E2E Latency (ms):", "median_e2e_latency_ms"),
        ms("P90 E2E Latency (ms):", "p90_e2e_latency_ms"),
        ms("P99 E2E Latency (ms):", "p99_e2e_latency_ms"),
        "{:-^50}".format("Time to First Token"),
        ms("Mean TTFT (ms):", "mean_ttft_ms"),
        ms("Median TTFT (ms):", "median_ttft_ms"),
        ms("P99 TTFT (ms):", "p99_ttft_ms"),
        "{:-^50}".format("Inter-Token Latency"),
        ms("Mean ITL (ms):", "mean_itl_ms"),
        ms("Median ITL (ms):", "median_itl_ms"),
        ms("P95 ITL (ms):", "p95_itl_ms"),
        ms("P99 ITL (ms):", "p99_itl_ms"),
        ms("Max ITL (ms):", "max_itl_ms"),
        "{:-^50}".format("Time per Output Token (excl. 1st token)"),
        ms("Mean TPOT (ms):", "mean_tpot_ms"),
        ms("Median TPOT (ms):", "median_tpot_ms"),
        ms("P99 TPOT (ms):", "p99_tpot_ms"),
        "=" * 50,
    ]
    return "\n".join(lines)
