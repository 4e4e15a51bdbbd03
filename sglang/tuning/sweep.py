"""The sweep loop: for each configuration with runs left, one server start, one benchmark per concurrency,
one results line per run, and a clean stop, whatever happens (errors, Ctrl-C, the time budget)."""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from sglang.benchmark.progress import progress_bar
from sglang.tuning.grid import Config, config_argv, config_env
from sglang.tuning.server import MemorySampler, ServerHandle, ServerStartError
from sglang.tuning.store import ResultsStore

# /get_server_info figures kept with each run (the KV size the configuration got, cache behaviour).
INFO_KEYS = ("max_total_num_tokens", "max_running_requests", "chunked_prefill_size", "page_size", "num_retractions",
             "radix_cache_tokens", "mm_embedding_cache_hits", "mm_embedding_cache_misses", "shm_fallback_count",
             "attention_backend", "device")

# (base_url, concurrency, log_path) -> bench_serving record
Workload = Callable[[str, "int | None", Path], dict]


@dataclass
class Plan:
    configs: list[Config]
    concurrencies: list[int | None]
    kinds: dict[str, str]
    base_argv: list[str]  # --model-path and --server-args, before each configuration's flags
    fingerprint: str
    workload: Workload
    server_env: dict[str, str] = field(default_factory=dict)
    start_timeout_s: float = 300.0
    stop_timeout_s: float = 30.0
    time_budget_s: float | None = None
    retry_failed: bool = False
    progress: bool = True


@dataclass
class Outcome:
    ran: int = 0
    skipped: int = 0  # already in the results file
    left: int = 0  # not run: time budget or interruption
    interrupted: bool = False
    budget_hit: bool = False


def log_name(index: int, key: str) -> str:
    return f"{index:03d}-" + re.sub(r"[^A-Za-z0-9.=_-]+", "_", key)[:80] + ".log"


def _say(bar, msg: str) -> None:
    if hasattr(bar, "write"):
        bar.write(msg)
    else:
        sys.stderr.write("\n" + msg + "\n")


def run_sweep(plan: Plan, store: ResultsStore) -> Outcome:
    runs = [(c.key, conc) for c in plan.configs for conc in plan.concurrencies]
    todo = set(store.pending(plan.fingerprint, runs, plan.retry_failed))
    out = Outcome(skipped=len(runs) - len(todo))
    logs = store.dir / "logs"
    logs.mkdir(exist_ok=True)
    t0 = time.monotonic()
    bar = progress_bar(total=len(todo), desc="tune", disable=not plan.progress)
    if out.skipped:
        _say(bar, f"resuming: {out.skipped} of {len(runs)} run(s) already in {store.path}")
    try:
        for i, config in enumerate(plan.configs):
            concs = [c for c in plan.concurrencies if (config.key, c) in todo]
            if not concs:
                continue
            if plan.time_budget_s is not None and time.monotonic() - t0 >= plan.time_budget_s:
                out.budget_hit = True
                break
            _run_config(plan, store, config, concs, logs / log_name(i, config.key), bar, t0, out)
            if out.budget_hit:
                break
    except KeyboardInterrupt:
        out.interrupted = True
        _say(bar, "interrupted: the server is stopped; rerun the same command to continue")
    finally:
        bar.close()
    out.left = len(todo) - out.ran
    return out


def _run_config(plan: Plan, store: ResultsStore, config: Config, concs: list, log_path: Path, bar, t0: float,
                out: Outcome) -> None:
    """Runs `concs` on one server; counts each recorded run in `out.ran` as soon as it is written."""
    argv = plan.base_argv + config_argv(config, plan.kinds)
    env = {**plan.server_env, **config_env(config)}
    base = {"fingerprint": plan.fingerprint, "key": config.key, "config": config.as_dict(), "server_argv": argv,
            "config_env": config_env(config), "log": str(log_path)}
    _say(bar, f"[{config.key}] starting the server (log {log_path})")
    server = ServerHandle(argv, log_path, env=env)
    try:
        try:
            start_s = server.wait_healthy(plan.start_timeout_s)
        except ServerStartError as e:
            for conc in concs:
                store.append({**base, "concurrency": conc, "status": "failed", "error": str(e)[:4000]})
                out.ran += 1
                bar.update(1)
            _say(bar, f"[{config.key}] failed to start: {str(e).splitlines()[0]}")
            return
        for n, conc in enumerate(concs):
            if n and plan.time_budget_s is not None and time.monotonic() - t0 >= plan.time_budget_s:
                out.budget_hit = True
                break
            store.append(_one_run(plan, server, base, conc, start_s, log_path))
            out.ran += 1
            bar.update(1)
            rec = store.latest(plan.fingerprint).get((plan.fingerprint, config.key, conc), {})
            _say(bar, f"[{config.key}] conc={conc}: {_summary(rec)}")
    finally:
        code = server.stop(plan.stop_timeout_s)
        if code not in (0, None):
            _say(bar, f"[{config.key}] server exited with code {code} (log {log_path})")


def _one_run(plan: Plan, server: ServerHandle, base: dict, conc, start_s: float, log_path: Path) -> dict[str, Any]:
    rec: dict[str, Any] = {**base, "concurrency": conc, "start_s": round(start_s, 2)}
    t = time.monotonic()
    with MemorySampler(server.proc.pid) as mem:
        try:
            rec["metrics"] = plan.workload(server.url, conc, log_path)
            rec["status"] = "ok"
        except KeyboardInterrupt:
            raise
        except Exception as e:  # noqa: BLE001 - recorded with the run; the sweep goes on
            rec["status"], rec["error"] = "failed", f"{type(e).__name__}: {e}"[:4000]
    rec["wall_s"] = round(time.monotonic() - t, 2)
    rec["peak_rss_mb"] = round(mem.peak_rss / 2**20, 1)
    rec["peak_gpu_mem_mb"] = None if mem.peak_gpu is None else round(mem.peak_gpu / 2**20, 1)
    info = server.server_info()
    rec["server_info"] = {k: info[k] for k in INFO_KEYS if k in info}
    if server.proc.poll() is not None and rec["status"] == "ok":
        rec["status"], rec["error"] = "failed", f"server exited with code {server.proc.returncode} during the run"
    return rec


def _summary(rec: dict) -> str:
    if rec.get("status") != "ok":
        return f"FAILED {str(rec.get('error'))[:120]}"
    m = rec["metrics"]
    return (f"{m['request_throughput']:.2f} req/s, {m['output_throughput']:.1f} out tok/s, TTFT p99 "
            f"{m['p99_ttft_ms']:.0f} ms, TPOT p99 {m['p99_tpot_ms']:.1f} ms, failed {m.get('failed', 0)}, "
            f"peak RSS {rec['peak_rss_mb']:.0f} MB")
