"""shm-deferred-unwrap end to end at TP=2: outputs equal to the cpu transport, and after 200
requests (normal, streamed and aborted mid-stream, rejected, failing) no segment is left in /dev/shm
and the server still serves."""

from __future__ import annotations

import os

import pytest
import requests

from conftest import ServerProcess, data_url, noise_image, png_bytes, private_shm_prefix, wait_until
from transport_traffic import KINDS, run_mixed_traffic
from transport_traffic import two_image_body as _body


def _segments(port: int) -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"sglang_mm_{port}_")}


@pytest.fixture(scope="module")
def servers(launch_server):
    shm = launch_server("--tp-size", "2", "--mm-feature-transport", "cpu", "--chunked-prefill-size", "48")
    # the inline-pickle baseline: same transport flag, the series' switch off
    cpu = launch_server("--tp-size", "2", "--mm-feature-transport", "cpu", "--chunked-prefill-size", "48",
                        env={"SGLANG_MM_SHM_TRANSPORT": "0"})
    return shm, cpu


def test_outputs_equal_cpu_transport(servers):
    shm, cpu = servers
    for seed in range(3):
        a = requests.post(shm.url + "/generate", json=_body(seed, 8), timeout=60).json()
        b = requests.post(cpu.url + "/generate", json=_body(seed, 8), timeout=60).json()
        assert a["output_ids"] == b["output_ids"]


def test_no_segment_left_after_mixed_traffic(servers):
    shm, _ = servers
    kinds = run_mixed_traffic(shm.url, 200, 8)
    assert set(KINDS) <= set(kinds)
    # aborted requests may still be in flight for a moment: poll until the server is idle
    wait_until(lambda: requests.get(shm.url + "/get_server_info", timeout=10).json()["num_running_reqs"] == 0,
               60, what="server to go idle")
    assert _segments(shm.port) == set()
    r = requests.post(shm.url + "/generate", json=_body(999), timeout=60)
    assert r.status_code == 200
    assert "FileNotFoundError" not in shm.log_tail(200_000)


def test_full_dev_shm_falls_back_to_inline(model_dir, tmp_path, servers):
    """A container-sized /dev/shm (1 MB here; two 64x64 images are ~0.2 MB of float32 pixels each, a
    larger image does not fit): requests still succeed, with the same tokens as the cpu transport,
    the fallback is counted, and the server lives on."""
    prefix = private_shm_prefix("1m")
    if prefix is None:
        pytest.skip("unshare -m is not permitted here (the injected-ENOSPC unit test covers the fallback)")
    s = ServerProcess(model_dir, tmp_path / "small-shm", ["--mm-feature-transport", "shm"], cmd_prefix=prefix)
    try:
        s.wait_healthy()
        big = [data_url(png_bytes(noise_image(640, 640, 5)))]
        r = requests.post(s.url + "/generate", timeout=120, json={
            "text": "<|vision_start|><|image_pad|><|vision_end|>Describe.", "image_data": big,
            "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
        assert r.status_code == 200, r.text
        same = requests.post(s.url + "/generate", json=_body(3), timeout=120)
        ref = requests.post(servers[1].url + "/generate", json=_body(3), timeout=120)
        assert same.status_code == 200 and same.json()["output_ids"] == ref.json()["output_ids"]
        info = requests.get(s.url + "/get_server_info", timeout=30).json()
        assert info["shm_fallback_count"] >= 1, info
        assert "shared memory is full" in s.log_tail(20000)
    finally:
        assert s.stop() == 0, s.log_tail()
