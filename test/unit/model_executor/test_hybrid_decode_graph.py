"""Decode CUDA graphs for hybrid models (Qwen3.5, qwen3.5-tiny): the refusal stays for the per-request torch
path of the Gated DeltaNet layers and is lifted for the kernels; the state pool's padding row is owned by
nobody; the padded static-buffer decode the graph captures, run eagerly on CPU (kernels interpreted, in a
process that sets TRITON_INTERPRET=1 first: the attention kernels use triton.language's @jit helpers),
equals the unpadded decode in logits and in every real pool row; and on CUDA (gpu) captured replay gives
eager's tokens and states for captured, padded and too-large batch sizes."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

from sglang.srt.mem_cache.state_pool import GDNStatePool
from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerConfig, hybrid_graph_refusal
from sglang.srt.model_loader.loader import get_model

PRESET = "qwen3.5-tiny"


@pytest.fixture(scope="module")
def path(tiny_model_dir):
    return str(tiny_model_dir(PRESET))


def _model(path, monkeypatch, backend: str):
    monkeypatch.setenv("SGLANG_GDN_BACKEND", backend)
    return get_model(path, dtype="float32")


def test_refusal_stays_for_the_torch_path_and_is_lifted_for_the_kernels(path, tiny_model_dir, monkeypatch):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")  # device objects only: nothing runs
    torch_path, kernels = _model(path, monkeypatch, "torch"), _model(path, monkeypatch, "triton")
    assert "per-request torch path" in hybrid_graph_refusal(torch_path, cuda)
    assert hybrid_graph_refusal(kernels, cuda) is None
    auto = _model(path, monkeypatch, "auto")
    assert hybrid_graph_refusal(auto, cpu) is not None  # auto takes the kernels for CUDA activations only
    pytest.importorskip("triton")
    assert hybrid_graph_refusal(auto, cuda) is None
    plain = get_model(str(tiny_model_dir("qwen3-vl-tiny")), dtype="float32")
    assert hybrid_graph_refusal(plain, cuda) is None  # no recurrent state: nothing to refuse


@pytest.mark.parametrize("backend,reason", [("torch", "per-request torch path"), ("triton", "--attention-backend")])
def test_the_runner_logs_the_refusal_only_for_the_torch_path(path, monkeypatch, caplog, backend, reason):
    """The runner's decision as on CUDA (its device swapped in after a CPU build): the torch path
    stops at the hybrid refusal; the kernel path passes it and stops only at the attention backend check."""
    monkeypatch.setenv("SGLANG_GDN_BACKEND", backend)
    runner = ModelRunner(ModelRunnerConfig(model_path=path, dtype="float32", max_total_tokens=256,
                                           max_running_requests=2, context_length=256, cuda_graph=True))
    pool = runner.state_pool
    assert runner.gdn_kernels is (backend == "triton")  # the kernel path gets no per-request state views
    # the padding row is reserved only where graphs can cover the pool
    assert (pool.padding_row is not None) is (backend == "triton")
    assert pool.conv.shape[0] == 2 + 2 + (backend == "triton")
    runner.device = torch.device("cuda")  # the runner's decision as on CUDA; nothing is captured below
    with caplog.at_level(logging.INFO, logger="sglang.srt.model_executor.model_runner"):
        assert runner._init_cuda_graphs() is None
    assert reason in caplog.text and ("per-request" in caplog.text) is (backend == "torch")


def test_the_padding_row_is_owned_by_nobody(path, monkeypatch):
    shape = _model(path, monkeypatch, "torch").gdn_state_shape()
    pool = GDNStatePool(shape, rows=2, snapshot_slots=2, padding_row=True)
    assert pool.padding_row == 4 and pool.conv.shape[0] == pool.recurrent.shape[0] == 5
    handed = [pool.alloc_snapshot() for _ in range(3)]
    assert handed == [2, 3, None]  # every snapshot slot, never the padding row
    with pytest.raises(RuntimeError, match="freed twice or not a snapshot slot"):
        pool.free_snapshot(4)
    with pytest.raises(RuntimeError, match="padding row"):
        pool.queue_copy(4, 0)
    with pytest.raises(RuntimeError, match="padding row"):
        pool.queue_copy(2, 4)
    slots = torch.tensor([1, 0, 4])
    states = pool.graph_states(slots)
    assert len(states) == 3 and states.slots is slots and states.pool is pool
    with pytest.raises(RuntimeError, match="padding row"):
        GDNStatePool(shape, rows=2, snapshot_slots=2).graph_states(slots)


_PADDED_CHECK = """
import sys, torch
from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerConfig
from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner
from sglang.srt.model_executor.static_batch import StaticBatchRunner, StaticSeq
runner = ModelRunner(ModelRunnerConfig(model_path=sys.argv[1], dtype="float32", max_total_tokens=512,
                                       max_running_requests=3, context_length=256, attention_backend="triton",
                                       cuda_graph=True))
