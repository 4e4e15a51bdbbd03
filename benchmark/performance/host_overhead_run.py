"""The in-process scheduler that `bench_host_overhead.py` measures, with the model forward stubbed and
device-sized work elided (see that file's docstring for the method). Imports sglang only inside
functions, so the bench can point `sys.path` at another tree (`--repo`) before the first import.

Every cost here is read from a *meter*: a callable returning a running total in its own unit, by
default this thread's CPU seconds (`time.thread_time`); with a counter from `step_counter.py`, its
`read` (instructions or bytecodes). The same subtraction applies in every unit: the cost of eliding an
op (measured from the hook's entry) and the hook's calibrated cost per op it runs for real."""

from __future__ import annotations

import os
import pickle
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

CLOCK = time.thread_time

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
    """Ops touching a tensor of >= min_numel elements are not computed (see the bench's docstring);
    views run for real (no data is touched). Factory ops are checked by their output size. The meter's
    cost of an elided op, from the hook's entry on, is added to `elided_cost`."""

    def __init__(self, min_numel: int, meter=CLOCK):
        super().__init__()
        self.min_numel = min_numel
        self.meter = meter
        self.elided_cost = 0.0
        self.elided = 0
        self.ran = 0
        self.fallbacks = 0  # ops without a usable meta kernel: run for real, counted as host

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t0 = self.meter()
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
        self.elided_cost += self.meter() - t0
        return out


def _harness_codes() -> tuple:
    """Python the harness runs inside a measured step that a real server does not, left out of bytecode
    counts with everything it calls: the dispatch hook deciding per op, entering and leaving the mode, and
    torch's lookup of a rule for the active mode, which its dispatcher calls per op only while a Python
    dispatch mode is active."""
    codes = [ElideDeviceWork.__torch_dispatch__.__code__, TorchDispatchMode.__enter__.__code__,
             TorchDispatchMode.__exit__.__code__]
    try:
        from torch._library.simple_registry import find_torch_dispatch_rule

        codes.append(find_torch_dispatch_rule.__code__)
    except ImportError:  # an older torch without per-mode rules
        pass
    return tuple(codes)


HARNESS_CODES = _harness_codes()


def hook_overhead(n: int = 5_000, meter=CLOCK) -> float:
    """What the dispatch hook adds, in the meter's unit, to a small op that it runs for real: the median
    over a mix of ops shaped like the step's (tensor pairs, tensor lists, index lists), best of three."""
    a, b = torch.ones(4), torch.ones(4)
    i = torch.tensor([0, 2])
    ops = [lambda: torch.add(a, b), lambda: torch.cat([a, b, a]), lambda: a.index_put((i,), b[:2]),
           lambda: torch.where(a > 0, a, b), lambda: a.to(torch.int64)]

    def loop(op):
        t0 = meter()
        for _ in range(n):
            op()
        return meter() - t0

    costs = []
    for op in ops:
        loop(op)
        best = float("inf")
        for _ in range(3):
            bare = loop(op)
            with ElideDeviceWork(1 << 40, meter):
                hooked = loop(op)
            best = min(best, (hooked - bare) / n)
        costs.append(best)
    costs.sort()
    return max(costs[len(costs) // 2], 0.0)


class HostOverheadRun:
    """One scheduler with `bs` requests of `prompt_len` random tokens, decoding `output_len` tokens.
    `counter` (step_counter.py): decode steps are measured in its unit instead of thread CPU seconds.
    `standin_vocab`: the logits, penalty tables and sampler work on this many token ids instead of the
    model's vocabulary (real compute, no dispatch hook): every host op runs as with the real vocabulary,
    each on a tiny tensor (host_instructions_valgrind.py counts instructions that way)."""

    def __init__(self, model_path: str, bs: int, prompt_len: int, output_len: int, params: dict,
                 legacy_penalties: bool = False, elide: bool = True, legacy_stop_check: bool = False,
                 overlap: bool = False, device_ms: float = 0.0, counter=None, standin_vocab: int | None = None):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import ServerArgs

        total = bs * (prompt_len + output_len + 8) + 64
        args = ServerArgs(model_path=model_path, dtype="float32", device="cpu", max_total_tokens=total,
                          max_running_requests=bs, context_length=prompt_len + output_len + 16,
                          disable_radix_cache=True, random_seed=0, disable_overlap_schedule=not overlap)
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
        if standin_vocab:
            from sglang.srt.sampling.penalties import PenaltyState

            worker.vocab_size = standin_vocab
            worker.penalties = PenaltyState(standin_vocab, runner.device)
        if legacy_penalties:
            from sglang.srt.sampling.penalties import RebuiltPenaltyState

            worker.penalties = RebuiltPenaltyState(worker.vocab_size, runner.device)
        self.vocab = worker.vocab_size
        logits = torch.randn(bs, self.vocab, generator=torch.Generator().manual_seed(0))

        self.counter = counter
        self.meter = counter.read if counter is not None else CLOCK
        self.mode = ElideDeviceWork(self.vocab, self.meter) if elide else None
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
        """One decode step: (host cost in the meter's unit, elided ops subtracted; ops run; ops elided;
        whether requests finished in it); None when idle."""
        s = self.sched
        if s.is_idle():
            return None
        mode, counter, meter = self.mode, self.counter, self.meter
        e0, r0, n0 = (mode.elided_cost, mode.ran, mode.elided) if mode else (0.0, 0, 0)
        before = len(s.running)
        t0 = meter()
        if counter is not None:
            counter.start()
        s.step()
        if counter is not None:
            counter.stop()
        dt = meter() - t0
        finished = len(s.running) < before
        if mode is None:
            return dt, 0, 0, finished
        return dt - (mode.elided_cost - e0), mode.ran - r0, mode.elided - n0, finished
