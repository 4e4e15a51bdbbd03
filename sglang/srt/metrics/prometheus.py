"""Minimal Prometheus text-format metrics (counters, gauges, histograms with labels).

All metrics live in the HTTP server's process: the tokenizer manager observes request latencies and
token counts as outputs arrive, and scheduler state is read with a control call when /metrics is
scraped, so no cross-process metric store is needed."""

from __future__ import annotations

import bisect
import threading

LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [f'{n}="{v}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Metric:
    kind = ""

    def __init__(self, name: str, doc: str, labelnames: tuple[str, ...] = ()):
        self.name, self.doc, self.labelnames = name, doc, labelnames
        self._lock = threading.Lock()

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.doc}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self._values: dict[tuple[str, ...], float] = {}

    def inc(self, amount: float = 1.0, *labels: str) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0.0) + amount

    def render(self) -> list[str]:
        return self.header() + [f"{self.name}{_labels(self.labelnames, k)} {v}" for k, v in sorted(self._values.items())]


class Gauge(Counter):
    kind = "gauge"

    def set(self, value: float, *labels: str) -> None:
        with self._lock:
            self._values[labels] = float(value)


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, doc: str, labelnames: tuple[str, ...] = (), buckets=LATENCY_BUCKETS_S):
        super().__init__(name, doc, labelnames)
        self.buckets = tuple(buckets)
        self._series: dict[tuple[str, ...], list] = {}  # labels -> [bucket counts, sum, count]

    def observe(self, value: float, *labels: str) -> None:
        with self._lock:
            series = self._series.setdefault(labels, [[0] * len(self.buckets), 0.0, 0])
            i = bisect.bisect_left(self.buckets, value)
            if i < len(self.buckets):
                series[0][i] += 1
            series[1] += value
            series[2] += 1

    def count(self, *labels: str) -> int:
        series = self._series.get(labels)
        return 0 if series is None else series[2]

    def render(self) -> list[str]:
        out = self.header()
        for labels, (counts, total, n) in sorted(self._series.items()):
            acc = 0
            for bound, c in zip(self.buckets, counts):
                acc += c
                le = _labels(self.labelnames, labels, 'le="%s"' % bound)
                out.append(f"{self.name}_bucket{le} {acc}")
            le = _labels(self.labelnames, labels, 'le="+Inf"')
            out.append(f"{self.name}_bucket{le} {n}")
            out.append(f"{self.name}_sum{_labels(self.labelnames, labels)} {total}")
            out.append(f"{self.name}_count{_labels(self.labelnames, labels)} {n}")
        return out


class ServingMetrics:
    """The server's metrics. Request-level ones are fed by the tokenizer manager."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        lab = ("model_name",)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Time to first token.", lab)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Time between output chunks, per token.", lab)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "End-to-end request latency.", lab)
        self.stage = Histogram("sglang:vlm_stage_seconds", "Wall time of each VLM pipeline stage.", ("model_name", "stage"))
        self.prompt_tokens = Counter("sglang:prompt_tokens_total", "Prompt tokens of finished requests.", lab)
        self.generation_tokens = Counter("sglang:generation_tokens_total", "Generated tokens of finished requests.", lab)
        self.cached_tokens = Counter("sglang:cached_tokens_total", "Prompt tokens served from the prefix cache.", lab)
        self.requests = Counter("sglang:num_requests_total", "Finished requests by finish reason.", ("model_name", "finish_reason"))
        self.mm_items = Counter("sglang:mm_items_total", "Images and videos sent to the model, by modality.",
                                ("model_name", "modality"))
        self.video_frames = Counter("sglang:video_frames_total", "Frames sampled from videos sent to the model.", lab)
        self.running = Gauge("sglang:num_running_reqs", "Requests prefilling or decoding.", lab)
        self.queued = Gauge("sglang:num_queue_reqs", "Requests waiting for admission.", lab)
        self.cache_hit_rate = Gauge("sglang:cache_hit_rate", "Cached prompt tokens / prompt tokens, since start.", lab)
        self.kv_usage = Gauge("sglang:token_usage", "Fraction of KV slots in use (cached prefixes excluded).", lab)
        # --dp-size > 1: the gauges above are sums over replicas; these are each replica's (label dp_rank)
        rep = ("model_name", "dp_rank")
        self.replica_running = Gauge("sglang:dp_num_running_reqs", "Requests prefilling or decoding, per replica.", rep)
        self.replica_queued = Gauge("sglang:dp_num_queue_reqs", "Requests waiting for admission, per replica.", rep)
        self.replica_kv_usage = Gauge("sglang:dp_token_usage", "Fraction of KV slots in use, per replica.", rep)

    def observe_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds, self.model_name)

    def observe_chunk(self, seconds: float, new_tokens: int) -> None:
        if new_tokens > 0:
            for _ in range(new_tokens):
                self.itl.observe(seconds / new_tokens, self.model_name)

    def observe_finished(self, e2e_s: float, meta: dict, finish_type: str) -> None:
        m = self.model_name
        self.e2e.observe(e2e_s, m)
        self.prompt_tokens.inc(meta.get("prompt_tokens", 0), m)
        self.generation_tokens.inc(meta.get("completion_tokens", 0), m)
        self.cached_tokens.inc(meta.get("cached_tokens", 0), m)
        self.requests.inc(1, m, finish_type)
        for stage, ms in (meta.get("stage_timings_ms") or {}).items():
            self.stage.observe(ms / 1e3, m, stage)

    def observe_mm_items(self, items) -> None:
        for item in items:
            self.mm_items.inc(1, self.model_name, item.modality.value)
            frames = item.model_specific_data.get("num_frames")
            if frames:
                self.video_frames.inc(frames, self.model_name)

    def update_scheduler_state(self, info: dict) -> None:
        m = self.model_name
        self.running.set(info.get("num_running_reqs", 0), m)
        self.queued.set(info.get("num_waiting_reqs", 0), m)
        total = info.get("max_total_num_tokens") or 0
        if total:
            self.kv_usage.set(1.0 - info.get("available_kv_tokens", total) / total, m)
        prompt = self.prompt_tokens._values.get((m,), 0.0)
        cached = self.cached_tokens._values.get((m,), 0.0)
        self.cache_hit_rate.set(cached / prompt if prompt else 0.0, m)
        for rep in info.get("replicas", ()):
            k = str(rep.get("dp_rank", 0))
            self.replica_running.set(rep.get("num_running_reqs", 0), m, k)
            self.replica_queued.set(rep.get("num_waiting_reqs", 0), m, k)
            total = rep.get("max_total_num_tokens") or 0
            if total:
                self.replica_kv_usage.set(1.0 - rep.get("available_kv_tokens", total) / total, m, k)

    def render(self) -> str:
        lines: list[str] = []
        for metric in (self.ttft, self.itl, self.e2e, self.stage, self.prompt_tokens, self.generation_tokens,
                       self.cached_tokens, self.requests, self.mm_items, self.video_frames, self.running, self.queued, self.cache_hit_rate, self.kv_usage):
            lines += metric.render()
        for metric in (self.replica_running, self.replica_queued, self.replica_kv_usage):
            if metric._values:  # only with data-parallel replicas
                lines += metric.render()
        return "\n".join(lines) + "\n"
