"""Drive a Scheduler in-process (no ZMQ): feed messages, step until idle, collect outputs."""

from __future__ import annotations

import itertools

from sglang.srt.managers.io_struct import BatchTokenIDOut, TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

_ids = itertools.count()


class InProcessScheduler:
    def __init__(self, model_path: str, dp_rank: int = 0, **kw):
        kw.setdefault("dtype", "float32")
        kw.setdefault("device", "cpu")
        kw.setdefault("max_total_tokens", 8192)
        self.args = ServerArgs(model_path=model_path, **kw)
        self.sched = Scheduler(self.args, None, dp_rank=dp_rank)
        self.sent: list = []
        self.sched.send = self.sent.append
        self.outputs: dict[str, list[int]] = {}
        self.finished: dict[str, object] = {}
        self.meta: dict[str, dict] = {}

    def submit(self, input_ids, mm_inputs=None, stream=False, **sp) -> str:
        rid = f"r{next(_ids)}"
        sp.setdefault("temperature", 0.0)
        msg = TokenizedGenerateReqInput(rid, list(input_ids), SamplingParams(**sp), mm_inputs, stream)
        self.sched.process_input_requests([msg])
        self.outputs[rid] = []
        return rid

    def step(self) -> bool:
        ran = self.sched.step()
        self._drain()
        return ran

    def _drain(self) -> None:
        for msg in self.sent:
            if isinstance(msg, BatchTokenIDOut):
                for i, rid in enumerate(msg.rids):
                    self.outputs.setdefault(rid, []).extend(msg.new_token_ids[i])
                    self.meta[rid] = msg.meta_info[i]
                    if msg.finished_reasons[i] is not None:
                        self.finished[rid] = msg.finished_reasons[i]
        self.sent.clear()

    def run_until_idle(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if self.sched.is_idle():
                self.sched.flush_outputs()  # rejections made while submitting
                self._drain()
                return
            self.step()
        raise AssertionError("scheduler did not drain")

    def assert_no_leak(self) -> None:
        info = self.sched.get_info()
        assert info["available_kv_tokens"] == info["max_total_num_tokens"], info
        assert self.sched.tree.protected_size() == 0
        assert info["free_req_slots"] == self.sched.kv.req_to_token_pool.size, info


# ----------------------------------------------------------------------------- weight-update helpers
def update_phase(s: InProcessScheduler, phase: str, path: str = "", flush_cache: bool = True):
    """One phase ("load", "commit", "rollback") of a weight update through the scheduler; its one reply."""
    from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqInput, UpdateWeightFromDiskReqOutput

    s.sched.process_input_requests([UpdateWeightFromDiskReqInput(path, None, phase, flush_cache=flush_cache)])
    replies = [m for m in s.sent if isinstance(m, UpdateWeightFromDiskReqOutput)]
    s.sent.clear()
    assert len(replies) == 1
    return replies[0]


def model_weights(s: InProcessScheduler) -> dict:
    return {n: p.detach().clone() for n, p in s.sched.worker.model_runner.model.named_parameters()}


def same_weights(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
