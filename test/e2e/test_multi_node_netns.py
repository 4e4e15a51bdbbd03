"""Two "hosts" for real: two network namespaces joined by a veth pair (private addresses that exist only
inside them), node 1 also with its own /dev/shm. `--tp-size 2 --nnodes 2` over gloo between them gives
the greedy tokens of the one-node TP=1 server, for text and an image: the image reaches node 1 only
because pixels travel inline across hosts (the shared-memory transport is off), which node 0 says once.
Skipped with the reason where network namespaces cannot be created."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
import requests

from conftest import ServerProcess, START_TIMEOUT_S, data_url, noise_image, png_bytes, private_shm_prefix, wait_until

from sglang.srt.utils.process_tree import child_pids

pytestmark = pytest.mark.slow  # two namespaced servers and a gloo group between them: ~30 s

ADDR = ("10.213.0.1", "10.213.0.2")  # only inside the two namespaces this test creates
IFACE = ("veth-n0", "veth-n1")
MAX_NEW = 6

# run inside a namespace: GET (no body) or POST a JSON body to a URL, print status and body
_CLIENT = """
import sys, urllib.request, urllib.error
url, body = sys.argv[1], sys.argv[2]
req = urllib.request.Request(url, data=body.encode() or None, headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=120) as r:
        print(r.status); print(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode())
except OSError as e:
    print(0); print(e)
"""


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture
def namespaces():
    """Two network namespaces with loopback up and a veth pair between them; removed afterwards."""
    names = tuple(f"sgl-{k}-{uuid.uuid4().hex[:8]}" for k in ("n0", "n1"))
    probe = _ip("netns", "add", names[0])
    if probe.returncode != 0:
        pytest.skip(f"ip netns is not permitted here: {probe.stderr.strip() or probe.returncode}")
    try:
        steps = [("netns", "add", names[1]),
                 ("-n", names[0], "link", "add", IFACE[0], "type", "veth", "peer", "name", IFACE[1], "netns", names[1])]
        for ns, iface, addr in zip(names, IFACE, ADDR):
            steps += [("-n", ns, "addr", "add", f"{addr}/30", "dev", iface), ("-n", ns, "link", "set", iface, "up"),
                      ("-n", ns, "link", "set", "lo", "up")]
        for step in steps:
            out = _ip(*step)
            assert out.returncode == 0, f"ip {' '.join(step)}: {out.stderr}"
        yield names
    finally:
        for ns in names:
            _ip("netns", "del", ns)


def _call(ns: str, url: str, body: dict | None = None) -> tuple[int, str]:
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", _CLIENT, url,
                          json.dumps(body) if body is not None else ""], capture_output=True, text=True, timeout=180)
    status, _, text = out.stdout.partition("\n")
    return int(status or 0), text


def _wait_healthy(ns: str, s: ServerProcess) -> None:
    def healthy() -> bool:
        assert s.proc.poll() is None, f"server exited during start-up:\n{s.log_tail()}"
        return _call(ns, s.url + "/health")[0] == 200

    wait_until(healthy, START_TIMEOUT_S, interval=0.5, what="node 0 to serve")
    s.children = child_pids(s.proc.pid)


def _bodies() -> list[dict]:
    img = data_url(png_bytes(noise_image(160, 96, 5)))
    params = {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}
    return [{"text": "Two hosts, one model:", "sampling_params": params},
            {"text": "<|vision_start|><|image_pad|><|vision_end|>What is this?", "image_data": [img],
             "sampling_params": params}]


def test_two_hosts_over_veth_equal_one_node(namespaces, model_dir, tmp_path, server):
    ns0, ns1 = namespaces
    shm_prefix = private_shm_prefix("16m")
    if shm_prefix is None:
        pytest.skip("unshare -m is not permitted here: node 1 would share node 0's /dev/shm")
    port = 29000 + os.getpid() % 1000  # the rendezvous lives on node 0's veth address, inside the namespaces
    multi = ["--tp-size", "2", "--nnodes", "2", "--dist-init-addr", f"{ADDR[0]}:{port}", "--log-level", "info"]
    # gloo binds the interface it is told to (the hostname resolves to nothing inside a namespace)
    worker = ServerProcess(model_dir, tmp_path / "node1", [*multi, "--node-rank", "1"],
                           cmd_prefix=["ip", "netns", "exec", ns1, *shm_prefix],
                           env={"GLOO_SOCKET_IFNAME": IFACE[1]})
    head = ServerProcess(model_dir, tmp_path / "node0", [*multi, "--node-rank", "0"],
                         cmd_prefix=["ip", "netns", "exec", ns0], env={"GLOO_SOCKET_IFNAME": IFACE[0]})
    try:
        _wait_healthy(ns0, head)
        with pytest.raises(requests.ConnectionError):  # nothing of it is reachable from outside its namespace
            requests.get(head.url + "/health", timeout=5)
        for body in _bodies():
            status, text = _call(ns0, head.url + "/generate", body)
            assert status == 200, text
            one_node = requests.post(server.url + "/generate", json=body, timeout=120).json()
            assert json.loads(text)["output_ids"] == one_node["output_ids"]
        assert "shared-memory transport needs every TP rank on one host" in head.log_tail(20000)
    finally:
        head.stop()
        # the head's rank 0 left the group: node 1's rank notices and its server exits by itself
        wait_until(lambda: worker.proc.poll() is not None, 120, what="node 1 to exit")
        worker.stop()
    head.assert_clean()
