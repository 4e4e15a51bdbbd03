"""Custom logit processors through the server, as upstream's test_srt_endpoint sends them: a processor
that forces a token gives that token (greedy and sampled, /generate and the OpenAI routes), a batch mixes
requests with and without one, a malformed processor is a 400 and the server keeps serving, and a server
without --enable-custom-logit-processor refuses the field."""

from __future__ import annotations

import pytest
import requests

from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

# what a client script defines in its __main__ (dill then pickles the class by value)
_FORCE = """
class DeterministicLogitProcessor(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list):
        assert logits.shape[0] == len(custom_param_list)
        for i, param_dict in enumerate(custom_param_list):
            logits[i, :] = -float("inf")
            logits[i, param_dict["token_id"]] = 0.0
        return logits
"""
TOKEN = 1000


def _processor() -> str:
    ns = {"__name__": "__main__", "CustomLogitProcessor": CustomLogitProcessor}
    exec(_FORCE, ns)
    return ns["DeterministicLogitProcessor"]().to_str()


@pytest.fixture(scope="module")
def clp_server(launch_server):
    s = launch_server("--enable-custom-logit-processor")
    yield s
    s.close()


def _generate(url: str, **body) -> requests.Response:
    body.setdefault("text", "Question: Is Paris the Capital of France? Answer:")
    return requests.post(url + "/generate", json=body, timeout=300)


def _tokens(out: dict) -> list[int]:
    return [t[1] for t in out["meta_info"]["output_token_logprobs"]]


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 1.0, "top_p": 0.9}])
def test_a_forcing_processor_gives_its_token(clp_server, sampling):
    r = _generate(clp_server.url, custom_logit_processor=_processor(), return_logprob=True,
                  sampling_params={**sampling, "max_new_tokens": 8, "custom_params": {"token_id": TOKEN}})
    assert r.status_code == 200, r.text
    assert _tokens(r.json()) == [TOKEN] * 8


def test_a_batch_mixes_requests_with_and_without_a_processor(clp_server):
    url = clp_server.url
    params = {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}
    plain = _generate(url, text="Hello there", return_logprob=True, sampling_params=params).json()
    batch = _generate(url, text=["Hello there", "Hello there"], return_logprob=True,
                      custom_logit_processor=[_processor(), None],
                      sampling_params=[{**params, "custom_params": {"token_id": TOKEN}}, params])
    assert batch.status_code == 200, batch.text
    forced, untouched = batch.json()
    assert _tokens(forced) == [TOKEN] * 6
    assert _tokens(untouched) == _tokens(plain)
    # the OpenAI completions route takes the same fields at the top level (upstream's protocol)
    c = requests.post(url + "/v1/completions", timeout=300, json={
        "prompt": "Hello there", "max_tokens": 6, "temperature": 0, "custom_logit_processor": _processor(),
        "custom_params": {"token_id": TOKEN}})
    assert c.status_code == 200, c.text
    assert c.json()["choices"][0]["text"] == forced["text"]


def test_a_malformed_processor_is_a_400_and_the_server_keeps_serving(clp_server):
    for bad in ("not json", '{"callable": "8004deadbeef"}', '{"callable": "zz"}'):
        r = _generate(clp_server.url, custom_logit_processor=bad, sampling_params={"max_new_tokens": 2})
        assert r.status_code == 400, r.text
        assert "custom_logit_processor" in r.text
    chat = requests.post(clp_server.url + "/v1/chat/completions", timeout=300, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "custom_logit_processor": "{"})
    assert chat.status_code == 400 and "invalid custom_logit_processor" in chat.text
    ok = _generate(clp_server.url, sampling_params={"max_new_tokens": 2})
    assert ok.status_code == 200, ok.text
    assert requests.get(clp_server.url + "/health", timeout=30).status_code == 200


def test_without_the_flag_the_field_is_refused(server):
    r = _generate(server.url, custom_logit_processor=_processor(),
                  sampling_params={"max_new_tokens": 2, "custom_params": {"token_id": TOKEN}})
    assert r.status_code == 400
    assert "--enable-custom-logit-processor" in r.text
