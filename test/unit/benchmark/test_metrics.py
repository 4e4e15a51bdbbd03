"""Metric arithmetic on synthetic timings (hand-computed), the result block layout, and arrival schedules."""

from __future__ import annotations

import numpy as np
import pytest

from sglang.benchmark.metrics import RequestOutput, calculate_metrics, format_result, summarize_errors
from sglang.benchmark.runner import arrival_offsets


def _outputs() -> list[RequestOutput]:
    return [
        RequestOutput(True, "", 100.0, 0.1, [0.02, 0.03, 0.05], 0.2, 4, 900, 10, "a b c d"),
        RequestOutput(True, "", 100.05, 0.3, [], 0.3, 1, 900, 20, "a"),  # single token: no TPOT
        RequestOutput(False, "HTTP 400: bad image", 100.1, 0.0, [], 0.0, None, None, 30),
        RequestOutput(True, "", 101.2, 0.2, [0.1], 0.5, 2, 900, 5, "a b"),
    ]


def test_hand_computed_metrics():
    m = calculate_metrics(_outputs(), duration=2.0, percentiles=[50, 99])
    assert (m.completed, m.failed) == (3, 1)
    assert (m.total_input, m.total_output) == (35, 7)  # failed requests add no input tokens
    assert m.output_lens == [4, 1, 0, 2]
    assert m.request_throughput == pytest.approx(1.5)
    assert m.output_throughput == pytest.approx(3.5)
    assert m.total_token_throughput == pytest.approx(21.0)

    ttft, tpot, itl, e2el = (m.stats[k] for k in ("ttft", "tpot", "itl", "e2el"))
    assert (ttft.mean, ttft.median, ttft.std) == pytest.approx((200.0, 200.0, np.sqrt(20000 / 3)))
    assert dict(ttft.percentiles) == pytest.approx({50.0: 200.0, 99.0: 298.0})
    # TPOT: (200 - 100) / 3 for the 4-token request, (500 - 200) / 1 for the 2-token one.
    assert (tpot.mean, tpot.median) == pytest.approx((500 / 3, 500 / 3))
    assert dict(tpot.percentiles)[99.0] == pytest.approx(100 / 3 + 0.99 * (300 - 100 / 3))
    assert (itl.mean, itl.median, dict(itl.percentiles)[99.0]) == pytest.approx((50.0, 40.0, 98.5))
    assert (e2el.mean, e2el.median, dict(e2el.percentiles)[99.0]) == pytest.approx((1000 / 3, 300.0, 496.0))
    # Content chunks per wall-clock second: 5 in [100, 101), 2 in [101, 102); requests alive per second: 2.
    assert (m.max_output_tokens_per_s, m.max_concurrent_requests) == (5.0, 2)

    d = m.to_dict()
    assert d["p99_ttft_ms"] == pytest.approx(298.0) and d["median_itl_ms"] == pytest.approx(40.0)
    assert d["completed"] == 3 and d["total_output_tokens"] == 7 and "std_e2el_ms" in d and "p50_tpot_ms" in d


def test_only_single_token_outputs_give_zero_tpot():
    outs = [RequestOutput(True, "", 0.0, 0.05, [], 0.05, 1, None, 3, "x") for _ in range(3)]
    m = calculate_metrics(outs, duration=1.0)
    assert m.stats["tpot"].mean == 0.0 and m.stats["itl"].mean == 0.0
    assert m.stats["ttft"].mean == pytest.approx(50.0) and m.total_output == 3


def test_missing_usage_falls_back_to_tokenizer_or_chunks():
    o = RequestOutput(True, "", 0.0, 0.1, [0.1, 0.1], 0.3, None, None, 1, "one two three four")
    assert calculate_metrics([o], 1.0).total_output == 3  # one token per content chunk
    assert calculate_metrics([o], 1.0, count_tokens=lambda t: len(t.split())).total_output == 4


def test_all_failed():
    outs = [RequestOutput(False, "boom"), RequestOutput(False, "boom"), RequestOutput(False, "")]
    m = calculate_metrics(outs, duration=1.0)
    assert (m.completed, m.failed, m.total_output, m.request_throughput) == (0, 3, 0, 0.0)
    assert m.stats["ttft"].mean == 0.0
    assert summarize_errors(outs) == [(2, "boom"), (1, "unknown error")]
    assert "Successful requests:                     0" in format_result(m)


def test_result_block_layout():
    m = calculate_metrics(_outputs(), duration=2.0)
    lines = format_result(m, max_concurrency=4, request_rate=8.0).splitlines()
    assert lines[0] == "============ Serving Benchmark Result ============"
    assert lines[1] == "Successful requests:                     3         "
    assert lines[2] == "Failed requests:                         1         "
    assert lines[3] == "Maximum request concurrency:             4         "
    assert lines[4] == "Request rate configured (RPS):           8.00      "
    assert "Benchmark duration (s):                  2.00      " in lines
    assert "Total input tokens:                      35        " in lines
    assert "Total generated tokens:                  7         " in lines
    assert "Request throughput (req/s):              1.50      " in lines
    assert "Output token throughput (tok/s):         3.50      " in lines
    assert "Total Token throughput (tok/s):          21.00     " in lines
    i = lines.index("---------------Time to First Token----------------")
    assert lines[i + 1: i + 4] == ["Mean TTFT (ms):                          200.00    ",
                                   "Median TTFT (ms):                        200.00    ",
                                   "P99 TTFT (ms):                           298.00    "]
    for header in ("-----Time per Output Token (excl. 1st token)------", "---------------Inter-token Latency----------------",
                   "----------------End-to-end Latency----------------"):
        assert header in lines
    assert lines[-1] == "=" * 50
    only = format_result(calculate_metrics(_outputs(), 2.0, [90, 99.9], selected=["ttft"]))
    assert "P90 TTFT (ms):" in only and "P99.9 TTFT (ms):" in only and "TPOT" not in only
    assert "Maximum request concurrency" not in only and "Request rate configured" not in only


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
