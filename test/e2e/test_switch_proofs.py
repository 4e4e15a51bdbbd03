"""Switches proven at the level a user sees: each test fails when its feature is silently ignored while the
switch still says "on" (the mutants of issue 47 survived every test on a018ab2). They read the counters
/get_server_info reports under "paths" (docs/observability.md), which come from the objects that do the
work, never from the flags."""

from __future__ import annotations

import pytest
import requests

from conftest import CASES, build_case, data_url, png_bytes

MAX_NEW = 6


def _info(server) -> dict:
    return requests.get(server.url + "/get_server_info", timeout=60).json()


def _generate(server, text: str, images, max_new: int = MAX_NEW) -> list[int]:
    r = requests.post(server.url + "/generate", timeout=180, json={
        "text": text, "image_data": [data_url(png_bytes(i)) for i in images],
        "sampling_params": {"max_new_tokens": max_new, "temperature": 0}})
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def test_the_vit_graph_runner_runs_when_its_switch_is_on(launch_server, hf_ref):
    """SGLANG_VIT_ENABLE_CUDA_GRAPH on CPU: the padded bucket path runs (replays move) and the tokens are
    transformers'. A runner attached but bypassed keeps its counters at zero."""
    server = launch_server(env={"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1", "SGLANG_VIT_CUDA_GRAPH_BUCKETS": "64,256,1024"})
    try:
        before = _info(server)["paths"]["vit_graph"]
        assert before is not None and before["replays"] == 0 and not before["captured"]
        _, tmpl, images = build_case(CASES["one_image"])
        assert _generate(server, hf_ref.render(tmpl), images) == hf_ref.greedy("one_image", tmpl, images, MAX_NEW)
        after = _info(server)["paths"]["vit_graph"]
        assert after["replays"] >= 1 and sum(after["by_bucket"].values()) == after["replays"], after
    finally:
        server.close()


def test_a_plain_server_reports_its_paths(launch_server):
    """The same counters on a server with every switch at its default: no ViT runner, no MoE, the KV cache
    in the model's dtype, no grammar compiled yet."""
    server = launch_server()
    try:
        info = _info(server)
        paths = info["paths"]
        assert paths["vit_graph"] is None and paths["moe"] is None and paths["grammar_compiles"] == {}
        assert paths["kv_cache"] == {"dtype": "float32", "layers_with_scales": 0, "scale_range": [1.0, 1.0]}
        assert info["tp_rank_paths"] == [{k: paths[k] for k in ("vit_graph", "moe", "kv_cache")}]
        r = requests.post(server.url + "/generate", timeout=120, json={
            "text": "Code:", "sampling_params": {"max_new_tokens": 4, "temperature": 0, "regex": "[0-9]{4}"}})
        assert r.status_code == 200, r.text
        assert _info(server)["paths"]["grammar_compiles"] == {"xgrammar": 1}
    finally:
        server.close()


def test_an_image_chat_after_a_weight_update_is_the_new_models(launch_server, tmp_path_factory):
    """The per-image embedding cache is dropped with the old weights: after an update to other weights, the
    same image answers as a fresh server on the new weights (an update keeping the old embeddings answers as
    the old model for every image it had seen)."""
    from sglang.testing.make_model import make_model

    new_dir = make_model("qwen3-vl-tiny", tmp_path_factory.mktemp("seed7") / "model", seed=7, progress=False)
    _, _, images = build_case(CASES["one_image"])
    text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe.<|im_end|>\n<|im_start|>assistant\n"
    server = launch_server()
    try:
        old = _generate(server, text, images)
        assert _info(server)["mm_embedding_cache_bytes"] > 0  # the image's embeddings are cached
        r = requests.post(server.url + "/update_weights_from_disk", json={"model_path": str(new_dir)}, timeout=300)
        assert r.status_code == 200 and r.json()["success"], r.text
        after = _generate(server, text, images)
    finally:
        server.close()
    fresh = launch_server(model=new_dir)
    try:
        want = _generate(fresh, text, images)
    finally:
        fresh.close()
    assert after == want and after != old, (old, after, want)


@pytest.mark.slow
def test_expert_parallelism_through_the_server(launch_server, tiny_model_dir):
    """--tp-size 2 --ep-size 2 on the tiny MoE model: each rank holds only its half of the experts (read from
    its fused-MoE layers) and the tokens equal one rank's. With --ep-size not reaching the TP group (as a
    mutant of a018ab2 showed), every rank would hold all 8 experts and this fails."""
    moe = tiny_model_dir("qwen3-vl-moe-tiny")
    _, _, images = build_case(CASES["one_image"])
    text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe.<|im_end|>\n<|im_start|>assistant\n"
    one = launch_server(model=moe)
    try:
        want = _generate(one, text, images)
        assert _info(one)["paths"]["moe"]["local_experts"] == [0, 8]
    finally:
        one.close()
    ep = launch_server("--tp-size", "2", "--ep-size", "2", model=moe)
    try:
        assert _generate(ep, text, images) == want
        ranks = [p["moe"] for p in _info(ep)["tp_rank_paths"]]
        assert [r["local_experts"] for r in ranks] == [[0, 4], [4, 8]] and all(r["ep_size"] == 2 for r in ranks)
    finally:
        ep.close()
