"""Serving metrics with vLLM's definitions, and the result block printed the way `vllm bench serve` prints it.

Per successful request: TTFT = arrival of the first content chunk - request start; ITL = the gaps between
successive content chunks; E2EL = arrival of the last chunk - request start; TPOT = (E2EL - TTFT) /
(output_tokens - 1), only for requests with more than one output token. Output token counts come from the
server's `usage`. Failed requests add nothing but the failure count (and 0 to `output_lens`).
Throughputs divide by the benchmark duration: completed requests, output tokens, input + output tokens.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

METRICS = ("ttft", "tpot", "itl", "e2el")
_HEADERS = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
}


@dataclass
class RequestOutput:
    success: bool = False
    error: str = ""
    start_time: float = 0.0  # time.perf_counter() when the request was sent
    ttft: float = 0.0  # seconds
    itl: list[float] = field(default_factory=list)  # seconds
    latency: float = 0.0  # E2EL, seconds
    output_tokens: int | None = None  # usage.completion_tokens; None when the server sent no usage
    server_prompt_tokens: int | None = None  # usage.prompt_tokens (image tokens included)
    prompt_len: int = 0  # dataset text tokens
    generated_text: str = ""


@dataclass
class MetricStats:
    mean: float = 0.0
    median: float = 0.0
    std: float = 0.0
    percentiles: list[tuple[float, float]] = field(default_factory=list)

    @classmethod
    def of_seconds(cls, values: list[float], percentiles: Iterable[float]) -> "MetricStats":
        arr = np.asarray(values or [0.0], dtype=np.float64) * 1000.0
        return cls(float(arr.mean()), float(np.median(arr)), float(arr.std()),
                   [(float(p), float(np.percentile(arr, p))) for p in percentiles])


@dataclass
class BenchmarkMetrics:
    completed: int
    failed: int
    duration: float
    total_input: int
    total_output: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    stats: dict[str, MetricStats]
    output_lens: list[int]

    def to_dict(self) -> dict:
        out = {
            "completed": self.completed, "failed": self.failed, "duration": self.duration,
            "total_input_tokens": self.total_input, "total_output_tokens": self.total_output,
            "request_throughput": self.request_throughput, "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "max_output_tokens_per_s": self.max_output_tokens_per_s,
            "max_concurrent_requests": self.max_concurrent_requests,
        }
        for name, s in self.stats.items():
            out[f"mean_{name}_ms"], out[f"median_{name}_ms"], out[f"std_{name}_ms"] = s.mean, s.median, s.std
            for p, v in s.percentiles:
                out[f"p{_p_word(p)}_{name}_ms"] = v
        return out


def _p_word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def output_len_of(o: RequestOutput, count_tokens: Callable[[str], int] | None = None) -> int:
    if o.output_tokens is not None:
        return int(o.output_tokens)
    # No usage from the server: retokenize the text, or fall back to one token per content chunk.
    if count_tokens is not None:
        return count_tokens(o.generated_text)
    return len(o.itl) + 1 if o.generated_text else 0


def _peaks(ok: list[RequestOutput]) -> tuple[float, int]:
    """Highest content chunks per wall-clock second and highest requests in flight per second."""
    if not ok:
        return 0.0, 0
    t0 = min(o.start_time for o in ok)
    seconds = int(np.ceil(max(o.start_time + o.latency for o in ok) - t0)) + 1
    tokens = np.zeros(seconds)
    running = np.zeros(seconds, dtype=np.int64)
    for o in ok:
        t = o.start_time + o.ttft
        stamps = [t]
        for gap in o.itl:
            t += gap
            stamps.append(t)
        for s in stamps:
            b = int(s - t0)
            if 0 <= b < seconds:
                tokens[b] += 1
        running[int(o.start_time - t0): int(o.start_time + o.latency - t0) + 1] += 1
    return float(tokens.max()), int(running.max())


def calculate_metrics(
    outputs: list[RequestOutput],
    duration: float,
    percentiles: Iterable[float] = (99.0,),
    selected: Iterable[str] = METRICS,
    count_tokens: Callable[[str], int] | None = None,
) -> BenchmarkMetrics:
    percentiles = list(percentiles)
    ttfts: list[float] = []
    tpots: list[float] = []
    itls: list[float] = []
    e2els: list[float] = []
    output_lens: list[int] = []
    total_input = completed = 0
    for o in outputs:
        if not o.success:
            output_lens.append(0)
            continue
        n = output_len_of(o, count_tokens)
        output_lens.append(n)
        total_input += o.prompt_len
        if n > 1:
            tpots.append((o.latency - o.ttft) / (n - 1))
        itls.extend(o.itl)
        ttfts.append(o.ttft)
        e2els.append(o.latency)
        completed += 1
    total_output = sum(output_lens)
    values = {"ttft": ttfts, "tpot": tpots, "itl": itls, "e2el": e2els}
    peak_tokens, peak_running = _peaks([o for o in outputs if o.success])
    dur = duration if duration > 0 else float("nan")
    return BenchmarkMetrics(
        completed=completed,
        failed=len(outputs) - completed,
        duration=duration,
        total_input=total_input,
        total_output=total_output,
        request_throughput=completed / dur,
        output_throughput=total_output / dur,
        total_token_throughput=(total_input + total_output) / dur,
        max_output_tokens_per_s=peak_tokens,
        max_concurrent_requests=peak_running,
        stats={m: MetricStats.of_seconds(values[m], percentiles) for m in METRICS if m in set(selected)},
        output_lens=output_lens,
    )


def summarize_errors(outputs: list[RequestOutput], width: int = 200) -> list[tuple[int, str]]:
    """(count, message) for each distinct failure message, most frequent first."""
    counts = Counter((o.error or "unknown error").strip()[:width] for o in outputs if not o.success)
    return [(n, msg) for msg, n in counts.most_common()]


def format_result(m: BenchmarkMetrics, max_concurrency: int | None = None, request_rate: float = float("inf")) -> str:
    def kv(label: str, value, fmt: str = "") -> str:
        return f"{label:<40} {value:<10{fmt}}"

    lines = [f"{' Serving Benchmark Result ':=^50}", kv("Successful requests:", m.completed),
             kv("Failed requests:", m.failed)]
    if max_concurrency is not None:
        lines.append(kv("Maximum request concurrency:", max_concurrency))
    if request_rate != float("inf"):
        lines.append(kv("Request rate configured (RPS):", request_rate, ".2f"))
    lines += [
        kv("Benchmark duration (s):", m.duration, ".2f"),
        kv("Total input tokens:", m.total_input),
        kv("Total generated tokens:", m.total_output),
        kv("Request throughput (req/s):", m.request_throughput, ".2f"),
        kv("Output token throughput (tok/s):", m.output_throughput, ".2f"),
        kv("Peak output token throughput (tok/s):", m.max_output_tokens_per_s, ".2f"),
        kv("Peak concurrent requests:", float(m.max_concurrent_requests), ".2f"),
        kv("Total Token throughput (tok/s):", m.total_token_throughput, ".2f"),
    ]
    for name, s in m.stats.items():
        short, header = _HEADERS[name]
        lines.append(f"{header:-^50}")
        lines.append(kv(f"Mean {short} (ms):", s.mean, ".2f"))
        lines.append(kv(f"Median {short} (ms):", s.median, ".2f"))
        lines += [kv(f"P{_p_word(p)} {short} (ms):", v, ".2f") for p, v in s.percentiles]
    lines.append("=" * 50)
    return "\n".join(lines)
