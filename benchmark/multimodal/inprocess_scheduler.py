"""A Scheduler driven in-process for microbenchmarks: submit tokenized requests, step, time."""

from __future__ import annotations

import itertools
import time

from sglang.srt.managers.io_struct import BatchTokenIDOut, TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

_rid = itertools.count()


class BenchScheduler:
    def __init__(self, **server_args):
        server_args.setdefault("device", "cpu")
        self.sched = Scheduler(ServerArgs(**server_args), None)
        self.sent: list = []
        self.sched.send = self.sent.append

    def run_request(self, input_ids, mm_inputs, max_new_tokens: int = 1) -> dict:
        """Runs one request alone to completion; returns TTFT, e2e (ms) and its meta_info."""
        rid = f"b{next(_rid)}"
        sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
        start = time.perf_counter()
        self.sched.process_input_requests([TokenizedGenerateReqInput(rid, input_ids, sp, mm_inputs, stream=True)])
        ttft = None
        meta = {}
        while not self.sched.is_idle() or self.sent:
            self.sched.step()
            for msg in self.sent:
                if isinstance(msg, BatchTokenIDOut) and rid in msg.rids:
                    i = msg.rids.index(rid)
                    if ttft is None and msg.new_token_ids[i]:
                        ttft = (time.perf_counter() - start) * 1e3
                    meta = msg.meta_info[i]
            self.sent.clear()
        return {"ttft_ms": ttft, "e2e_ms": (time.perf_counter() - start) * 1e3, "meta": meta}
