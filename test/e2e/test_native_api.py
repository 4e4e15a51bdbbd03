"""Native endpoints of the launched server: /generate (text, input_ids, images, batch, SSE), /health,
/v1/models, /get_model_info, /get_server_info, /flush_cache."""

from __future__ import annotations

import json
import uuid

import pytest
import requests

from conftest import CASES, build_case, data_url, png_bytes

MAX_NEW = 12


def generate(server, **body):
    r = requests.post(server.url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("case", ["text_only", "three_images_mixed_sizes", "image_before_text"])
def test_generate_output_ids_match_transformers(server, hf_ref, case):
    _, tmpl, images = build_case(CASES[case])
    out = generate(
        server,
        text=hf_ref.render(tmpl),
        image_data=[data_url(png_bytes(img)) for img in images],
        sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0},
    )
    ref = hf_ref.greedy(case, tmpl, images, MAX_NEW)
    assert out["output_ids"] == ref
    assert out["text"] == hf_ref.tokenizer.decode(ref, skip_special_tokens=True)
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == len(hf_ref.prompt(tmpl, images)[0])
    assert meta["completion_tokens"] == len(ref)
    assert meta["finish_reason"]["type"] in ("stop", "length")
    assert meta["e2e_latency"] > 0 and "cached_tokens" in meta and meta["id"]


def test_generate_input_ids_and_single_image_string(server, hf_ref):
    _, tmpl, images = build_case(CASES["one_image"])
    ids = hf_ref.tokenizer.encode(hf_ref.render(tmpl), add_special_tokens=False)
    out = generate(server, input_ids=ids, image_data=data_url(png_bytes(images[0])),
                   sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0})
    assert out["output_ids"] == hf_ref.greedy("one_image", tmpl, images, MAX_NEW)


def _prompt_logprobs(server, text, images, start, top_n=0):
    out = generate(server, text=text, image_data=[data_url(png_bytes(img)) for img in images],
                   return_logprob=True, logprob_start_len=start, top_logprobs_num=top_n,
                   sampling_params={"max_new_tokens": 1, "temperature": 0})
    return out["meta_info"]


@pytest.mark.parametrize("case", ["text_only", "three_images_mixed_sizes"])
def test_prompt_logprobs_match_transformers_with_and_without_prefix_cache(server, hf_ref, case):
    _, tmpl, images = build_case(CASES[case])
    ids, ref, ref_top = hf_ref.prompt_logprobs(tmpl, images, top_n=2)
    text = hf_ref.render(tmpl)
    for _ in range(2):  # the second run finds the whole prompt cached, yet must score every token again
        meta = _prompt_logprobs(server, text, images, start=0, top_n=2)
        got = meta["input_token_logprobs"]
        assert [t[1] for t in got] == ids and got[0][0] is None
        assert all(abs(g[0] - r) < 1e-4 for g, r in zip(got[1:], ref)), max(abs(g[0] - r) for g, r in zip(got[1:], ref))
        tops = meta["input_top_logprobs"]
        assert tops[0] is None and [[a[1] for a in alts] for alts in tops[1:]] == [[i for _, i in alts] for alts in ref_top]
        assert meta["cached_tokens"] == 0
    tail = _prompt_logprobs(server, text, images, start=len(ids) - 3)
    assert [t[1] for t in tail["input_token_logprobs"]] == ids[-3:]
    assert all(abs(g[0] - r) < 1e-4 for g, r in zip(tail["input_token_logprobs"], ref[-3:]))
    assert tail["cached_tokens"] == len(ids) - 4  # the cache serves all but what must be scored
    assert "input_top_logprobs" not in tail and "input_token_logprobs" not in _prompt_logprobs(server, text, images, start=-1)


def test_prompt_logprobs_across_prefill_chunks(launch_server, hf_ref):
    _, tmpl, images = build_case(CASES["one_image"])
    ids, ref, _ = hf_ref.prompt_logprobs(tmpl, images)
    chunked = launch_server("--chunked-prefill-size", "16")
    assert len(ids) > 3 * 16
    got = _prompt_logprobs(chunked, hf_ref.render(tmpl), images, start=5)["input_token_logprobs"]
    assert [t[1] for t in got] == ids[5:]
    assert all(abs(g[0] - r) < 1e-4 for g, r in zip(got, ref[4:]))
    chunked.close()


def test_generate_batch_matches_single(server):
    params = {"max_new_tokens": 6, "temperature": 0}
    prompts = ["The sky is", "Once upon a time"]
    batch = generate(server, text=prompts, sampling_params=params)
    assert isinstance(batch, list) and len(batch) == 2
    for prompt, out in zip(prompts, batch):
        assert out["output_ids"] == generate(server, text=prompt, sampling_params=params)["output_ids"]


def test_generate_stream_is_cumulative_and_ends_with_done(server):
    body = {"text": "Stream " + uuid.uuid4().hex, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    full = generate(server, **body)
    with requests.post(server.url + "/generate", json={**body, "stream": True}, stream=True, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in r.iter_lines() if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert chunks[-1]["text"] == full["text"] and chunks[-1]["output_ids"] == full["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == full["meta_info"]["finish_reason"]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


def test_info_endpoints(server, model_dir):
    assert requests.get(server.url + "/health", timeout=10).json() == {"status": "ok"}
    models = requests.get(server.url + "/v1/models", timeout=10).json()
    assert models["object"] == "list" and models["data"][0]["max_model_len"] == 4096
    info = requests.get(server.url + "/get_model_info", timeout=10).json()
    assert info["model_path"] == str(model_dir) and info["is_generation"] is True and info["is_multimodal"] is True
    server_info = requests.get(server.url + "/get_server_info", timeout=10).json()
    assert server_info["limit_mm_per_prompt"] == 4 and server_info["port"] == server.port
    for key in ("max_total_num_tokens", "available_kv_tokens", "num_running_reqs", "num_waiting_reqs"):
        assert isinstance(server_info[key], int), key


def test_flush_cache_get_and_post(server):
    prompt = "Cache me " + uuid.uuid4().hex
    params = {"max_new_tokens": 1, "temperature": 0}
    generate(server, text=prompt, sampling_params=params)
    assert generate(server, text=prompt, sampling_params=params)["meta_info"]["cached_tokens"] > 0
    for method in ("get", "post"):
        r = requests.request(method, server.url + "/flush_cache", timeout=30)
        assert r.status_code == 200 and r.json()["success"] is True
    assert generate(server, text=prompt, sampling_params=params)["meta_info"]["cached_tokens"] == 0
