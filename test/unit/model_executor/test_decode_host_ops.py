"""A decode step makes no tensor per request on the host: the aten op count of a whole step (batch
building, the tiny model's forward, sampling) through the path `sglang.bench_one_batch` uses stays
within 1.15x from batch 1 to batch 8; decode positions (seq_len - 1 + M-RoPE delta, one vector op)
equal the per-request positions they replace, for text and image requests, in the static runner and
the scheduler's batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from sglang.srt.layers.sampler import Sampler, SamplingBatchInfo
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.model_executor.forward_batch_info import ForwardMode, build_forward_batch, compute_positions
from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerConfig
from sglang.srt.model_executor.static_batch import StaticBatchRunner, StaticSeq
from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor
from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.testing.op_count import count_aten_ops

PLACEHOLDER = [151652, 151655, 151653]
MAX_GROWTH = 1.15


@pytest.fixture(scope="module")
def sb(tiny_model_dir):
    runner = ModelRunner(ModelRunnerConfig(model_path=str(tiny_model_dir("qwen3-vl-tiny")), dtype="float32",
                                           max_total_tokens=4096, max_running_requests=20, context_length=512))
    return StaticBatchRunner(runner)


@pytest.fixture(scope="module")
def proc():
    return QwenVLProcessor(None, QwenVLImageProcessor(patch_size=16, image_mean=(0.5,) * 3, image_std=(0.5,) * 3,
                                                      min_pixels=4 * 32 * 32, max_pixels=16 * 32 * 32))


def _image(seed):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (64, 96, 3), dtype=np.uint8))


def _seqs(proc, batch):
    """As bench_one_batch: one image per prompt (a non-zero M-RoPE delta), ragged text around it."""
    out = []
    for i in range(batch):
        ids, mm = proc.process([11 + i, 12] + PLACEHOLDER + [13, 14 + i][: 1 + i % 2], [_image(i)])
        out.append(StaticSeq(ids, mm))
    return out


def _step_ops(sb, proc, batch, params):
    seqs = _seqs(proc, batch)
    try:
        logits, _ = sb.extend(seqs)
        for s, t in zip(seqs, logits.argmax(-1).tolist()):
            s.output_ids.append(t)
        sampler = Sampler(seed=0)

        def step():
            with torch.inference_mode():
                fb = sb.decode_batch(seqs, [s.output_ids[-1] for s in seqs])
                out = sb.runner.forward(fb)
                ps = [params] * batch
                info = SamplingBatchInfo.from_params(ps, [p.seed for p in ps], out.next_token_logits.shape[-1],
                                                     sb.runner.device, [len(s.output_ids) for s in seqs],
                                                     rng=sampler.rng)
                return sampler(out.next_token_logits, info).tolist()

        _, n, ops = count_aten_ops(step)
        return n, ops
    finally:
        sb.release(seqs)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_decode_step_op_count_is_flat_from_batch_1_to_8(sb, proc, params):
    n1, ops1 = _step_ops(sb, proc, 1, params)
    n8, ops8 = _step_ops(sb, proc, 8, params)
    print(f"decode step aten ops: batch 1 = {n1}, batch 8 = {n8} ({n8 / n1:.3f}x)")
    grew = {k: (ops1[k], v) for k, v in ops8.items() if v > ops1[k]}
    assert n8 <= MAX_GROWTH * n1, f"{n1} ops at batch 1, {n8} at batch 8; grew: {grew}"
    assert ops8["arange"] <= ops1["arange"] and ops8["repeat"] == ops1["repeat"] == 0, grew


def test_decode_positions_equal_per_request_positions(sb, proc):
    seqs = _seqs(proc, 3) + [StaticSeq([5, 6, 7])]  # a text-only request: delta 0
    try:
        logits, _ = sb.extend(seqs)
        tokens = logits.argmax(-1).tolist()
        for s, t in zip(seqs, tokens):
            s.output_ids.append(t)
        assert any(s.mm_inputs.mrope_position_delta != 0 for s in seqs[:3])
        for _ in range(2):
            fb = sb.decode_batch(seqs, [s.output_ids[-1] for s in seqs])
            want = torch.cat([compute_positions(s.mm_inputs, len(s.input_ids), s.kv_len - 1, s.kv_len)
                              for s in seqs], dim=1)
            assert fb.positions.shape == (3, len(seqs)) and torch.equal(fb.positions, want)
            assert fb.seq_lens.tolist() == [s.kv_len for s in seqs] == fb.seq_lens_cpu
            assert fb.out_cache_loc.tolist() == [int(s.slots[-1]) for s in seqs]
            table = sb.runner.req_to_token_pool
            sb.runner.forward(fb)  # applies the queued table writes
            assert [int(table.req_to_token[s.req_pool_idx, s.kv_len - 1]) for s in seqs] == fb.out_cache_loc.tolist()
    finally:
        sb.release(seqs)
    assert sb.runner.allocator.available_size() == sb.runner.allocator.size


def test_schedule_batch_decode_positions_and_flat_ops(proc):
    def reqs(batch):
        out = []
        for i in range(batch):
            ids, mm = proc.process([3 + i] + PLACEHOLDER + [4], [_image(10 + i)]) if i % 2 else ([3, 4, 5 + i], None)
            r = Req(f"r{i}", ids, SamplingParams(), mm)
            r.output_ids = [7, 8 + i]
            r.kv_indices = torch.arange(len(ids) + 2)
            r.req_pool_idx = i
            out.append(r)
        return out

    def build(rs):
        batch = ScheduleBatch(ForwardMode.DECODE, rs)
        batch.out_cache_loc = torch.arange(100, 100 + len(rs))
        return batch.to_forward_batch("cpu")

    rs = reqs(4)
    fb = build(rs)
    want = torch.cat([compute_positions(r.mm_inputs, r.prompt_len, r.kv_len - 1, r.kv_len) for r in rs], dim=1)
    assert torch.equal(fb.positions, want) and fb.input_ids.tolist() == [8, 9, 10, 11]
    one, eight = reqs(1), reqs(8)
    _, n1, _ = count_aten_ops(lambda: build(one))
    _, n8, _ = count_aten_ops(lambda: build(eight))
    assert n8 == n1, (n1, n8)


def test_extend_still_needs_positions():
    with pytest.raises(ValueError, match="positions"):
        build_forward_batch(ForwardMode.EXTEND, [1, 2], None, [0], [2], torch.tensor([1, 2]), "cpu", [2], [0])