pool = runner.state_pool
assert runner.cuda_graph_runner is None and pool.padding_row == 6, pool.padding_row  # CPU: nothing captured
sb = StaticBatchRunner(runner)
seqs = [StaticSeq([11 + i, 12, 13 + 2 * i, 14, 15][: 3 + i]) for i in range(3)]
logits, _ = sb.extend(seqs)
assert sorted(s.req_pool_idx for s in seqs) == [0, 1, 2]  # row 0 is a real request's, as on the KV side
graphs = CudaGraphRunner(runner, [4], capture=False)  # 3 requests padded to 4: one padding request
tokens = logits.argmax(-1).tolist()
real = [r for r in range(pool.conv.shape[0]) if r != pool.padding_row]
for step in range(2):
    fb = sb.decode_batch(seqs, tokens)
    before = (pool.conv.clone(), pool.recurrent.clone())
    runner.cuda_graph_runner = None
    want = runner.forward(fb).next_token_logits.clone()
    want_conv, want_rec = pool.conv.clone(), pool.recurrent.clone()
    pool.conv.copy_(before[0])
    pool.recurrent.copy_(before[1])
    runner.cuda_graph_runner = graphs
    assert graphs.can_run(fb)
    got = runner.forward(fb).next_token_logits
    assert got.shape == want.shape, (got.shape, want.shape)
    # float32; the padded GEMMs and the attention's split count (the context length as its hint) may round
    # differently from the unpadded step's, as the GDN backend test allows
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pool.conv[real], want_conv[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool.recurrent[real], want_rec[real], rtol=1e-5, atol=1e-5)
    assert torch.equal(graphs.gdn_slots, torch.tensor([s.req_pool_idx for s in seqs] + [pool.padding_row]))
    changed = not torch.equal(pool.recurrent[pool.padding_row], before[1][pool.padding_row])
    print("step", step, "padding row written", changed, "max diff", (got - want).abs().max().item())
    assert changed  # the padding request really ran, into the padding row
    tokens = want.argmax(-1).tolist()
print("OK")
"""


def test_padded_static_decode_equals_unpadded_decode(path):
    """Exactly the forward the graph captures (static buffers, the padding request's KV to slot 0 and its
    state to the padding row), eager with SGLANG_GDN_BACKEND=triton and triton attention, both interpreted;
    two steps of three requests (one on request-table row 0) padded to four against the unpadded step."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "SGLANG_GDN_BACKEND": "triton"}
    res = subprocess.run([sys.executable, "-c", _PADDED_CHECK, path], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    assert res.stdout.count("padding row written True") == 2 and res.stdout.rstrip().endswith("OK"), res.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_captured_hybrid_decode_equals_eager(path, monkeypatch, dtype):
    """Qwen3.5 decode through captured graphs (the GDN kernels' slots a graph input) against eager: the same
    greedy tokens and the same final state of every request, for captured, padded and too-large batches."""
    from sglang.srt.model_executor.static_batch import StaticBatchRunner, StaticSeq

    monkeypatch.setenv("SGLANG_GDN_BACKEND", "triton")

    def make(graph: bool):
        return StaticBatchRunner(ModelRunner(ModelRunnerConfig(
            model_path=path, dtype=dtype, device="cuda", max_total_tokens=8192, max_running_requests=24,
            attention_backend="triton", attention_fp32_precision="ieee", cuda_graph=graph,
            cuda_graph_bs=(1, 4, 8, 16))))

    eager, graphed = make(False), make(True)
    graphs = graphed.runner.cuda_graph_runner
    assert graphs is not None and eager.runner.cuda_graph_runner is None
    replays = []
    replay = graphs.replay
    monkeypatch.setattr(graphs, "replay", lambda fb: replays.append(fb.batch_size) or replay(fb))
    for bs in (1, 3, 8, 13, 20):  # captured, padded, and above the largest size (eager fallback)
        prompts = [[11 + i, 12, 13 + 2 * i, 14, 15][: 2 + i % 4] for i in range(bs)]
        outs, states = [], []
        for sb in (eager, graphed):
            seqs = [StaticSeq(list(p)) for p in prompts]
            pool = sb.runner.state_pool
            try:
                outs.append(sb.generate_greedy(seqs, 12))
                states.append([(pool.conv[s.req_pool_idx].float().clone(), pool.recurrent[s.req_pool_idx].clone())
                               for s in seqs])
            finally:
                sb.release(seqs)
        if dtype == "float32":
            assert outs[0] == outs[1], bs
            for (cw, rw), (cg, rg) in zip(*states):
                torch.testing.assert_close(cg, cw, rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(rg, rw, rtol=1e-4, atol=1e-4)
        else:  # bf16: padding changes GEMM shapes, so near-tied logits may flip; most tokens must agree
            flat = [(a, b) for x, y in zip(*outs) for a, b in zip(x, y)]
            assert sum(a == b for a, b in flat) >= 0.9 * len(flat), (bs, outs)
    assert replays and max(replays) <= 16 and 3 in replays  # the graphs ran, padded sizes included
    pool = graphed.runner.state_pool
    assert pool.available_snapshots() == pool.snapshot_slots  # nothing leaked
