"""A server on an FP8 replica (make_model --quantize fp8, the layout of Qwen's -FP8 releases): image chats
through the openai client, greedy tokens of TP 2 equal to TP 1, --quantization fp8 on a float checkpoint,
and checkpoints it cannot serve refused at start-up in one line."""

from __future__ import annotations

import json
import shutil
import signal

import pytest
import requests

from conftest import CASES, ServerProcess, build_case, data_url, png_bytes

from sglang.testing.make_model import make_model

MAX_NEW = 8


@pytest.fixture(scope="module")
def fp8_model(tmp_path_factory):
    return make_model("qwen3-vl-tiny", tmp_path_factory.mktemp("fp8") / "model", seed=0, progress=False, quantize="fp8")


def _serve(model_dir, tmp_path, *args) -> ServerProcess:
    return ServerProcess(model_dir, tmp_path, list(args)).wait_healthy()


def _greedy(url: str, case: str, hf_ref) -> list[int]:
    _, tmpl, images = build_case(CASES[case])
    r = requests.post(url + "/generate", timeout=120, json={
        "text": hf_ref.render(tmpl), "image_data": [data_url(png_bytes(img)) for img in images],
        "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def test_fp8_replica_serves_image_chats_and_tp2_answers_like_tp1(fp8_model, hf_ref, tmp_path):
    import openai

    one = _serve(fp8_model, tmp_path / "tp1")
    two = _serve(fp8_model, tmp_path / "tp2", "--tp-size", "2")
    try:
        client = openai.OpenAI(base_url=one.url + "/v1", api_key="none", max_retries=0, timeout=60)
        messages, _, _ = build_case(CASES["three_images_mixed_sizes"])
        out = client.chat.completions.create(model="default", messages=messages, max_tokens=MAX_NEW, temperature=0)
        assert out.choices[0].finish_reason in ("length", "stop") and out.usage.completion_tokens >= 1
        for case in ("text_only", "three_images_mixed_sizes"):
            assert _greedy(one.url, case, hf_ref) == _greedy(two.url, case, hf_ref), case
    finally:
        one.close()
        two.close()


def test_quantization_flag_serves_a_float_checkpoint(model_dir, hf_ref, tmp_path):
    server = _serve(model_dir, tmp_path, "--quantization", "fp8", "--log-level", "info")
    try:
        assert len(_greedy(server.url, "one_image", hf_ref)) == MAX_NEW
        assert "fp8 (quantized at load" in server.log_path.read_text()
    finally:
        server.close(signal.SIGTERM)


def test_checkpoints_it_cannot_serve_are_refused_at_start_up(fp8_model, tmp_path):
    awq = tmp_path / "awq"
    shutil.copytree(fp8_model, awq)
    cfg = json.loads((awq / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (awq / "config.json").write_text(json.dumps(cfg))
    server = ServerProcess(awq, tmp_path / "run", [])
    code = server.proc.wait(120)
    assert code != 0 and "AWQ int4 (quant_method 'awq'), which this engine does not load" in server.log_tail()


def test_an_fp8_kv_cache_serves_and_says_what_it_holds(model_dir, hf_ref, tmp_path):
    scales = tmp_path / "kv_scales.json"
    scales.write_text(json.dumps({"kv_cache": {"scaling_factor": {"0": {"0": 0.5, "1": 0.5}}}}))
    server = _serve(model_dir, tmp_path, "--kv-cache-dtype", "fp8_e4m3", "--quantization-param-path", str(scales),
                    "--log-level", "info")
    try:
        assert len(_greedy(server.url, "one_image", hf_ref)) == MAX_NEW
        log = server.log_path.read_text()
        assert "KV cache in float8_e4m3fn" in log and "scales for 2 layers" in log, log[-2000:]
        # what the pool attention reads actually holds, not what the flag asked for
        paths = requests.get(server.url + "/get_server_info", timeout=60).json()["paths"]
        assert paths["kv_cache"] == {"dtype": "float8_e4m3fn", "layers_with_scales": 2, "scale_range": [0.5, 0.5]}
    finally:
        server.close(signal.SIGTERM)
