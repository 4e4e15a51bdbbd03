"""--ep-size: Qwen3-VL-MoE's experts split over the TP ranks (gloo, CPU). TP=2 with EP=2 (each rank half
the experts, whole) equals TP=1 on qwen3-vl-moe-tiny: prompt logits within 1e-4 relative, equal greedy
tokens, for a text prompt and an image prompt (two spawned ranks, ~14 s here). The ids/weights bookkeeping of a rank's experts and the
start-up refusals are checked without spawning. Through the scheduler (ServerArgs --ep-size 2, chunked
prefill cutting the images): the same greedy tokens as TP=1."""

from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "models"))
from ep_worker_main import logits_and_greedy, run  # noqa: E402
from parity_utils import rel_err  # noqa: E402

from sglang.srt.distributed.parallel_state import TPInfo  # noqa: E402
from sglang.srt.utils.network import pick_unused_port  # noqa: E402


def _spawn(path: str, size: int, ep: int) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = pick_unused_port()
    procs = [ctx.Process(target=run, args=(r, size, ep, port, path, q)) for r in range(size)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in range(size):
            rank, status, payload = q.get(timeout=300)
            assert status == "ok", payload
            results[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return results


def test_tp2_ep2_equals_tp1(tiny_model_dir):
    from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerConfig

    path = str(tiny_model_dir("qwen3-vl-moe-tiny"))
    single = ModelRunner(ModelRunnerConfig(model_path=path, dtype="float32", device="cpu", max_total_tokens=2048,
                                           max_running_requests=4, context_length=1024))
    ref = logits_and_greedy(single, path)
    full = single.model.model.layers[0].mlp.experts
    results = _spawn(path, 2, 2)
    for rank, (info, outs) in results.items():
        e = full.num_experts
        assert info["gate_up"] == (e // 2, *full.gate_up_proj.shape[1:]), "half the experts, each whole"
        assert info["first_expert"] == rank * e // 2
        for name, (logits, tokens) in outs.items():
            assert rel_err(torch.from_numpy(logits), torch.from_numpy(ref[name][0])) <= 1e-4, (rank, name)
            assert tokens == ref[name][1], (rank, name)


def test_tp_info_places_expert_groups_as_upstream():
    # tp 4, ep 2: expert groups {0,1} and {2,3}; inside a group the intermediate dim is split over 2 ranks
    places = [(t.moe_ep_rank, t.moe_tp_rank, t.moe_tp_size) for t in (TPInfo(r, 4, ep_size=2) for r in range(4))]
    assert places == [(0, 0, 2), (0, 1, 2), (1, 0, 2), (1, 1, 2)]
    with pytest.raises(ValueError, match="ep size 3 must divide tp size 4"):
        TPInfo(0, 4, ep_size=3)


def test_ep_and_moe_tp_shards_sum_to_the_full_product():
    """tp 4 with ep 2 and tp 2 with ep 2: each rank's partial output (its experts, its intermediate slice,
    other ranks' experts as -1) adds up to the single-rank product, as the all-reduce makes it."""
    from sgl_kernel.moe import fused_experts_torch
    from sglang.srt.layers.moe import FusedMoE, select_experts

    e, h, i = 8, 20, 8
    g = torch.Generator().manual_seed(4)
    w13, w2 = torch.randn(e, 2 * i, h, generator=g) * 0.2, torch.randn(e, h, i, generator=g) * 0.2
    x = torch.randn(13, h, generator=g)
    weights, ids = select_experts(torch.randn(13, e, generator=g), 2, True)
    full = fused_experts_torch(x, w13, w2, weights, ids)
    for size, ep in ((2, 2), (4, 2), (4, 4)):
        parts = []
        for rank in range(size):
            m = FusedMoE(e, h, i, TPInfo(rank, size, ep_size=ep))
            m.gate_up_proj.weight_loader(m.gate_up_proj, w13)
            m.down_proj.weight_loader(m.down_proj, w2)
            assert m.gate_up_proj.shape == (e // ep, 2 * i * ep // size, h)
            local = m.local_ids(ids)
            assert ((local == -1) | ((local >= 0) & (local < e // ep))).all()
            parts.append(fused_experts_torch(x, m.gate_up_proj, m.down_proj, weights, local))
        torch.testing.assert_close(sum(parts), full, msg=f"tp {size} ep {ep}")
    with pytest.raises(ValueError, match="8 experts cannot be split over --ep-size 3"):
        FusedMoE(e, h, i, TPInfo(0, 3, ep_size=3))


@pytest.mark.slow  # 38 s here under load (a TP1 scheduler, then two spawned ranks through chunked prefill)
def test_scheduler_tp2_ep2_chunked_equals_tp1(tiny_model_dir):
    sys.path.insert(0, str(Path(__file__).parent.parent / "managers"))
    from scheduler_utils import InProcessScheduler
    from test_tensor_parallel import _requests, _run_tp

    path = str(tiny_model_dir("qwen3-vl-moe-tiny"))
    requests = _requests(16)
    single = InProcessScheduler(path, max_total_tokens=4096, chunked_prefill_size=7)
    for r in requests:
        single.sched.process_input_requests([r])
        single.outputs[r.rid] = []
    single.run_until_idle()
    kw = dict(model_path=path, dtype="float32", device="cpu", max_total_tokens=4096, chunked_prefill_size=7,
              tp_size=2, ep_size=2)
    results = _run_tp(kw, requests)
    assert results[0][0] == {r.rid: single.outputs[r.rid] for r in requests}
    full = single.sched.worker.model_runner.model.model.layers[0].mlp.experts
    assert all(info["gate_up_rows"] == full.gate_up_proj.shape[1] for _, info in results.values()), "experts whole"
