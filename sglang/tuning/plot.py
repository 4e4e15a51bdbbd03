"""The Pareto plot: request throughput against p99 TTFT for every successful run, the front joined by a line.
matplotlib is optional (`pip install -e .[bench]`); without it the plot is skipped with a message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sglang.tuning.report import metric, pareto_front


def plot_pareto(records: list[dict[str, Any]], path: str | Path) -> str:
    """Writes the PNG; returns a one-line note for the report."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "Pareto plot skipped: matplotlib is not installed (pip install matplotlib)."
    pts = [r for r in records if r.get("status") == "ok" and (r.get("metrics") or {}).get("completed")]
    if not pts:
        return "Pareto plot skipped: no successful run."
    front = pareto_front(records)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [metric(r, "p99_ttft_ms") for r in pts]
    ys = [metric(r, "request_throughput") for r in pts]
    ax.scatter(xs, ys, color="tab:gray", label="runs")
    if front:
        ax.plot([metric(r, "p99_ttft_ms") for r in front], [metric(r, "request_throughput") for r in front],
                "o-", color="tab:red", label="Pareto front")
    for r, x, y in zip(pts, xs, ys):
        conc = r.get("concurrency")
        label = r["key"] + (f" @{conc}" if conc is not None else "")
        ax.annotate(label, (x, y), fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("p99 TTFT (ms)")
    ax.set_ylabel("request throughput (req/s)")
    ax.set_title("sglang.tune: throughput vs latency")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"Pareto plot: {path}"
