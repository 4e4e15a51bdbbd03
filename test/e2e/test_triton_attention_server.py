"""`--attention-backend triton --mm-attention-backend triton` through the server gives transformers'
greedy tokens: text, one image, several images of different sizes, with 16-token chunked prefill
(chunks cut through images) and a radix-cache hit, for tiny Qwen3-VL and Qwen2.5-VL in float32; and for tiny
Qwen3.5 (slow), with its Gated DeltaNet layers on sgl_kernel.gdn's kernels too (SGLANG_GDN_BACKEND=triton): the
full-attention layers at their head_dim with partial rotary, the DeltaNet states carried across chunks and
resumed from a snapshot on the radix hit.

On CPU the kernels run under the Triton interpreter (TRITON_INTERPRET=1 in the server's environment);
with SGLANG_TEST_DEVICE=cuda they run compiled on the GPU."""

from __future__ import annotations

import signal

import pytest

from conftest import CASES, HFReference, ServerProcess, TEST_DEVICE, build_case

pytest.importorskip("triton")
pytest.importorskip("sgl_kernel.attention")

MAX_NEW = 8
PARITY_CASES = ("text_only", "one_image", "three_images_mixed_sizes")


# Qwen2.5-VL's interpreted server (windowed tower: ~40 s on 2 cores) runs in the slow target; its kernels'
# cases stay in sgl-kernel/tests, its greedy parity on the torch backends in the default suite
@pytest.fixture(scope="module", params=["qwen3-vl-tiny", pytest.param("qwen2.5-vl-tiny", marks=pytest.mark.slow),
                                        pytest.param("qwen3.5-tiny", marks=pytest.mark.slow)])
def triton_server(request, tiny_model_dir, tmp_path_factory):
    model_dir = tiny_model_dir(request.param)
    env = {"TRITON_INTERPRET": "1"} if TEST_DEVICE == "cpu" else {}
    if request.param.startswith("qwen3.5"):
        env["SGLANG_GDN_BACKEND"] = "triton"  # the DeltaNet layers on their kernels as well (auto: torch on CPU)
    s = ServerProcess(model_dir, tmp_path_factory.mktemp("triton"),
                      ["--attention-backend", "triton", "--mm-attention-backend", "triton",
                       "--chunked-prefill-size", "16"], env=env)
    try:
        s.wait_healthy()
        yield s, HFReference(model_dir)
    finally:
        s.close(signal.SIGTERM)


# three images through the interpreted kernels take 25-28 s a model on 2 cores: the slow target runs them
@pytest.mark.parametrize("case", [c if c != "three_images_mixed_sizes" else pytest.param(c, marks=pytest.mark.slow)
                                  for c in PARITY_CASES])
def test_triton_backend_greedy_matches_transformers(triton_server, case):
    import openai

    server, ref = triton_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
    api_msgs, tmpl_msgs, images = build_case(CASES[case])
    ref_ids = ref.greedy(case, tmpl_msgs, images, MAX_NEW)
    expected = ref.tokenizer.decode(ref_ids, skip_special_tokens=True)
    for attempt in ("cold", "radix hit"):
        resp = client.chat.completions.create(model="default", messages=api_msgs, max_tokens=MAX_NEW, temperature=0)
        assert resp.choices[0].message.content == expected, attempt
        assert resp.usage.completion_tokens == len(ref_ids)
    assert resp.usage.prompt_tokens_details.cached_tokens > 0  # the second request ran from the cache


def test_server_reports_the_chosen_backends(triton_server):
    import requests

    server, _ = triton_server
    info = requests.get(server.url + "/get_server_info", timeout=10).json()
    assert info.get("attention_backend") == "triton" and info.get("mm_attention_backend") == "triton", info
