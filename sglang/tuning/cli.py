"""The flags of `python -m sglang.tune` and its main(); every flag it does not know goes to bench_serving."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from typing import Any

from sglang.tuning import grid as gridmod
from sglang.tuning import workload as wl
from sglang.tuning.report import OBJECTIVES, SLO, render
from sglang.tuning.store import ResultsStore

EPILOG = """\
examples:
  python -m sglang.tune --grid chunked-prefill-size=256,1024 --num-prompts 8
  python -m sglang.tune --model-path /models/qwen3-vl-8b --server-args="--mem-fraction-static 0.85" \\
      --grid chunked-prefill-size=2048,8192 --grid max-running-requests=64,128 --max-concurrency 16 64 \\
      --dataset-name random-mm --num-prompts 500 --random-input-len 512 --random-output-len 128 \\
      --random-mm-bucket-config '{(720, 1280, 1): 1.0}' --slo-ttft-p99-ms 2000 --output-dir tune-8b
  python -m sglang.tune --grid disable-radix-cache=on,off --trace traffic.jsonl --trace-time-scale 0.5

Grid specs, the trace format and the results file: docs/tuning.md."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sglang.tune", allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Start the server once per configuration of a grid, benchmark each with the same workload "
                    "(bench_serving's flags pass through), rank the runs and print the best launch command.",
        epilog=EPILOG)
    a = p.add_argument
    a("--grid", action="append", default=[], metavar="NAME=V1,V2",
      help="a server flag (bare flags take on/off; 'default' leaves the flag out) or SGLANG_* variable and its "
           "values; values split on '|' instead when the list holds one; repeat for more axes")
    a("--server-args", default="", metavar='"--flag v ..."',
      help="server flags common to every configuration (write --server-args='--x' for a single flag)")
    a("--model-path", default=None, help="model of every configuration (default: the server's embedded tiny model)")
    a("--server-env", action="append", default=[], metavar="VAR=VALUE", help="environment of every server")
    a("--max-concurrency", nargs="+", default=None, metavar="N",
      help="one or several values (space- or comma-separated): one benchmark each per configuration")
    a("--trace", default=None, metavar="FILE.jsonl", help="replay recorded requests instead of a dataset")
    a("--trace-time-scale", type=float, default=1.0, help="multiplies the trace's gaps (0.5: twice as fast)")
    a("--output-dir", default="tune-results", help="results.jsonl (resumable), logs/, report.md, pareto.png")
    a("--objective", default="request-throughput", choices=tuple(OBJECTIVES), help="ranking of the runs")
    a("--slo-ttft-p99-ms", type=float, default=None, help="runs above this p99 TTFT are listed apart")
    a("--slo-tpot-ms", type=float, default=None, help="runs above this p99 TPOT are listed apart")
    a("--time-budget-s", type=float, default=None,
      help="start no configuration (or concurrency) after this many seconds; rerun to continue")
    a("--start-timeout-s", type=float, default=300.0, help="a server not healthy by then counts as failed")
    a("--stop-timeout-s", type=float, default=30.0, help="SIGTERM grace before SIGKILL")
    a("--retry-failed", action="store_true", help="run again the runs the results file has as failed")
    a("--report-only", action="store_true", help="print the report from the results file; start nothing")
    a("--dry-run", action="store_true", help="print the configurations and their commands; start nothing")
    a("--no-plot", action="store_true", help="skip the Pareto PNG")
    a("--disable-progress", action="store_true", help="no progress bar")
    return p


def parse_concurrency(values: list[str] | None) -> list[int | None]:
    if not values:
        return [None]
    out: list[int | None] = []
    for v in values:
        for w in v.split(","):
            if not w:
                continue
            if w.lower() in ("none", "inf", "unlimited"):
                out.append(None)
                continue
            n = int(w)
            if n < 1:
                raise ValueError(f"--max-concurrency {w}: must be >= 1")
            out.append(n)
    if len(set(out)) != len(out):
        raise ValueError("--max-concurrency: repeated value")
    return out


def parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not gridmod.ENV_NAME.match(k):
            raise ValueError(f"--server-env {item!r}: expected VAR=VALUE")
        env[k] = v
    return env


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args, passthrough = build_parser().parse_known_args(argv)
    try:
        concs = parse_concurrency(args.max_concurrency)
        server_env = parse_env(args.server_env)
        axes = gridmod.parse_grid(args.grid)
        configs = gridmod.expand(axes)
        common = shlex.split(args.server_args)
        base_argv = (["--model-path", args.model_path] if args.model_path else []) + common
        if gridmod.RESERVED[2] in {a[2:] for a in common if a.startswith("--")}:
            raise gridmod.GridError("--server-args --model-path: use the tuner's --model-path")
        kinds = gridmod.validate(axes, configs, base_argv)
    except ValueError as e:  # GridError included
        raise SystemExit(f"python -m sglang.tune: {e}")
    wl.check_passthrough(passthrough)
    parts: dict[str, Any] = {"base_argv": base_argv, "server_env": server_env}
    inherited = wl.registered_env()
    if inherited:
        parts["inherited_env"] = inherited
    if args.trace:
        from sglang.benchmark.datasets import DatasetError
        from sglang.tuning.trace import read_trace_records

        try:
            read_trace_records(args.trace)
        except DatasetError as e:
            raise SystemExit(f"python -m sglang.tune: {e}")
        parts.update(trace=wl.trace_fingerprint(args.trace), time_scale=args.trace_time_scale, bench=passthrough)

        def workload(url, conc, log):
            return wl.run_trace(args.trace, args.trace_time_scale, passthrough, url, conc, log)
    else:
        parts["bench"] = wl.with_defaults(passthrough)

        def workload(url, conc, log):
            return wl.run_dataset(passthrough, url, conc, log)
    fp = wl.fingerprint(parts)

    if args.dry_run:
        print(f"{len(configs)} configuration(s) x {len(concs)} concurrency value(s); fingerprint {fp}")
        for c in configs:
            from sglang.tuning.report import launch_command

            print(f"[{c.key}]  " + launch_command({"server_argv": base_argv + gridmod.config_argv(c, kinds),
                                                   "config_env": gridmod.config_env(c)}))
        print("benchmark: " + ("--trace " + args.trace if args.trace else shlex.join(parts["bench"])))
        return 0

    store = ResultsStore(args.output_dir)
    outcome = None
    if not args.report_only:
        from sglang.tuning.sweep import Plan, run_sweep

        plan = Plan(configs, concs, kinds, base_argv, fp, workload, server_env, args.start_timeout_s,
                    args.stop_timeout_s, args.time_budget_s, args.retry_failed, not args.disable_progress)
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            outcome = run_sweep(plan, store)
        finally:
            signal.signal(signal.SIGTERM, previous)
    return _report(args, store, fp, configs, concs, outcome)


def _report(args, store: ResultsStore, fp: str, configs, concs, outcome) -> int:
    latest = store.latest(fp)
    records = [latest[(fp, c.key, n)] for c in configs for n in concs if (fp, c.key, n) in latest]
    if not records:
        print(f"no results for this grid and workload in {store.path} (fingerprint {fp})")
        return 130 if outcome is not None and outcome.interrupted else 1
    note = None
    if not args.no_plot:
        from sglang.tuning.plot import plot_pareto

        note = plot_pareto(records, store.dir / "pareto.png")
    text, best = render(records, args.objective, SLO(args.slo_ttft_p99_ms, args.slo_tpot_ms), note)
    if outcome is not None:
        status = f"ran {outcome.ran}, resumed {outcome.skipped}, left {outcome.left}"
        if outcome.budget_hit:
            status += " (time budget reached: rerun to continue)"
        if outcome.interrupted:
            status += " (interrupted: rerun to continue)"
        text = f"sweep: {status}; results {store.path}\n" + text
    (store.dir / "report.md").write_text(text + "\n")
    print("\n" + text)
    if outcome is not None and outcome.interrupted:
        return 130
    return 0 if best is not None or any(r.get("status") == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
