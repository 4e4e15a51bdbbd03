"""Decode step time with every request constrained vs none, through the real in-process `Scheduler` and
model (the forward included), and the grammar caches' hit rates.

    python benchmark/performance/bench_grammar_step.py --batch-sizes 1,32,64 --steps 16 --json out.json
    python benchmark/performance/bench_grammar_step.py --preset qwen3-vl-2b   # a shape-true text model
    python benchmark/performance/bench_grammar_step.py --device cuda --clock wall --dtype bfloat16

Each batch runs twice in one process: B unconstrained requests, then B requests sharing one JSON schema
(its string field has a minimum length the decode cannot reach in --steps tokens, so no request finishes
early and every step fills and applies B bitmask rows). The figure is the median, over the decode steps
in which all B requests run, of this thread's CPU time (`time.thread_time`, torch on --threads 1 intra-op
thread by default, so other processes on a shared machine do not inflate it; xgrammar's bitmask fill for
several rows runs on its own threads, which this clock does not see: --clock wall counts them, on an idle
machine). The two runs alternate --repeats times and the medians are averaged.
The cache line counts the rank's compiled-grammar cache: one compile (miss) for the first request of the
schema, a hit for every other one.

JSON: {"<bs>": {"none_ms": x, "constrained_ms": y, "overhead_pct": z, "steps": n},
"cache": {"hits": h, "misses": m, "hit_rate": r}, "model": path}
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SCHEMA = json.dumps({
    "type": "object",
    "properties": {"summary": {"type": "string", "minLength": 400}, "score": {"type": "integer"}},
    "required": ["summary", "score"],
})


class SchedulerRun:
    """B requests of `prompt_len` random tokens in an in-process scheduler, decoded step by step."""

    def __init__(self, sched, bs: int, prompt_len: int, steps: int, schema: str | None, seed: int):
        from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
        from sglang.srt.sampling.sampling_params import SamplingParams

        self.sched, self.bs = sched, bs
        self.clock = time.perf_counter
        self.sync = torch.cuda.synchronize if torch.cuda.is_available() else None
        g = torch.Generator().manual_seed(seed)
        for i in range(bs):
            ids = torch.randint(0, 150_000, (prompt_len,), generator=g).tolist()
            sp = SamplingParams(max_new_tokens=steps + 1, ignore_eos=True, temperature=0.0, json_schema=schema)
            sp.verify()
            sched.process_input_requests([TokenizedGenerateReqInput(f"s{seed}-{i}", ids, sp, None, False)])

    def step_times(self) -> list[float]:
        """Wall seconds of each decode step with all B requests running (prefill and compile excluded)."""
        s, out = self.sched, []
        while not s.is_idle():
            decoding = len(s.running) == self.bs and not s.waiting and s.chunked_req is None
            t0 = self.clock()
            s.step()
            if self.sync is not None:
                self.sync()
            dt = self.clock() - t0
            if decoding and len(s.running) == self.bs:
                out.append(dt)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", default="1,32,64")
    ap.add_argument("--steps", type=int, default=16, help="decode steps per run")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--model-path", default=None, help="default: --preset's model (generated on first use)")
    ap.add_argument("--preset", default="qwen3-vl-tiny", help="a sglang.testing preset, e.g. qwen3-vl-2b")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (use --clock wall there: the GPU's time is not this thread's)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--clock", choices=("thread", "wall"), default="thread")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()

    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.server_args import ServerArgs
    from sglang.testing.make_model import ensure_model

    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    model_path = args.model_path or str(ensure_model(args.preset))
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    bs_max = max(sizes)
    total = bs_max * (args.prompt_len + args.steps + 8) + 64
    sched = Scheduler(ServerArgs(model_path=model_path, dtype=args.dtype, device=args.device, max_total_tokens=total,
                                 max_running_requests=bs_max, context_length=args.prompt_len + args.steps + 16,
                                 disable_radix_cache=True, random_seed=0), None)
    sched.send = lambda obj: None
    results: dict = {"model": model_path}
    print(f"model {model_path}, {args.steps} decode steps x {args.repeats}, prompt {args.prompt_len} tokens, "
          f"vocab {sched.worker.vocab_size}, clock {args.clock}, torch threads {args.threads}")
    print(f"{'batch':>6} {'none ms/step':>13} {'json ms/step':>13} {'overhead':>9}")
    for bs in sizes:
        times: dict[str, list[float]] = {"none": [], "constrained": []}
        steps = 0
        for rep in range(args.repeats):
            for mode, schema in (("none", None), ("constrained", SCHEMA)):
                run = SchedulerRun(sched, bs, args.prompt_len, args.steps, schema, seed=bs * 100 + rep)
                run.clock = clock
                t = run.step_times()
                assert t, f"no decode step ran with all {bs} requests"
                times[mode].append(statistics.median(t) * 1e3)
                steps += len(t)
        none_ms, constrained_ms = statistics.mean(times["none"]), statistics.mean(times["constrained"])
        pct = (constrained_ms / none_ms - 1) * 100
        results[str(bs)] = {"none_ms": round(none_ms, 3), "constrained_ms": round(constrained_ms, 3),
                            "overhead_pct": round(pct, 1), "steps": steps}
        print(f"{bs:>6} {none_ms:>13.2f} {constrained_ms:>13.2f} {pct:>8.1f}%")
    stats = sched.grammar_queue.cache.stats()
    lookups = stats["hits"] + stats["misses"]
    results["cache"] = {"hits": stats["hits"], "misses": stats["misses"],
                        "hit_rate": round(stats["hits"] / lookups, 4) if lookups else None}
    print(f"grammar cache: {stats['hits']} hits, {stats['misses']} misses "
          f"(hit rate {results['cache']['hit_rate']:.3f} over {lookups} constrained requests)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    sched.grammar_queue.close()


if __name__ == "__main__":
    main()
