"""Host time per decode step outside the model forward: scheduling and batch building, sampler setup,
penalties, output processing. The real in-process `Scheduler` on the tiny Qwen3-VL (vocabulary
151,936, the real one) runs greedy, sampled and penalties workloads; the model forward is replaced.

    python benchmark/performance/bench_host_overhead.py --batch-sizes 1,64,128 --json out.json
    python benchmark/performance/bench_host_overhead.py --legacy-penalties   # the per-step rebuild
    python benchmark/performance/bench_host_overhead.py --workloads stop --legacy-stop-check  # a decode a step
    python benchmark/performance/bench_host_overhead.py --overlap-device-ms 2,8  # overlap scheduler on/off

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
- the clock is this thread's CPU time (`time.thread_time`), so other processes on a shared machine
  do not inflate it; the figure is the mean over every decode step of the run.
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
import pickle
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

WORKLOADS = {
    "greedy": dict(temperature=0.0),
    "sampled": dict(temperature=0.8, top_p=0.95),
    "penalties": dict(temperature=0.0, repetition_penalty=1.1, frequency_penalty=0.5, presence_penalty=0.3),
    "stop": dict(temperature=0.0, stop=["</answer>", "\n\nUser:"]),
}


class DecodeEveryStep:
    """The stop-string check before `StopStrings`: the window decoded at every step."""

    window_decodes = 0

    def check(self, tokenizer, output_ids, stop):
        from sglang.srt.sampling.stop_strings import stop_in_tail

        self.window_decodes += 1
        return stop_in_tail(tokenizer, output_ids, stop)
CLOCK = time.thread_time


def _scan(xs, min_numel: int) -> tuple[bool, bool]:
    """(any tensor, any tensor of >= min_numel elements) among xs and lists / tuples inside them."""
    has = large = False
    for x in xs:
        if isinstance(x, torch.Tensor):
            has = True
            if x.numel() >= min_numel:
                return True, True
        elif isinstance(x, (list, tuple)):
            h, lg = _scan(x, min_numel)
            has |= h
            if lg:
                return True, True
    return has, large


# ops whose schema says "may return an alias" that copy when they must (a dtype change, a strided input)
_MAY_COPY = {"to", "reshape", "contiguous", "flatten", "type_as"}


class ElideDeviceWork(TorchDispatchMode):
    """Ops touching a tensor of >= min_numel elements are not computed (see the module docstring);
    views run for real (no data is touched). Factory ops are checked by their output size. The CPU
    time spent on an elided op, from the hook's entry on, is added to `elided_s`."""

    def __init__(self, min_numel: int):
        super().__init__()
        self.min_numel = min_numel
        self.elided_s = 0.0
        self.elided = 0
        self.ran = 0
        self.fallbacks = 0  # ops without a usable meta kernel: run for real, counted as host

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t0 = CLOCK()
        kwargs = kwargs or {}
        has_tensor, large = _scan(args, self.min_numel)
        if kwargs:
            h, lg = _scan(kwargs.values(), self.min_numel)
            has_tensor, large = has_tensor or h, large or lg
        if (func.is_view and func._overloadpacket.__name__ not in _MAY_COPY) or (has_tensor and not large):
            self.ran += 1
            return func(*args, **kwargs)
        real_of: dict[int, torch.Tensor] = {}

        def to_meta(x):
            if not isinstance(x, torch.Tensor):
                return x
            m = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
            real_of[id(m)] = x
            return m

        try:
            m_args, m_kwargs = tree_map(to_meta, (args, kwargs))
            if not has_tensor and "device" in m_kwargs:
                m_kwargs["device"] = "meta"
            m_out = func(*m_args, **m_kwargs)
        except Exception:
            self.fallbacks += 1
            self.ran += 1
            return func(*args, **kwargs)
        if not has_tensor and not any(isinstance(x, torch.Tensor) and x.numel() >= self.min_numel
                                      for x in tree_leaves(m_out)):
            self.ran += 1  # a small factory op: made for real
            return func(*args, **kwargs)

        def to_real(x):
            if not isinstance(x, torch.Tensor):
                return x
            if id(x) in real_of:  # in-place, out= or aliasing result: the real argument
                return real_of[id(x)]
            if x.numel() >= self.min_numel:
                return torch.empty(x.shape, dtype=x.dtype)
            return torch.zeros(x.shape, dtype=x.dtype)

        out = tree_map(to_real, m_out)
        self.elided += 1
        self.elided_s += CLOCK() - t0
        return out


