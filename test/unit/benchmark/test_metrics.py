"""Metric arithmetic on synthetic timings (hand-computed), the result block's labels and order, the result
record's keys, error summaries, and arrival schedules."""

from __future__ import annotations

import numpy as np
import pytest

from sglang.benchmark.metrics import (RESULT_KEYS, RequestOutput, calculate_metrics, format_errors, format_result,
                                      summarize_errors)
from sglang.benchmark.runner import arrival_offsets, result_record

BLOCK_LABELS = [
    "Backend:", "Traffic request rate:", "Max request concurrency:", "Successful requests:",
    "Benchmark duration (s):", "Total input tokens:", "Total input text tokens:", "Total input vision tokens:",
    "Total generated tokens:", "Total generated tokens (retokenized):", "Request throughput (req/s):",
    "Input token throughput (tok/s):", "Output token throughput (tok/s):", "Total token throughput (tok/s):",
    "Concurrency:", "-End-to-End Latency-", "Mean E2E Latency (ms):", "Median E2E Latency (ms):",
    "P90 E2E Latency (ms):", "P99 E2E Latency (ms):", "-Time to First Token-", "Mean TTFT (ms):",
    "Median TTFT (ms):", "P99 TTFT (ms):", "-Inter-Token Latency-", "Mean ITL (ms):", "Median ITL (ms):",
    "P95 ITL (ms):", "P99 ITL (ms):", "Max ITL (ms):", "-Time per Output Token (excl. 1st token)-",
    "Mean TPOT (ms):", "Median TPOT (ms):", "P99 TPOT (ms):",
]


def _outputs() -> list[RequestOutput]:
    return [
        RequestOutput(True, "", 100.0, 0.1, [0.02, 0.03, 0.05], 0.2, 4, 900, 10, "a b c d", num_images=1),
        RequestOutput(True, "", 100.05, 0.3, [], 0.3, 1, 900, 20, "a"),  # single token: no TPOT; no images
        RequestOutput(False, "HTTP 400: bad image", 100.1, 0.0, [], 0.0, None, None, 30, num_images=2),
        RequestOutput(True, "", 101.2, 0.2, [0.1], 0.5, 2, None, 5, "a b", num_images=1),  # no usage
    ]


def _words(text: str) -> int:
    return len(text.split())


def test_hand_computed_metrics():
    m = calculate_metrics(_outputs(), duration=2.0, count_tokens=_words)
    assert (m["completed"], m["failed"], m["duration"]) == (3, 1, 2.0)
    # Vision tokens: only requests with images and a server prompt count: 900 - 10.
    assert (m["total_input_text_tokens"], m["total_input_vision_tokens"], m["total_input_tokens"]) == (35, 890, 925)
    assert (m["total_output_tokens"], m["total_output_tokens_retokenized"]) == (7, 7)
    assert m["output_lens"] == [4, 1, 0, 2]
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["input_throughput"] == pytest.approx(462.5)
    assert m["output_throughput"] == pytest.approx(3.5)
    assert m["total_throughput"] == pytest.approx(466.0)
    assert m["concurrency"] == pytest.approx(0.5)  # (0.2 + 0.3 + 0.5) / 2
    assert [m[f"{k}_e2e_latency_ms"] for k in ("mean", "median", "p90", "p99")] == pytest.approx(
        [1000 / 3, 300.0, 460.0, 496.0])
    assert [m[f"{k}_ttft_ms"] for k in ("mean", "median", "p99")] == pytest.approx([200.0, 200.0, 298.0])
    assert [m[f"{k}_itl_ms"] for k in ("mean", "median", "p95", "p99", "max")] == pytest.approx(
        [50.0, 40.0, 92.5, 98.5, 100.0])
    # TPOT: (200 - 100) / 3 for the 4-token request, (500 - 200) / 1 for the 2-token one.
    tpot = [100 / 3, 300.0]
    assert [m[f"{k}_tpot_ms"] for k in ("mean", "median", "p99")] == pytest.approx(
        [np.mean(tpot), np.median(tpot), np.percentile(tpot, 99)])
    assert set(RESULT_KEYS[4:]) <= set(m)


def test_output_tokens_fall_back_to_retokenized_text_and_retokenized_differs():
    o = RequestOutput(True, "", 0.0, 0.1, [0.1, 0.1], 0.3, None, None, 1, "one two three four")
    assert calculate_metrics([o], 1.0)["total_output_tokens"] == 3  # one token per chunk without a tokenizer
    m = calculate_metrics([o], 1.0, count_tokens=_words)
    assert m["total_output_tokens"] == m["total_output_tokens_retokenized"] == 4
    o.output_tokens = 6
    m = calculate_metrics([o], 1.0, count_tokens=_words)
    assert (m["total_output_tokens"], m["total_output_tokens_retokenized"]) == (6, 4)


