"""Host time per decode step outside the model forward: scheduling and batch building, sampler setup,
penalties, output processing. The real in-process `Scheduler` on the tiny Qwen3-VL (vocabulary
151,936, the real one) runs greedy, sampled and penalties workloads; the model forward is replaced.

    python benchmark/performance/bench_host_overhead.py --batch-sizes 1,64,128 --json out.json
    python benchmark/performance/bench_host_overhead.py --legacy-penalties   # the per-step rebuild
    python benchmark/performance/bench_host_overhead.py --workloads stop --legacy-stop-check  # a decode a step
    python benchmark/performance/bench_host_overhead.py --overlap-device-ms 2,8  # overlap scheduler on/off
    python benchmark/performance/bench_host_overhead.py --counter bytecodes --json counts.json  # load-independent
    python benchmark/performance/bench_host_overhead.py --counter instructions --repo /tmp/wt_old  # needs a PMU

--counter instructions | bytecodes: what a decode step costs counted instead of timed (step_counter.py):
retired user-space instructions of the scheduler thread (perf_event_open; refused in one line without a
hardware PMU), or Python bytecodes it executes (Python-level work only: C/C++ adds nothing). The ms per
step of a separate untraced run stays beside the count. JSON: {workload: {"<bs>": {"<counter>_per_step": n,
"host_ms_per_step": x, ...}}}. --repo imports sglang from another tree under this harness (old/new A/B).

--overlap-device-ms: how much of a step's host time the overlap scheduler hides. The forward is a stub
that waits the given milliseconds without holding the GIL (a device running the step), the rest of
the step is real (the sampler's large ops run in C++ without the GIL, as device work would); wall ms per
decode step with `--disable-overlap-schedule` and
without, same process, same requests. Step by step a step costs device + host; overlapped, about
max(device, host); `saved_ms` = off - on is bounded by the scheduler thread's own CPU per step (printed),
the part of the host work that moves off the critical path.

How host time is isolated on a CPU-only machine (where the "device" is the CPU too):
- the model forward is a stub that applies the runner's queued table writes (batch-building work) and
  returns fixed random (B, vocab) logits;
- from the forward on to the end of the worker's step (table writes, penalties, sampling, logprobs),
  every aten op that touches a tensor of at least one vocabulary row (the logits, the penalty tables,
  the request table) is *elided*: it is not computed, its outputs are made from the op's meta (shape)
  kernel, uninitialised when large and zero when small (so every sampled id is 0). That is the
  device's share, which a GPU runs asynchronously to the host; the time spent eliding them is
  measured and subtracted, and so is the dispatch hook's own cost per op it runs for real
  (calibrated on a loop of small ops). Batch building before the forward runs unhooked;
- host_ms_per_step is the mean over the decode steps in which no request finishes; the step where
  they all finish (every request has the same output length) is reported apart as finishing_step_ms:
  releasing a request (KV slots back to the allocator, its last output) is work per request, and
  there it is all of them at once;
- the clock is this thread's CPU time (`time.thread_time`), so other processes' CPU is not counted
  (load still moves it: --counter counts instead); the figure is the mean over every decode step of the run.
Not included: the ZMQ send itself (the output is pickled, as send_pyobj does, and dropped), and the
device's launch cost of the elided ops.

The "stop" workload is greedy with two stop strings per request; every sampled id is 0 (the elided
sampler's output, the text "!"), which can end neither, so the stop-string check skips every window
decode (sglang/srt/sampling/stop_strings.py); --legacy-stop-check decodes the window at every step, as
before that check.

JSON: {"greedy" | "sampled" | "penalties" | "stop": {"<bs>": {"host_ms_per_step": x, ...}},
"sampler_vocab_passes": n}, where sampler_vocab_passes counts the aten ops of one sampled decode step
(batch 8, real compute) that touch a (B x vocab) tensor (`sglang.testing.op_count.count_large_passes`).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from host_overhead_run import (  # noqa: E402
    CLOCK,
    HARNESS_CODES,
    WORKLOADS,
    HostOverheadRun,
    hook_overhead,
)


def sampler_vocab_passes(model_path: str, bs: int = 8) -> tuple[int, dict]:
    """Aten ops of one sampled decode step (real compute, forward stubbed) touching a (bs x vocab)
    tensor: the sampler's passes over the logits (penalties, bias and bans included when present)."""
    from sglang.testing.op_count import count_large_passes

    run = HostOverheadRun(model_path, bs, 16, 4, WORKLOADS["sampled"], elide=False)
    run.prefill()
    s = run.sched
    batch = s.get_next_batch_to_run()
    assert batch.mode.is_decode()
    _, n, by_op = count_large_passes(lambda: s.run_batch(batch), min_numel=bs * run.vocab, by_op=True)
    return n, dict(by_op)


