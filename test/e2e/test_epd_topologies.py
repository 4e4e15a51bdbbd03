"""EPD with the language side scaled out (slow: six server processes on a small machine): a language server at
--tp-size 2 (gloo; rank 0 receives the embeddings and the TP broadcast carries them to rank 1), one at
--dp-size 2 (the data-parallel controller routes each request's embeddings to the replica it picked, also
when they arrive first), both through zmq_to_scheduler and zmq_to_tokenizer, and sglang-router in front of
the two (the router only sees language servers); and Qwen2.5-VL (windowed tower, no deepstack rows) through
an encoder, and the offline sglang.Engine as a language server. Greedy output equals transformers' everywhere."""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import data_url, noise_image, png_bytes

pytestmark = pytest.mark.slow

MAX_NEW = 6


@pytest.fixture(scope="module")
def topo(launch_server):
    enc = [launch_server("--encoder-only"), launch_server("--encoder-only")]
    urls = [e.url for e in enc]
    tp2 = launch_server("--language-only", "--encoder-urls", *urls, "--tp-size", "2")
    dp2 = launch_server("--language-only", "--encoder-urls", *urls, "--dp-size", "2",
                        "--load-balance-method", "round_robin")
    tp2_tok = launch_server("--language-only", "--encoder-urls", *urls, "--tp-size", "2",
                            "--encoder-transfer-backend", "zmq_to_tokenizer")
    return {"enc": enc, "tp2": tp2, "dp2": dp2, "tp2_tok": tp2_tok}


def _ask(url: str, hf_ref, seeds: list[int]):
    images = [noise_image(64 + 16 * (s % 3), 96, s) for s in seeds]
    tmpl = [{"role": "user", "content": [*({"type": "image"} for _ in images), {"type": "text", "text": "Compare."}]}]
    r = requests.post(url + "/generate", timeout=180, json={
        "text": hf_ref.render(tmpl), "image_data": [data_url(png_bytes(i)) for i in images],
        "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0}})
    assert r.status_code == 200, r.text
    ref = hf_ref.greedy(f"epd-topo-{seeds}", tmpl, images, MAX_NEW)
    return r.json(), ref


def test_every_listener_of_the_scaled_out_topologies_stays_on_loopback(topo):
    from sglang.srt.utils.process_tree import listening_tcp

    for name, server in [("enc", topo["enc"][0]), ("tp2", topo["tp2"]), ("dp2", topo["dp2"]),
                         ("tp2_tok", topo["tp2_tok"])]:
        found = listening_tcp(server.proc.pid)
        assert ("127.0.0.1", server.port) in found, (name, found)
        assert not {(a, p) for a, p in found if a != "127.0.0.1"}, name


@pytest.mark.parametrize("name", ["tp2", "tp2_tok"])
def test_tp2_language_server_equals_transformers(topo, hf_ref, name):
    for seeds in ([1], [2, 3, 4]):
        out, ref = _ask(topo[name].url, hf_ref, seeds)
        assert out["output_ids"] == ref, (name, seeds)


def test_dp2_routes_embeddings_to_each_requests_replica(topo, hf_ref):
    seeds = [[10 + i, 20 + i] for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda s: _ask(topo["dp2"].url, hf_ref, s), seeds))
    assert all(out["output_ids"] == ref for out, ref in results)
    assert {out["meta_info"]["dp_rank"] for out, _ in results} == {0, 1}


@pytest.mark.skipif(importlib.util.find_spec("sglang_router") is None, reason="sglang-router is not installed")
def test_router_in_front_of_language_servers(topo, hf_ref, tmp_path):
    from test_router import RouterProcess

    workers = [topo["tp2"].url, topo["dp2"].url]
    router = RouterProcess(workers, "round_robin", tmp_path / "router.log").wait_ready(workers)
    try:
        for i in range(4):
            out, ref = _ask(router.url, hf_ref, [40 + i])
            assert out["output_ids"] == ref
        text = requests.post(router.url + "/generate", timeout=60, json={
            "text": "plain text", "sampling_params": {"max_new_tokens": 2}})
        assert text.status_code == 200
    finally:
        router.close()


def test_qwen25_vl_through_an_encoder_equals_transformers(tiny_model_dir, tmp_path_factory):
    """The other family (windowed ViT, no deepstack rows) through one encoder, both backends."""
    from conftest import HFReference, ServerProcess

    path = tiny_model_dir("qwen2.5-vl-tiny")
    started = []

    def launch(*args):
        s = ServerProcess(path, tmp_path_factory.mktemp("epd-q25"), list(args))
        started.append(s)
        return s.wait_healthy()

    try:
        enc = launch("--encoder-only")
        langs = [launch("--language-only", "--encoder-urls", enc.url, "--encoder-transfer-backend", b)
                 for b in ("zmq_to_scheduler", "zmq_to_tokenizer")]
        hf = HFReference(path)
        for lang in langs:
            for seeds in ([5], [6, 7]):
                out, ref = _ask(lang.url, hf, seeds)
                assert out["output_ids"] == ref, seeds
    finally:
        for s in started:
            s.close()


def test_offline_engine_as_a_language_server(topo, hf_ref, model_dir):
    """sglang.Engine(language_only=True, encoder_urls=...) sends its images to the encoders like the server."""
    import sglang
    from conftest import CASES, TEST_DEVICE, build_case

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        engine = sglang.Engine(model_path=str(model_dir), dtype="float32", device=TEST_DEVICE, log_level="warning",
                               max_total_tokens=2048, language_only=True,
                               encoder_urls=tuple(e.url for e in topo["enc"]))
    try:
        _, tmpl, images = build_case(CASES["three_images_mixed_sizes"])
        out = engine.generate(messages=tmpl, image_data=images,
                              sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0})
        assert out["output_ids"] == hf_ref.greedy("three_images_mixed_sizes", tmpl, images, MAX_NEW)
    finally:
        engine.shutdown()