def test_all_failed_gives_zeros():
    outs = [RequestOutput(False, "boom"), RequestOutput(False, "boom"), RequestOutput(False, "")]
    m = calculate_metrics(outs, duration=1.0)
    assert (m["completed"], m["failed"], m["total_output_tokens"], m["request_throughput"]) == (0, 3, 0, 0.0)
    assert m["mean_ttft_ms"] == m["max_itl_ms"] == m["p99_tpot_ms"] == 0.0
    assert summarize_errors(outs) == [(2, "boom"), (1, "unknown error")]
    text = format_errors(outs, first=1)
    assert text.splitlines() == ["3 of 3 request(s) failed; first error messages:", "      2 x boom",
                                 "  ... and 1 other message(s)"]
    assert "{:<40} {:<10}".format("Successful requests:", 0) in format_result(m, "sglang", 1.0, None)


def test_result_block_labels_order_and_columns():
    m = calculate_metrics(_outputs(), duration=2.0, count_tokens=_words)
    lines = format_result(m, "sglang-oai-chat", float("inf"), 4).splitlines()
    assert lines[0] == "============ Serving Benchmark Result ============"
    assert lines[-1] == "=" * 50
    body = lines[1:-1]
    assert len(body) == len(BLOCK_LABELS)
    for line, label in zip(body, BLOCK_LABELS):
        if label.startswith("-"):
            assert line == "{:-^50}".format(label.strip("-")), line
        else:
            assert line.startswith(label) and line[40] == " " and len(line) >= 51, line
    assert body[0] == "{:<40} {:<10}".format("Backend:", "sglang-oai-chat")
    assert body[1] == "Traffic request rate:                    inf       "
    assert body[2] == "Max request concurrency:                 4         "
    assert body[3] == "Successful requests:                     3         "
    assert body[4] == "Benchmark duration (s):                  2.00      "
    assert body[5] == "Total input tokens:                      925       "
    assert body[7] == "Total input vision tokens:               890       "
    assert body[14] == "Concurrency:                             0.50      "
    assert body[21] == "Mean TTFT (ms):                          200.00    "
    other = format_result(m, "sglang", 8.0, None).splitlines()
    assert other[2] == "Traffic request rate:                    8.0       "
    assert other[3] == "Max request concurrency:                 not set   "


def test_result_record_keys_in_upstream_order():
    m = calculate_metrics(_outputs(), duration=2.0)
    args = {"backend": "sglang", "dataset_name": "random", "request_rate": float("inf"), "max_concurrency": 8,
            "tag": "run-a", "random_input_len": 24, "random_output_len": 5, "random_range_ratio": 1.0,
            "sharegpt_output_len": None}
    rec = result_record(args, m)
    keys = list(rec)
    assert keys[0] == "tag" and keys[1:1 + len(RESULT_KEYS)] == list(RESULT_KEYS)
    assert rec["tag"] == "run-a" and rec["request_rate"] == "inf" and rec["max_concurrency"] == 8
    assert "ttfts" not in rec and "failed" not in rec
    assert "tag" not in result_record({**args, "tag": None}, m)
    detailed = result_record(args, m, _outputs(), None)
    assert detailed["output_lens"] == [4, 1, 0, 2] and detailed["errors"][2] == "HTTP 400: bad image"


def test_arrival_offsets():
    assert not arrival_offsets(5, float("inf"), 1.0, 0).any()
    off = arrival_offsets(20001, 10.0, 1.0, 0)
    gaps = np.diff(off)
    assert off[0] == 0.0 and np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(0.1, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # Poisson: exponential gaps
    bursty = np.diff(arrival_offsets(20001, 10.0, 4.0, 0))
    assert bursty.mean() == pytest.approx(0.1, rel=0.03)
    assert bursty.std() / bursty.mean() == pytest.approx(0.5, rel=0.05)  # gamma CV = 1 / sqrt(shape)
    assert np.array_equal(arrival_offsets(10, 5.0, 1.0, 3), arrival_offsets(10, 5.0, 1.0, 3))
    for rate, b in ((0.0, 1.0), (1.0, 0.0)):
        with pytest.raises(ValueError):
            arrival_offsets(3, rate, b, 0)


def test_progress_bar_without_tqdm(monkeypatch):
    import io
    import sys

    from sglang.benchmark import progress

    monkeypatch.setitem(sys.modules, "tqdm", None)  # `from tqdm import tqdm` raises ImportError
    bar = progress.progress_bar(total=3, desc="benchmark")
    assert isinstance(bar, progress.SimpleBar)
    bar.stream = io.StringIO()
    for _ in range(3):
        bar.update(1)
    bar.close()
    assert "benchmark: 3/3" in bar.stream.getvalue() and bar.stream.getvalue().endswith("\n")
    quiet = progress.SimpleBar(total=2, desc="x", disable=True, stream=io.StringIO())
    quiet.update(2)
    quiet.close()
    assert quiet.stream.getvalue() == ""
    assert list(progress.SimpleBar([1, 2], desc="d", stream=io.StringIO())) == [1, 2]
