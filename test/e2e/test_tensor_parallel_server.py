"""The launched server at --tp-size 2 (gloo on CPU) answers exactly like transformers (= TP 1), also
as two "nodes" on one machine over loopback; a killed rank makes the server exit, never hang."""

from __future__ import annotations

import signal
import time

import pytest
import requests

from conftest import CASES, ServerProcess, build_case, data_url, png_bytes, private_shm_prefix, wait_until

from sglang.srt.utils.network import pick_unused_port

MAX_NEW = 8


def _generate(url: str, hf_ref, case: str) -> list[int]:
    _, tmpl, images = build_case(CASES[case])
    r = requests.post(url + "/generate", timeout=120, json={
        "text": hf_ref.render(tmpl),
        "image_data": [data_url(png_bytes(img)) for img in images],
        "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0},
    })
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


@pytest.fixture(scope="module")
def tp2_server(launch_server):
    return launch_server("--tp-size", "2", "--chunked-prefill-size", "16")


@pytest.mark.parametrize("case", ["text_only", "three_images_mixed_sizes"])
def test_tp2_matches_transformers(tp2_server, hf_ref, case):
    _, tmpl, images = build_case(CASES[case])
    assert _generate(tp2_server.url, hf_ref, case) == hf_ref.greedy(case, tmpl, images, MAX_NEW)


def test_two_nodes_over_loopback(model_dir, tmp_path, hf_ref):
    """Node 1 runs in its own mount namespace with its own /dev/shm, as on another machine: image
    requests work only if no pixel data is sent through node 0's shared memory."""
    prefix = private_shm_prefix("16m")
    if prefix is None:
        pytest.skip("unshare -m is not permitted here: node 1 would share node 0's /dev/shm")
    addr = f"127.0.0.1:{pick_unused_port()}"
    multi = ["--tp-size", "2", "--nnodes", "2", "--dist-init-addr", addr]
    worker = ServerProcess(model_dir, tmp_path / "node1", [*multi, "--node-rank", "1"], cmd_prefix=prefix)
    head = ServerProcess(model_dir, tmp_path / "node0", [*multi, "--node-rank", "0"])
    try:
        head.wait_healthy()
        _, tmpl, images = build_case(CASES["image_before_text"])
        assert _generate(head.url, hf_ref, "image_before_text") == hf_ref.greedy("image_before_text", tmpl, images, MAX_NEW)
    finally:
        head.stop()
        # the head's rank 0 leaves the group: the worker node's rank must notice and exit by itself
        wait_until(lambda: worker.proc.poll() is not None, 120, what="worker node to exit")
        worker.stop()


def test_killed_rank_makes_server_exit(launch_server):
    s = launch_server("--tp-size", "2", "--watchdog-timeout", "20")
    rank1 = s.pid_of("sglang-sched1")
    import os

    os.kill(rank1, signal.SIGKILL)
    start = time.monotonic()
    # a request now either fails fast or the health check turns 503; the server exits on its own
    try:
        requests.post(s.url + "/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 4}}, timeout=60)
    except requests.RequestException:
        pass
    wait_until(lambda: s.proc.poll() is not None, 60, what="server to exit after a rank died")
    assert s.proc.returncode != 0
    assert time.monotonic() - start < 60
    s.stop()
    s.assert_clean()


def test_tp2_a_grammar_that_fails_to_compile_is_one_400_and_the_server_serves_on(tp2_server):
    """Grammars compile on each rank (the ranks agree on the verdict); only rank 0 answers, so a streamed
    request with an invalid regex gets one 400 naming the problem, and a valid grammar runs after it."""
    url = tp2_server.url
    bad = requests.post(url + "/generate", timeout=120, json={
        "text": "Code:", "stream": True, "sampling_params": {"max_new_tokens": 4, "regex": "a(b"}})
    assert bad.status_code == 400, bad.text
    assert bad.json()["error"]["message"].startswith("invalid regex:"), bad.text
    good = requests.post(url + "/generate", timeout=120, json={
        "text": "Code:", "sampling_params": {"max_new_tokens": 8, "temperature": 0, "regex": "[0-9]{4}"}})
    assert good.status_code == 200 and len(good.json()["text"]) == 4 and good.json()["text"].isdigit(), good.text


def test_tp2_listens_on_loopback_only(tp2_server):
    """The TP ranks meet through a file in the server's private directory, not torch's TCP store, which
    listens on every interface whatever --host says (it did on a018ab2)."""
    from sglang.srt.utils.process_tree import listening_tcp

    found = listening_tcp(tp2_server.proc.pid)
    assert ("127.0.0.1", tp2_server.port) in found
    assert not {(a, p) for a, p in found if a != "127.0.0.1"}