def hook_overhead_s(n: int = 5_000) -> float:
    """CPU seconds the dispatch hook adds to a small op that it runs for real: the median over a mix
    of ops shaped like the step's (tensor pairs, tensor lists, index lists), best of three rounds."""
    a, b = torch.ones(4), torch.ones(4)
    i = torch.tensor([0, 2])
    ops = [lambda: torch.add(a, b), lambda: torch.cat([a, b, a]), lambda: a.index_put((i,), b[:2]),
           lambda: torch.where(a > 0, a, b), lambda: a.to(torch.int64)]

    def loop(op):
        t0 = CLOCK()
        for _ in range(n):
            op()
        return CLOCK() - t0

    costs = []
    for op in ops:
        loop(op)
        best = float("inf")
        for _ in range(3):
            bare = loop(op)
            with ElideDeviceWork(1 << 40):
                hooked = loop(op)
            best = min(best, (hooked - bare) / n)
        costs.append(best)
    costs.sort()
    return max(costs[len(costs) // 2], 0.0)


class HostOverheadRun:
    """One scheduler with `bs` requests of `prompt_len` random tokens, decoding `output_len` tokens."""

    def __init__(self, model_path: str, bs: int, prompt_len: int, output_len: int, params: dict,
                 legacy_penalties: bool = False, elide: bool = True, legacy_stop_check: bool = False,
                 overlap: bool = False, device_ms: float = 0.0):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import ServerArgs

        total = bs * (prompt_len + output_len + 8) + 64
        args = ServerArgs(model_path=model_path, dtype="float32", device="cpu", max_total_tokens=total,
                          max_running_requests=bs, context_length=prompt_len + output_len + 16,
                          disable_radix_cache=True, random_seed=0, disable_overlap_schedule=not overlap)
        import os

        # a CPU device runs step by step unless asked (SGLANG_OVERLAP_SCHEDULE_ON_CPU); the A/B asks
        before = os.environ.pop("SGLANG_OVERLAP_SCHEDULE_ON_CPU", None)
        if overlap:
            os.environ["SGLANG_OVERLAP_SCHEDULE_ON_CPU"] = "1"
        try:
            self.sched = sched = Scheduler(args, None)
        finally:
            os.environ.pop("SGLANG_OVERLAP_SCHEDULE_ON_CPU", None)
            if before is not None:
                os.environ["SGLANG_OVERLAP_SCHEDULE_ON_CPU"] = before
        assert sched.enable_overlap is overlap, "the overlap A/B must run both loops"
        if legacy_stop_check:
            sched._stop_strings = DecodeEveryStep()
        sched.send = lambda obj: pickle.dumps(obj)  # what send_pyobj does before the socket
        worker = sched.worker
        runner = worker.model_runner
        if legacy_penalties:
            from sglang.srt.sampling.penalties import RebuiltPenaltyState

            worker.penalties = RebuiltPenaltyState(worker.vocab_size, runner.device)
        self.vocab = worker.vocab_size
        logits = torch.randn(bs, self.vocab, generator=torch.Generator().manual_seed(0))

        self.mode = ElideDeviceWork(self.vocab) if elide else None
        self._hooked = False

        def fake_forward(fb):
            if self.mode is not None:  # hooked from here to the end of the worker's step
                self.mode.__enter__()
                self._hooked = True
            runner.req_to_token_pool.apply_pending()
            if device_ms:
                time.sleep(device_ms / 1e3)  # the device's share: the host thread waits, the GIL is free
            return LogitsProcessorOutput(next_token_logits=logits[: fb.batch_size])

        runner.forward = fake_forward
        real = worker.forward_batch_generation

        def forward_batch_generation(*a, **kw):
            try:
                return real(*a, **kw)
            finally:
                if self._hooked:
                    self._hooked = False
                    self.mode.__exit__(None, None, None)

        worker.forward_batch_generation = forward_batch_generation
        g = torch.Generator().manual_seed(1)
        for i in range(bs):
            ids = torch.randint(0, 150_000, (prompt_len,), generator=g).tolist()
            sp = SamplingParams(max_new_tokens=output_len, ignore_eos=True, **params)
            sched.process_input_requests([TokenizedGenerateReqInput(f"r{i}", ids, sp, None, False)])
        self.bs = bs

    def prefill(self) -> None:
        s = self.sched
        while s.waiting or s.chunked_req is not None:
            s.step()
        assert len(s.running) == self.bs, (len(s.running), self.bs)

    def decode_step(self) -> tuple[float, int, int, bool] | None:
        """One decode step: (host CPU seconds, ops run, ops elided, whether requests finished in it);
        None when idle."""
        s = self.sched
        if s.is_idle():
            return None
        mode = self.mode
        e0, r0, n0 = (mode.elided_s, mode.ran, mode.elided) if mode else (0.0, 0, 0)
        before = len(s.running)
        t0 = CLOCK()
        s.step()
        dt = CLOCK() - t0
        finished = len(s.running) < before
        if mode is None:
            return dt, 0, 0, finished
        return dt - (mode.elided_s - e0), mode.ran - r0, mode.elided - n0, finished


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
    args = ap.parse_args(argv)

    import logging

    from tqdm import tqdm

    from sglang.testing.make_model import ensure_model

    logging.getLogger("sglang").setLevel(logging.WARNING)
    model_path = args.model_path or str(ensure_model("qwen3-vl-tiny"))
    if args.overlap_device_ms:
        return main_overlap(args, model_path)
    sizes = [int(x) for x in args.batch_sizes.split(",") if x]
    workloads = [w for w in args.workloads.split(",") if w]
    hook_s = hook_overhead_s()
    results: dict = {w: {} for w in workloads}
    total_steps = len(sizes) * len(workloads) * (args.output_len - 2)
    bar = tqdm(total=total_steps, desc="decode steps", unit="step")
    for w in workloads:
        for bs in sizes:
            bar.set_postfix_str(f"{w} bs={bs}")
            run = HostOverheadRun(model_path, bs, args.prompt_len, args.output_len, WORKLOADS[w],
                                  legacy_penalties=args.legacy_penalties, legacy_stop_check=args.legacy_stop_check)
            penalties_on_device = type(getattr(run.sched.worker, "penalties", None)).__name__ == "PenaltyState"
            vocab = run.vocab
            run.prefill()
            gc.collect()  # the previous runs' garbage is not this run's cost
            per_step, finishing, ops, elided = [], [], 0, 0
            while (r := run.decode_step()) is not None:
                dt, ran, el, finished = r
                host = dt - ran * hook_s
                if finished:  # the requests' release (KV free, outputs) is per request, not per step
                    finishing.append(host)
                    continue
                per_step.append(host)
                ops += ran
                elided += el
                bar.update(1)
            steps = len(per_step)
            results[w][str(bs)] = {
                "host_ms_per_step": round(sum(per_step) * 1e3 / steps, 3),
                "host_ms_p50": round(statistics.median(per_step) * 1e3, 3),
                "steps": steps,
                "worker_ops_per_step": round(ops / steps, 1),
                "elided_device_ops_per_step": round(elided / steps, 1),
                "finishing_step_ms": round(sum(finishing) * 1e3 / max(len(finishing), 1), 3),
            }
            if "stop" in WORKLOADS[w]:  # tail decodes of the stop-string check, over the whole run
                results[w][str(bs)]["stop_window_decodes"] = getattr(run.sched._stop_strings, "window_decodes", 0)
            if run.mode.fallbacks:
                print(f"note: {run.mode.fallbacks} ops of {w} bs={bs} ran for real (no meta kernel)", file=sys.stderr)
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
