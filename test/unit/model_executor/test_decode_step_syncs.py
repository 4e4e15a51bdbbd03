"""One decode step, counted op by op: no host syncs inside the model and the number of aten ops does
not grow with the batch size (a per-request loop in attention or sampling would show up here).

Counting runs on CPU through a TorchDispatchMode; the ops listed in SYNC_OPS are the ones that make
a CUDA device wait for the host (reading a value back, or an output whose size depends on data)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sglang.srt.layers.sampler import Sampler, SamplingBatchInfo
from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerConfig
from sglang.srt.model_executor.static_batch import StaticBatchRunner, StaticSeq
from sglang.srt.sampling.sampling_params import SamplingParams

SYNC_OPS = {"_local_scalar_dense", "item", "nonzero", "masked_select", "unique", "_unique2", "repeat_interleave",
            "equal", "is_nonzero", "allclose"}


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._overloadpacket.__name__
        self.ops[name] += 1
        if name == "index" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                   for i in (args[1] if len(args) > 1 else []) if i is not None):
            self.ops["<bool-mask index>"] += 1
        return func(*args, **(kwargs or {}))

    def syncs(self) -> dict[str, int]:
        return {k: v for k, v in self.ops.items() if k in SYNC_OPS or k.startswith("<")}


@pytest.fixture(scope="module")
def static_runner(tiny_model_dir):
    runner = ModelRunner(ModelRunnerConfig(model_path=str(tiny_model_dir("qwen3-vl-tiny")), dtype="float32",
                                           max_total_tokens=4096, max_running_requests=20, context_length=512))
    return StaticBatchRunner(runner)


def count_decode_step(sb: StaticBatchRunner, batch: int, params: SamplingParams) -> OpCounter:
    seqs = [StaticSeq([11 + i, 12, 13 + 2 * i, 14][: 2 + i % 3]) for i in range(batch)]  # ragged lengths
    try:
        logits, _ = sb.extend(seqs)
        tokens = logits.argmax(-1).tolist()
        fb = sb.decode_batch(seqs, tokens)
        sampler = Sampler(seed=0)
        info = SamplingBatchInfo.from_params([params] * batch, [None] * batch, logits.shape[-1], "cpu", [5] * batch)
        counter = OpCounter()
        with counter, torch.inference_mode():
            out = sb.runner.forward(fb)
            sampler(out.next_token_logits, info)
        return counter
    finally:
        sb.release(seqs)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0),
                                    SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05)],
                         ids=["greedy", "sampled"])
def test_decode_step_has_no_sync_and_flat_op_count(static_runner, params):
    small = count_decode_step(static_runner, 1, params)
    large = count_decode_step(static_runner, 16, params)
    assert small.syncs() == {} and large.syncs() == {}, (small.syncs(), large.syncs())
    total_small, total_large = sum(small.ops.values()), sum(large.ops.values())
    # size-1 dims can cost a view or two more at batch 1; what must not happen is growth
    assert total_large <= total_small, (
        f"{total_small} ops at batch 1, {total_large} at batch 16; grew: "
        f"{ {k: (small.ops[k], v) for k, v in large.ops.items() if v > small.ops[k]} }"
    )


def test_counter_sees_a_per_request_loop_and_a_sync():
    """The counter itself: a loop over rows multiplies ops, and .item() is reported."""
    def step(x):
        for row in x:
            row.add_(1)
        return x.sum().item()

    c1, c4 = OpCounter(), OpCounter()
    with c1:
        step(torch.zeros(1, 3))
    with c4:
        step(torch.zeros(4, 3))
    assert sum(c4.ops.values()) > sum(c1.ops.values())
    assert c1.syncs().get("_local_scalar_dense") == 1
