"""The report of a sweep: runs ranked by `--objective`, the runs that break an SLO (or failed) listed apart,
the Pareto front of throughput against p99 TTFT, and the recommended launch command.

SLOs: `--slo-ttft-p99-ms` bounds the p99 TTFT, `--slo-tpot-ms` the p99 TPOT; a run with any failed request,
or none completed, never passes.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

# name -> (metric key, higher is better, column label)
OBJECTIVES = {
    "request-throughput": ("request_throughput", True, "req/s"),
    "output-throughput": ("output_throughput", True, "out tok/s"),
    "total-throughput": ("total_throughput", True, "tok/s"),
    "ttft-p99": ("p99_ttft_ms", False, "TTFT p99 ms"),
    "ttft-median": ("median_ttft_ms", False, "TTFT p50 ms"),
    "tpot-median": ("median_tpot_ms", False, "TPOT p50 ms"),
    "tpot-p99": ("p99_tpot_ms", False, "TPOT p99 ms"),
    "e2e-p99": ("p99_e2e_latency_ms", False, "E2E p99 ms"),
}


@dataclass(frozen=True)
class SLO:
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None


def objective_spec(name: str) -> tuple[str, bool, str]:
    key = name.replace("_", "-")
    if key not in OBJECTIVES:
        raise ValueError(f"--objective {name}: choose from {', '.join(OBJECTIVES)}")
    return OBJECTIVES[key]


def metric(rec: dict[str, Any], key: str) -> float:
    v = (rec.get("metrics") or {}).get(key)
    return float(v) if isinstance(v, (int, float)) else float("nan")


def violations(rec: dict[str, Any], slo: SLO) -> list[str]:
    """Why a run does not qualify; [] when it does."""
    if rec.get("status") != "ok":
        return [f"run failed: {str(rec.get('error') or 'unknown')[:160]}"]
    m = rec.get("metrics") or {}
    out = []
    if not m.get("completed"):
        out.append("no request completed")
    if m.get("failed"):
        out.append(f"{m['failed']} failed request(s)")
    if slo.ttft_p99_ms is not None and metric(rec, "p99_ttft_ms") > slo.ttft_p99_ms:
        out.append(f"TTFT p99 {metric(rec, 'p99_ttft_ms'):.0f} > {slo.ttft_p99_ms:g} ms")
    if slo.tpot_p99_ms is not None and metric(rec, "p99_tpot_ms") > slo.tpot_p99_ms:
        out.append(f"TPOT p99 {metric(rec, 'p99_tpot_ms'):.1f} > {slo.tpot_p99_ms:g} ms")
    return out


def rank(records: list[dict[str, Any]], objective: str, slo: SLO) -> tuple[list[dict], list[tuple[dict, list[str]]]]:
    """(passing runs best first, [(violating run, reasons)] in input order)."""
    key, higher, _ = objective_spec(objective)
    passing, failing = [], []
    for rec in records:
        why = violations(rec, slo)
        (failing.append((rec, why)) if why else passing.append(rec))
    passing.sort(key=lambda r: (-metric(r, key) if higher else metric(r, key), r["key"], r.get("concurrency") or 0))
    return passing, failing


def pareto_front(records: list[dict[str, Any]], throughput_key: str = "request_throughput",
                 latency_key: str = "p99_ttft_ms") -> list[dict[str, Any]]:
    """Runs no other run beats on both throughput (higher) and latency (lower), sorted by latency.
    Only successful runs without failed requests take part."""
    pts = [r for r in records if r.get("status") == "ok" and not (r.get("metrics") or {}).get("failed")
           and (r.get("metrics") or {}).get("completed")]
    front = []
    for r in pts:
        t, lat = metric(r, throughput_key), metric(r, latency_key)
        dominated = any(
            metric(o, throughput_key) >= t and metric(o, latency_key) <= lat
            and (metric(o, throughput_key) > t or metric(o, latency_key) < lat) for o in pts if o is not r)
        if not dominated:
            front.append(r)
    return sorted(front, key=lambda r: (metric(r, latency_key), -metric(r, throughput_key)))


def launch_command(rec: dict[str, Any]) -> str:
    """`[VAR=value ...] python -m sglang.launch_server ...` for a run (the tuner's host/port left out)."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in (rec.get("config_env") or {}).items())
    cmd = shlex.join(["python", "-m", "sglang.launch_server", *rec.get("server_argv", [])])
    return f"{env} {cmd}" if env else cmd


def _fmt(v: Any, digits: int = 1) -> str:
    if isinstance(v, float):
        if v != v:
            return "-"
        return f"{v:.{digits}f}"
    return "-" if v is None else str(v)


COLUMNS = (("req/s", "request_throughput", 2), ("out tok/s", "output_throughput", 1),
           ("TTFT p50 ms", "median_ttft_ms", 0), ("TTFT p99 ms", "p99_ttft_ms", 0),
           ("TPOT p50 ms", "median_tpot_ms", 1), ("TPOT p99 ms", "p99_tpot_ms", 1))


def table(records: list[dict[str, Any]], numbered: bool = True, reasons: list[list[str]] | None = None) -> str:
    """A Markdown table (readable in a terminal, pastable into docs)."""
    mem_gpu = any(r.get("peak_gpu_mem_mb") is not None for r in records)
    head = (["#"] if numbered else []) + ["config", "conc"] + [c[0] for c in COLUMNS] + ["errors", "peak RSS MB"]
    head += ["peak GPU MB"] if mem_gpu else []
    head += ["why not"] if reasons is not None else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, r in enumerate(records):
        m = r.get("metrics") or {}
        row = ([str(i + 1)] if numbered else []) + [r["key"], _fmt(r.get("concurrency"))]
        row += [_fmt(metric(r, k), d) if m else "-" for _, k, d in COLUMNS]
        row += [_fmt(m.get("failed")) if m else "-", _fmt(r.get("peak_rss_mb"), 0)]
        row += [_fmt(r.get("peak_gpu_mem_mb"), 0)] if mem_gpu else []
        row += ["; ".join(reasons[i])] if reasons is not None else []
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


INFO_COLUMNS = (("KV tokens", "max_total_num_tokens"), ("max running", "max_running_requests"),
                ("retractions", "num_retractions"), ("radix tokens", "radix_cache_tokens"),
                ("ViT cache hits", "mm_embedding_cache_hits"), ("ViT cache misses", "mm_embedding_cache_misses"))


def info_table(records: list[dict[str, Any]]) -> str:
    """What the server reported after each run (/get_server_info) and the run's start and wall times."""
    head = ["config", "conc"] + [c[0] for c in INFO_COLUMNS] + ["start s", "bench wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        info = r.get("server_info") or {}
        row = [r["key"], _fmt(r.get("concurrency"))] + [_fmt(info.get(k)) for _, k in INFO_COLUMNS]
        row += [_fmt(r.get("start_s")), _fmt(r.get("wall_s"))]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def render(records: list[dict[str, Any]], objective: str, slo: SLO, plot_note: str | None = None) -> tuple[str, dict | None]:
    """The whole report text and the recommended run (None when no run qualifies); the command comes last."""
    passing, failing = rank(records, objective, slo)
    key, higher, label = objective_spec(objective)
    slo_text = ", ".join(s for s in (f"TTFT p99 <= {slo.ttft_p99_ms:g} ms" if slo.ttft_p99_ms is not None else "",
                                     f"TPOT p99 <= {slo.tpot_p99_ms:g} ms" if slo.tpot_p99_ms is not None else "")
                         if s) or "none"
    out = [f"objective: {objective} ({label}, {'higher' if higher else 'lower'} is better); SLOs: {slo_text}", ""]
    out += [f"## Runs meeting the SLOs ({len(passing)})", "", table(passing) if passing else "(none)", ""]
    if failing:
        out += [f"## Runs violating the SLOs or failing ({len(failing)})", "",
                table([r for r, _ in failing], numbered=False, reasons=[w for _, w in failing]), ""]
    out += ["## Server figures after each run", "", info_table(records), ""]
    front = pareto_front(records)
    if front:
        out += ["## Pareto front: request throughput vs p99 TTFT", ""]
        out += [f"- {r['key']} @ conc {_fmt(r.get('concurrency'))}: {metric(r, 'request_throughput'):.2f} req/s, "
                f"TTFT p99 {metric(r, 'p99_ttft_ms'):.0f} ms" for r in front]
        out.append("")
    if plot_note:
        out += [plot_note, ""]
    best = passing[0] if passing else None
    if best is None:
        out.append("No configuration meets the SLOs and ran without errors: relax the SLOs or widen the grid.")
    else:
        conc = best.get("concurrency")
        out.append(f"Recommended (best {label}: {metric(best, key):.2f}"
                   + (f", measured at --max-concurrency {conc}" if conc is not None else "") + "):")
        out.append(launch_command(best))
    return "\n".join(out), best
