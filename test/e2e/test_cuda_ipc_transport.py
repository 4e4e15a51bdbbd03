"""--mm-feature-transport cuda_ipc end to end. On CPU: start-up stops with one clear line. On a GPU:
greedy tokens equal the shm transport's, and after 1,000 requests (normal, streamed and aborted,
rejected, corrupt image) the pool's free bytes return to the start value, the handle was opened once
per rank, and the server still serves."""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests
import torch

from conftest import REPO, wait_until
from transport_traffic import KINDS, run_mixed_traffic
from transport_traffic import two_image_body as _body

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_cpu_machine_refuses_cuda_ipc_with_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--mm-feature-transport", "cuda_ipc"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if ": error:" in line]  # argparse prints its usage first
    assert len(errors) == 1 and "needs a CUDA device, and torch sees none" in errors[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def servers(launch_server):
    ipc = launch_server("--mm-feature-transport", "cuda_ipc", "--chunked-prefill-size", "48",
                        env={"SGLANG_MM_FEATURE_CACHE_MB": "64", "SGLANG_MM_IPC_DEBUG": "1"})
    shm = launch_server("--mm-feature-transport", "cpu", "--chunked-prefill-size", "48")
    return ipc, shm


@pytest.mark.gpu
@needs_cuda
def test_same_greedy_tokens_as_shm_transport(servers):
    ipc, shm = servers
    for seed in range(4):
        a = requests.post(ipc.url + "/generate", json=_body(seed, 8), timeout=120).json()
        b = requests.post(shm.url + "/generate", json=_body(seed, 8), timeout=120).json()
        assert a["output_ids"] == b["output_ids"]


@pytest.mark.gpu
@needs_cuda
def test_no_slice_lost_after_1000_mixed_requests(servers):
    ipc, _ = servers
    kinds = run_mixed_traffic(ipc.url, 1000, 16)
    assert set(KINDS) <= set(kinds)

    def drained() -> bool:
        info = requests.get(ipc.url + "/get_server_info", timeout=10).json()
        return info["num_running_reqs"] == 0 and info["cuda_ipc_pool_free_bytes"] == info["cuda_ipc_pool_bytes"]

    wait_until(drained, 60, what="every slice back in the pool")
    info = requests.get(ipc.url + "/get_server_info", timeout=10).json()
    assert info["cuda_ipc_outstanding_slices"] == 0
    assert info["mm_ipc_handle_opens"] == 1 and info["mm_ipc_handle_hits"] > 0, info
    assert requests.post(ipc.url + "/generate", json=_body(999), timeout=60).status_code == 200
    log = ipc.log_tail(200_000)
    assert "StaleSliceError" not in log and "Traceback" not in log


@pytest.mark.gpu
@needs_cuda
def test_switch_off_opens_per_item_with_the_same_tokens(launch_server, servers):
    off = launch_server("--mm-feature-transport", "cuda_ipc", "--chunked-prefill-size", "48",
                        env={"SGLANG_USE_IPC_POOL_HANDLE_CACHE": "0", "SGLANG_MM_FEATURE_CACHE_MB": "64"})
    ref = requests.post(servers[1].url + "/generate", json=_body(5, 8), timeout=120).json()
    got = requests.post(off.url + "/generate", json=_body(5, 8), timeout=120).json()
    assert got["output_ids"] == ref["output_ids"]
    info = requests.get(off.url + "/get_server_info", timeout=10).json()
    assert info["mm_ipc_handle_opens"] == info["mm_ipc_handle_closes"] >= 2 and info["mm_ipc_handle_hits"] == 0
