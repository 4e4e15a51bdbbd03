"""An upstream 0.5.23-style launch through the real server: its spellings start it (suffixed token counts,
aliases, 0.5.23's cuda-graph names, critical logging, payload bytes); a request's priority is honoured under
--schedule-policy priority; mm_processor_kwargs / images_config resize that request's images, and what
they cannot honour is a 400 naming it."""

from __future__ import annotations

import requests


def test_upstream_spellings_priority_and_per_request_image_settings(launch_server):
    """0.5.23's spellings start a server (suffixed counts, aliases, critical logging, payload bytes); a
    request's priority is honoured under --schedule-policy priority; mm_processor_kwargs / images_config
    resize that request's image (fewer prompt tokens) and anything they cannot honour is a 400 naming it."""
    import numpy as np
    from PIL import Image

    from conftest import data_url, png_bytes

    s = launch_server("--schedule-policy", "priority", "--tensor-parallel-size", "1", "--context-length", "4Ki",
                      "--max-prefill-tokens", "16k", "--cuda-graph-max-bs-decode", "8", "--max-payload-size", "8Mi",
                      "--mm-attention-backend", "sdpa", "--log-level", "CRITICAL")
    img = data_url(png_bytes(Image.fromarray(np.random.default_rng(0).integers(0, 256, (512, 512, 3), dtype=np.uint8))))

    def chat(**extra):
        body = {"model": "default", "max_tokens": 1, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": img}}, {"type": "text", "text": "what is it?"}]}], **extra}
        return requests.post(s.url + "/v1/chat/completions", json=body, timeout=120)

    full = chat(priority=3)
    assert full.status_code == 200, full.text
    small = chat(mm_processor_kwargs={"max_pixels": 128 * 128})
    assert small.status_code == 200, small.text
    full_tokens, small_tokens = full.json()["usage"]["prompt_tokens"], small.json()["usage"]["prompt_tokens"]
    assert small_tokens < full_tokens
    same = chat(images_config={"max_pixels": 128 * 128})
    assert same.status_code == 200 and same.json()["usage"]["prompt_tokens"] == small_tokens, same.text
    for extra, phrase in (({"images_config": {"image_mode": "gundam"}}, "images_config.image_mode is not supported"),
                          ({"mm_processor_kwargs": {"max_pixels": 10**12}}, "mm_processor_kwargs.max_pixels"),
                          ({"images_config": {}, "mm_processor_kwargs": {}}, "not both"),
                          ({"priority": "urgent"}, "priority")):
        r = chat(**extra)
        assert r.status_code == 400 and phrase in r.json()["error"]["message"], (extra, r.text)
    gen = {"text": "<|vision_start|><|image_pad|><|vision_end|> hi", "image_data": img, "priority": 7,
           "images_config": {"max_pixels": 128 * 128}, "sampling_params": {"max_new_tokens": 1}}
    r = requests.post(s.url + "/generate", json=gen, timeout=120)
    assert r.status_code == 200, r.text
    r = requests.post(s.url + "/generate", json={**gen, "priority": 1.5}, timeout=60)
    assert r.status_code == 400 and "priority must be an integer" in r.json()["error"]["message"], r.text
    s.close()