def overlap_comparison(model_path: str, bs: int, prompt_len: int, output_len: int, device_ms: float,
                       params: dict) -> dict:
    """Wall ms per decode step with the overlap scheduler off and on (see --overlap-device-ms)."""
    out = {}
    for overlap in (False, True):
        # not elided: the dispatch hook would add Python work to the forward thread that a device has not;
        # the sampler's large ops run in C++ without the GIL, as device work does
        run = HostOverheadRun(model_path, bs, prompt_len, output_len, params, elide=False, overlap=overlap,
                              device_ms=device_ms)
        run.prefill()
        s = run.sched
        gc.collect()
        steps, t0, c0 = 0, time.perf_counter(), CLOCK()
        while not s.is_idle():
            s.step()
            steps += 1
        key = "on" if overlap else "off"
        out[key] = round((time.perf_counter() - t0) * 1e3 / steps, 3)
        # this thread's CPU per step: overlapped, the scheduler's own host work (what can hide behind the device)
        out[f"scheduler_thread_cpu_ms_{key}"] = round((CLOCK() - c0) * 1e3 / steps, 3)
        del run
    out["saved_ms"] = round(out["off"] - out["on"], 3)
    return out


def main_overlap(args, model_path: str) -> int:
    sizes = [int(x) for x in args.batch_sizes.split(",") if x]
    devices = [float(x) for x in args.overlap_device_ms.split(",") if x]
    results = {}
    print(f"Wall ms per decode step, overlap scheduler off / on; prompt {args.prompt_len}, output "
          f"{args.output_len}, greedy; the forward waits device_ms without the GIL")
    print(f"{'device_ms':>9} {'bs':>5} {'off':>9} {'on':>9} {'saved':>9} {'sched-thread cpu (on)':>22}")
    for d in devices:
        for bs in sizes:
            r = overlap_comparison(model_path, bs, args.prompt_len, args.output_len, d, WORKLOADS["greedy"])
            results[f"{d:g}ms/bs{bs}"] = r
            print(f"{d:>9g} {bs:>5} {r['off']:>9.3f} {r['on']:>9.3f} {r['saved_ms']:>9.3f} "
                  f"{r['scheduler_thread_cpu_ms_on']:>22.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"overlap": results}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def measure(run: HostOverheadRun, hook_cost: float, bar=None) -> dict:
    """Every decode step of a prefilled run: the mean (and median) cost over the steps in which no request
    finishes, the finishing step apart (releasing a request is work per request, and there it is all of
    them at once); in the run's meter unit, the hook's cost per op run for real subtracted."""
    gc.collect()  # the previous runs' garbage is not this run's cost
    per_step, finishing, ops, elided = [], [], 0, 0
    while (r := run.decode_step()) is not None:
        dt, ran, el, finished = r
        host = dt - ran * hook_cost
        if finished:
            finishing.append(host)
            continue
        per_step.append(host)
        ops += ran
        elided += el
        if bar is not None:
            bar.update(1)
    steps = len(per_step)
    return {"mean": sum(per_step) / steps, "p50": statistics.median(per_step), "steps": steps,
            "ops": ops / steps, "elided": elided / steps, "finishing": sum(finishing) / max(len(finishing), 1)}


def time_cell(model_path: str, w: str, bs: int, args, hook_s: float, bar) -> tuple[dict, HostOverheadRun]:
    """Host ms per decode step of one workload and batch size (this thread's CPU time)."""
    run = HostOverheadRun(model_path, bs, args.prompt_len, args.output_len, WORKLOADS[w],
                          legacy_penalties=args.legacy_penalties, legacy_stop_check=args.legacy_stop_check)
    run.prefill()
    m = measure(run, hook_s, bar)
    cell = {"host_ms_per_step": round(m["mean"] * 1e3, 3), "host_ms_p50": round(m["p50"] * 1e3, 3),
            "steps": m["steps"], "worker_ops_per_step": round(m["ops"], 1),
            "elided_device_ops_per_step": round(m["elided"], 1), "finishing_step_ms": round(m["finishing"] * 1e3, 3)}
    if "stop" in WORKLOADS[w]:  # tail decodes of the stop-string check, over the whole run
        cell["stop_window_decodes"] = getattr(run.sched._stop_strings, "window_decodes", 0)
    if run.mode.fallbacks:
        print(f"note: {run.mode.fallbacks} ops of {w} bs={bs} ran for real (no meta kernel)", file=sys.stderr)
    return cell, run


def count_cell(model_path: str, w: str, bs: int, args, counter, hook_cost: float) -> dict:
    """The counter's units per decode step of one workload and batch size, same requests as the timed run
    (a separate run: tracing slows the step down, the ms figure comes from the untraced one)."""
    run = HostOverheadRun(model_path, bs, args.prompt_len, args.output_len, WORKLOADS[w],
                          legacy_penalties=args.legacy_penalties, legacy_stop_check=args.legacy_stop_check,
                          counter=counter)
    run.prefill()
    if getattr(counter, "by_code", None) is not None:
        counter.by_code.clear()
    m = measure(run, hook_cost)
    unit = args.counter
    cell = {f"{unit}_per_step": round(m["mean"]), f"{unit}_p50": round(m["p50"]),
            f"finishing_step_{unit}": round(m["finishing"])}
    if args.profile_top and getattr(counter, "by_code", None):
        n = m["steps"] + 1
        print(f"\n{w} bs={bs}: {unit} per decode step by code object (top {args.profile_top})")
        for name, k in counter.top(args.profile_top):
            print(f"{k / n:>12,.0f}  {name}")
    return cell


def main_counter(args, model_path: str, sizes: list[int], workloads: list[str]) -> dict:
    """--counter instructions | bytecodes: counts per decode step, the ms per step beside them."""
    from step_counter import BytecodeCounter, CounterUnavailable, instruction_counter

    if args.counter == "instructions":
        try:  # opened on this thread, which runs the scheduler's steps
            counter = instruction_counter()
        except CounterUnavailable as e:
            raise SystemExit(str(e)) from None
        hook_cost = hook_overhead(meter=counter.read)
    else:  # the hook's own Python is left out by code object (HARNESS_CODES): nothing to subtract
        counter = BytecodeCounter(HARNESS_CODES, by_code=args.profile_top > 0)
        hook_cost = 0.0
    hook_s = hook_overhead()
    results: dict = {w: {} for w in workloads}
    for w in workloads:
        for bs in sizes:
            cell = count_cell(model_path, w, bs, args, counter, hook_cost)
            timed, run = time_cell(model_path, w, bs, args, hook_s, None)
            del run
            cell.update({k: timed[k] for k in ("host_ms_per_step", "host_ms_p50", "finishing_step_ms", "steps")})
            results[w][str(bs)] = cell
            print(f"{w:<10} bs={bs:<4} {cell[f'{args.counter}_per_step']:>14,} {args.counter}/step "
                  f"(median {cell[f'{args.counter}_p50']:,})  {cell['host_ms_per_step']:.3f} ms/step", flush=True)
    if getattr(counter, "multiplexed", False):
        print("warning: the instruction counter was multiplexed (shared the PMU): counts undercount", file=sys.stderr)
    print(f"\n{args.counter} per decode step of the scheduler thread outside the model forward; prompt "
          f"{args.prompt_len}, output {args.output_len}; Python {sys.version.split()[0]}; host ms per step "
          f"(thread CPU, separate untraced run) beside it")
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", default="1,64,128")
    ap.add_argument("--workloads", default="greedy,sampled,penalties")
    ap.add_argument("--prompt-len", type=int, default=600)
    ap.add_argument("--output-len", type=int, default=230)
    ap.add_argument("--legacy-penalties", action="store_true",
                    help="penalties rebuilt from every request's prompt and output at every step (before)")
    ap.add_argument("--legacy-stop-check", action="store_true",
                    help="stop strings: the output's tail decoded at every step (before)")
    ap.add_argument("--model-path", default=None, help="default: the embedded tiny Qwen3-VL")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--overlap-device-ms", default=None,
                    help="comma list: compare the overlap scheduler off/on with a forward of this many ms")
    ap.add_argument("--counter", choices=("time", "instructions", "bytecodes"), default="time",
                    help="what a decode step costs: thread CPU ms (time), retired user-space instructions of "
                         "the scheduler thread (perf_event_open; needs a hardware PMU), or Python bytecodes")
    ap.add_argument("--profile-top", type=int, default=0,
                    help="--counter bytecodes: print the N code objects with most bytecodes per step")
    ap.add_argument("--repo", default=None,
                    help="import sglang from this tree instead (e.g. a git worktree of an older commit)")
    args = ap.parse_args(argv)
    repo = str(Path(args.repo).resolve()) if args.repo else str(REPO)
    if args.repo and "sglang" in sys.modules and not sys.modules["sglang"].__file__.startswith(repo):
        raise SystemExit(f"--repo {repo}: sglang is already imported from {sys.modules['sglang'].__file__}")
    if repo not in sys.path:
        sys.path.insert(0, repo)

    import logging

    from tqdm import tqdm

    from sglang.testing.make_model import ensure_model

    logging.getLogger("sglang").setLevel(logging.WARNING)
    model_path = args.model_path or str(ensure_model("qwen3-vl-tiny"))
    if args.overlap_device_ms:
        return main_overlap(args, model_path)
    sizes = [int(x) for x in args.batch_sizes.split(",") if x]
    workloads = [w for w in args.workloads.split(",") if w]
    if args.counter != "time":
        results = main_counter(args, model_path, sizes, workloads)
        print(f"{'workload':<10}" + "".join(f"{'bs=' + str(b):>24}" for b in sizes))
        for w in workloads:
            print(f"{w:<10}" + "".join(f"{c[args.counter + '_per_step']:>14,} ({c['host_ms_per_step']:.3f} ms)"
                                       for c in (results[w][str(b)] for b in sizes)))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
            print(f"wrote {args.json}")
        return 0
    hook_s = hook_overhead()
    results: dict = {w: {} for w in workloads}
    bar = tqdm(total=len(sizes) * len(workloads) * (args.output_len - 2), desc="decode steps", unit="step")
    for w in workloads:
        for bs in sizes:
            bar.set_postfix_str(f"{w} bs={bs}")
            results[w][str(bs)], run = time_cell(model_path, w, bs, args, hook_s, bar)
            penalties_on_device = type(getattr(run.sched.worker, "penalties", None)).__name__ == "PenaltyState"
            vocab = run.vocab
            del run
    bar.close()
    passes, by_op = sampler_vocab_passes(model_path)
    results["sampler_vocab_passes"] = passes

    if args.legacy_penalties:
        label = "penalties rebuilt per step (--legacy-penalties)"
    else:
        label = "device penalties" if penalties_on_device else "penalties rebuilt per step (this tree's worker)"
    print(f"\nHost ms per decode step outside the model forward; prompt {args.prompt_len}, output "
          f"{args.output_len}, vocab {vocab}; {label}; hook overhead {hook_s * 1e6:.2f} us/op subtracted")
    print("mean (median) over the steps where no request finishes; the finishing step apart")
    print(f"{'workload':<10}" + "".join(f"{'bs=' + str(b):>18}" for b in sizes) + "   finishing step ms")
    for w in workloads:
        cells = "".join(f"{results[w][str(b)]['host_ms_per_step']:>9.3f} ({results[w][str(b)]['host_ms_p50']:.3f})"
                        for b in sizes)
        print(f"{w:<10}{cells}   " + ", ".join(f"{results[w][str(b)]['finishing_step_ms']:.1f}" for b in sizes))
    print(f"sampler vocab passes (sampled step, bs=8): {passes}  {by_op}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
