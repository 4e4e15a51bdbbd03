"""--skip-tokenizer-init and --stream-output through the launched server: input_ids in, output_ids out (the
transformers reference's greedy tokens, with and without an image), no `text` key, streamed chunks holding
only the new ids, and everything that needs the tokenizer refused with a 400 naming the flag (the openai
client included)."""

from __future__ import annotations

import json

import pytest
import requests

from conftest import CASES, build_case, data_url, png_bytes

MAX_NEW = 8
GREEDY = {"max_new_tokens": MAX_NEW, "temperature": 0}


@pytest.fixture(scope="module")
def ids_server(launch_server):
    server = launch_server("--skip-tokenizer-init", "--stream-output")
    yield server
    server.close()


def _sse(resp) -> list[dict]:
    lines = [ln[6:] for ln in resp.text.split("\n\n") if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


@pytest.mark.parametrize("case", ["text_only", "one_image"])
def test_ids_in_ids_out_match_transformers_streamed_or_not(ids_server, hf_ref, case):
    _, tmpl, images = build_case(CASES[case])
    ids = hf_ref.tokenizer.encode(hf_ref.render(tmpl), add_special_tokens=False)
    body = {"input_ids": ids, "sampling_params": GREEDY}
    if images:
        body["image_data"] = [data_url(png_bytes(img)) for img in images]
    r = requests.post(ids_server.url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    ref = hf_ref.greedy(case, tmpl, images, MAX_NEW)
    assert out["output_ids"] == ref and "text" not in out
    assert out["meta_info"]["completion_tokens"] == len(ref)
    r = requests.post(ids_server.url + "/generate", json={**body, "stream": True}, timeout=120)
    assert r.status_code == 200, r.text
    chunks = _sse(r)
    assert all("text" not in c for c in chunks)
    assert [t for c in chunks for t in c["output_ids"]] == ref  # --stream-output: each chunk only the new ids
    assert len(chunks) > 1 and chunks[-1]["meta_info"]["finish_reason"] is not None


@pytest.mark.parametrize("body, word", [
    ({"text": "hello"}, "cannot accept text prompts"),
    ({"input_ids": [1, 2], "sampling_params": {"stop": "x"}}, "stop needs the tokenizer"),
    ({"input_ids": [1, 2], "sampling_params": {"json_schema": "{}"}}, "json_schema needs the tokenizer"),
])
def test_what_needs_the_tokenizer_is_a_400_naming_the_flag(ids_server, body, word):
    r = requests.post(ids_server.url + "/generate", json=body, timeout=60)
    assert r.status_code == 400 and word in r.text and "--skip-tokenizer-init" in r.text, r.text


def test_openai_client_is_refused_naming_the_flag(ids_server):
    import openai

    client = openai.OpenAI(base_url=ids_server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError, match="--skip-tokenizer-init"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="--skip-tokenizer-init"):
        client.completions.create(model="m", prompt=[1, 2], max_tokens=2)


def test_health_generate_and_ready_work_without_the_tokenizer(ids_server):
    assert requests.get(ids_server.url + "/health_generate", timeout=60).status_code == 200
    assert requests.get(ids_server.url + "/ready", timeout=60).status_code == 200


def test_engine_ids_only_with_stream_output(model_dir, hf_ref):
    """The offline sglang.Engine with both flags (how verl and slime drive it): ids in, ids out, no text,
    streamed chunks holding only the new ids; a text prompt is refused naming the flag."""
    import sglang
    from conftest import TEST_DEVICE
    from sglang.srt.errors import GenerateError

    _, tmpl, images = build_case(CASES["text_only"])
    ids = hf_ref.tokenizer.encode(hf_ref.render(tmpl), add_special_tokens=False)
    ref = hf_ref.greedy("text_only", tmpl, images, MAX_NEW)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        engine = sglang.Engine(model_path=str(model_dir), dtype="float32", device=TEST_DEVICE, log_level="warning",
                               max_total_tokens=1024, skip_tokenizer_init=True, stream_output=True)
    try:
        out = engine.generate(input_ids=ids, sampling_params=GREEDY)
        assert out["output_ids"] == ref and "text" not in out
        chunks = list(engine.generate(input_ids=ids, sampling_params=GREEDY, stream=True))
        assert [t for c in chunks for t in c["output_ids"]] == ref and len(chunks) > 1
        with pytest.raises(GenerateError, match="--skip-tokenizer-init"):
            engine.generate("hello", sampling_params=GREEDY)
    finally:
        engine.shutdown()
