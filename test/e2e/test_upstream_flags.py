"""An upstream-style launch through the real server: --api-key guards the API (OpenAI-style 401,
the upstream routes too), /health stays open, --chat-template replaces the tokenizer's template, compatibility flags start."""

from __future__ import annotations

import requests


def test_api_key_chat_template_and_compat_flags(launch_server, tmp_path):
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}USER: {{ m['content'] }}\n{% endfor %}ASSISTANT:")
    s = launch_server("--api-key", "sk-test", "--chat-template", str(template), "--enable-multimodal",
                      "--trust-remote-code", "--skip-server-warmup", "--cuda-graph-max-bs", "8", "--log-level", "info")
    assert requests.get(s.url + "/health", timeout=10).status_code == 200
    body = {"model": "default", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
    r = requests.post(s.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", r.text
    r = requests.post(s.url + "/v1/chat/completions", json=body, timeout=60, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401
    for method, path in (("POST", "/v1/completions"), ("GET", "/health_generate"), ("POST", "/abort_request"),
                         ("GET", "/model_info"), ("GET", "/server_info"), ("GET", "/v1/models/default")):
        assert requests.request(method, s.url + path, json={}, timeout=10).status_code == 401, path
    auth = {"Authorization": "Bearer sk-test"}
    assert requests.get(s.url + "/health_generate", headers=auth, timeout=30).status_code == 200
    # the key is never echoed: not by the settings route, not in the log
    info = requests.get(s.url + "/get_server_info", headers=auth, timeout=10)
    assert info.status_code == 200 and info.json()["api_key"] == "<redacted>" and "sk-test" not in info.text
    import openai

    client = openai.OpenAI(base_url=s.url + "/v1", api_key="sk-test", max_retries=0, timeout=60)
    out = client.chat.completions.create(model="default", messages=body["messages"], max_tokens=2)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(s.model_dir)
    assert out.usage.prompt_tokens == len(tok.encode("USER: hello\nASSISTANT:", add_special_tokens=False))
    assert "no effect on CPU" in s.log_tail(20000)
    s.close()
    assert "sk-test" not in s.log_path.read_text(errors="replace")
