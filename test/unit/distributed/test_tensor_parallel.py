"""TP=2 over gloo on CPU (Qwen3-VL, Qwen3-VL-MoE, Qwen2.5-VL; Qwen3.5 with --mm-enable-dp-encoder): same
greedy tokens as TP=1 (float32), each rank holding 1/2 of the sharded weights, for text and multi-image
prompts, with and without chunked prefill."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent.parent / "managers"))
sys.path.insert(0, str(Path(__file__).parent.parent / "models"))  # qwen3_5_driver: the Qwen3.5 test inputs
from scheduler_utils import InProcessScheduler  # noqa: E402
from tp_worker_main import gate_up_rows, run_rank  # noqa: E402

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput  # noqa: E402
from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor
from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor  # noqa: E402
from sglang.srt.multimodal.transport.shm import SHM_DIR, mm_items_to_shm, segment_prefix  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.utils.network import pick_unused_port  # noqa: E402

PLACEHOLDER = [151652, 151655, 151653]


def _noise(w, h, seed):
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def _text(n, seed):
    return torch.randint(0, 1500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _processor(patch: int, preset: str = ""):
    """(processor, image placeholder ids) of the preset's family, with tight pixel limits."""
    if preset.startswith("qwen3.5"):  # Qwen3-VL's placement rules with Qwen3.5's special ids
        from qwen3_5_driver import PLACEHOLDER as QWEN3_5_PLACEHOLDER, tiny_processor

        return tiny_processor(), QWEN3_5_PLACEHOLDER
    factor = patch * 2
    return QwenVLProcessor(None, QwenVLImageProcessor(patch_size=patch, min_pixels=4 * factor**2,
                                                      max_pixels=48 * factor**2)), PLACEHOLDER


def _requests(patch: int, preset: str = ""):
    proc, ph = _processor(patch, preset)
    prompts = [
        (_text(14, 1), None),
        proc.process(_text(4, 2) + ph + _text(3, 3) + ph + _text(5, 4), [_noise(96, 64, 1), _noise(40, 130, 2)]),
    ]
    return [
        TokenizedGenerateReqInput(f"q{i}", ids, SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True), mm)
        for i, (ids, mm) in enumerate(prompts)
    ]


def _run_tp(args_kw, requests, size=2):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = pick_unused_port()
    procs = [ctx.Process(target=run_rank, args=(r, size, port, args_kw, requests, q)) for r in range(size)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in range(size):
            rank, outputs, info = q.get(timeout=240)
            results[rank] = (outputs, info)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    return results


@pytest.mark.parametrize(
    "preset,patch,chunk,transport",
    [("qwen3-vl-tiny", 16, -1, "cpu"), ("qwen3-vl-tiny", 16, 7, "cpu"), ("qwen2.5-vl-tiny", 14, 9, "cpu"),
     ("qwen3-vl-tiny", 16, 7, "shm"), ("qwen3-vl-moe-tiny", 16, -1, "cpu"), ("qwen3-vl-moe-tiny", 16, 7, "cpu"),
     ("qwen3.5-tiny", 16, 7, "shm")],
    # MoE: each expert's intermediate dim split (gate_up column-, down row-parallel), the router replicated;
    # Qwen3.5: the DeltaNet heads and their states split, pixels through shared memory (SGLANG_MM_SHM_TRANSPORT)
    ids=["qwen3_vl", "qwen3_vl_chunked", "qwen2_5_vl_chunked", "qwen3_vl_shm", "qwen3_vl_moe", "qwen3_vl_moe_chunked",
         "qwen3_5_chunked_shm"],
)
def test_tp2_matches_tp1(tiny_model_dir, preset, patch, chunk, transport):
    path = str(tiny_model_dir(preset))
    kw = dict(model_path=path, dtype="float32", device="cpu", max_total_tokens=4096, chunked_prefill_size=chunk)
    requests = _requests(patch, preset)
    shm_names = []
    if transport == "shm":  # the ranks receive pointers; pixels stay in /dev/shm until mapped
        import copy

        tp_requests = copy.deepcopy(requests)
        for r in tp_requests:
            if r.mm_inputs is not None:
                shm_names += mm_items_to_shm(r.mm_inputs, segment_prefix(0))
    else:
        tp_requests = requests

    single = InProcessScheduler(path, max_total_tokens=4096, chunked_prefill_size=chunk)
    for r in requests:
        single.sched.process_input_requests([r])
        single.outputs[r.rid] = []
    single.run_until_idle()
    layers = single.sched.worker.model_runner.model.model.layers
    full, attn = layers[0], next(lay for lay in layers if hasattr(lay, "self_attn"))  # hybrid: a full-attention one

    results = _run_tp(dict(kw, tp_size=2), tp_requests)
    if shm_names:
        assert not [n for n in os.listdir(SHM_DIR) if n in set(shm_names)], "rank 0 unlinks every segment once mapped"
    outputs, _ = results[0]
    assert outputs == {r.rid: single.outputs[r.rid] for r in requests}
    for rank, (_, info) in results.items():
        assert info["gate_up_rows"] * 2 == gate_up_rows(full)
        assert info["qkv_rows"] * 2 == attn.self_attn.qkv_proj.weight.shape[0]
        vis = single.sched.worker.model_runner.model.visual.blocks[0].attn.qkv.weight.shape[0]
        assert info["vision_qkv_rows"] * 2 == vis
        assert info["embed_rows"] * 2 >= single.sched.worker.model_runner.model.model.embed_tokens.weight.shape[0]
        assert info["free_after"] == info["max_tokens"], "no KV leak on any rank"
    assert set(results[0][1]["broadcast_ms"]) == {r.rid for r in requests}
    assert all(ms > 0 for ms in results[0][1]["broadcast_ms"].values()), "rank 0 times each request's broadcast"


def test_tp2_overlapped_matches_step_by_step_tp1(tiny_model_dir, monkeypatch):
    """Both ranks overlap: each one's forward thread runs the model's all-reduces while its scheduler thread
    broadcasts the next requests on the object group; tokens equal a step-by-step single rank."""
    path = str(tiny_model_dir("qwen3-vl-tiny"))
    requests = _requests(16)
    single = InProcessScheduler(path, max_total_tokens=4096, chunked_prefill_size=7, disable_overlap_schedule=True)
    for r in requests:
        single.sched.process_input_requests([r])
        single.outputs[r.rid] = []
    single.run_until_idle()
    monkeypatch.setenv("SGLANG_OVERLAP_SCHEDULE_ON_CPU", "1")  # the spawned ranks inherit it
    results = _run_tp(dict(model_path=path, dtype="float32", device="cpu", max_total_tokens=4096,
                           chunked_prefill_size=7, tp_size=2), requests)
    assert all(info["overlap"] for _, info in results.values())
    assert results[0][0] == {r.rid: single.outputs[r.rid] for r in requests}
    assert all(info["free_after"] == info["max_tokens"] for _, info in results.values())


@pytest.mark.parametrize("preset,patch,chunk", [("qwen3-vl-tiny", 16, -1), ("qwen3-vl-tiny", 16, 7),
                                                ("qwen2.5-vl-tiny", 14, 9), ("qwen3.5-tiny", 16, 7)],
                         ids=["qwen3_vl", "qwen3_vl_chunked", "qwen2_5_vl_chunked", "qwen3_5_chunked"])
def test_tp2_dp_encoder_matches_tp1(tiny_model_dir, preset, patch, chunk):
    """--mm-enable-dp-encoder: whole vision tower on each rank, images split over the ranks; the same greedy
    tokens as TP=1 for text only, several images of different sizes and a one-image request, with and without
    chunked prefill (the per-image ViT cache on; on Qwen3.5 the DeltaNet heads and their states split over the
    ranks, snapshots at the images' ends). One image alone per call (a rank with nothing to encode):
    test_dp_encoder.py."""
    path = str(tiny_model_dir(preset))
    requests = _requests(patch, preset)
    proc, ph = _processor(patch, preset)
    ids, mm = proc.process(_text(5, 7) + ph + _text(4, 8), [_noise(64, 64, 3)])
    requests.append(TokenizedGenerateReqInput("q_one", ids, SamplingParams(max_new_tokens=6, temperature=0.0,
                                                                           ignore_eos=True), mm))
    single = InProcessScheduler(path, max_total_tokens=4096, chunked_prefill_size=chunk)
    for r in requests:
        single.sched.process_input_requests([r])
        single.outputs[r.rid] = []
        single.run_until_idle()  # one request at a time: the one-image request is an encode call of its own
    kw = dict(model_path=path, dtype="float32", device="cpu", max_total_tokens=4096, chunked_prefill_size=chunk,
              mm_enable_dp_encoder=True)
    results = _run_tp(dict(kw, tp_size=2), requests)
    assert results[0][0] == {r.rid: single.outputs[r.rid] for r in requests}
    vis = single.sched.worker.model_runner.model.visual.blocks[0].attn.qkv.weight.shape[0]
    for rank, (_, info) in results.items():
        assert info["vision_qkv_rows"] == vis, "the vision tower is whole on every rank"
        assert info["free_after"] == info["max_tokens"]
