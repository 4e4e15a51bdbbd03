"""A long prompt must not grow the scheduler with (chunk x context): an 88k-token prompt once took the
scheduler past 22 GB and the kernel killed it. Peak scheduler memory for a 32k-token prompt stays within
1.5x of a 4k-token prompt's on the tiny model, and the server keeps serving."""

from __future__ import annotations

import random

import pytest
import requests

from sglang.srt.utils.process_tree import memory_status

CONTEXT = 40_000


def _peak_mib(server) -> float:
    return memory_status(server.pid_of("sglang-sched0"))["VmHWM"] / 2**20


def _score(server, n_tokens: int, seed: int) -> dict:
    rng = random.Random(seed)
    ids = [rng.randrange(300, 5000) for _ in range(n_tokens)]
    r = requests.post(server.url + "/generate", json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}, timeout=900)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.slow  # a 32k-token prompt: ~63 s on 2 cores
def test_peak_scheduler_memory_does_not_grow_with_prompt_times_context(launch_server):
    s = launch_server("--context-length", str(CONTEXT), "--max-total-tokens", str(CONTEXT),
                      "--chunked-prefill-size", "8192")
    idle = _peak_mib(s)
    _score(s, 4_000, seed=1)
    short = _peak_mib(s)
    out = _score(s, 32_000, seed=2)
    long = _peak_mib(s)
    print(f"\nscheduler peak RSS: idle {idle:.0f} MiB, after 4k prompt {short:.0f} MiB, after 32k prompt {long:.0f} MiB")
    assert out["meta_info"]["prompt_tokens"] == 32_000
    assert long <= 1.5 * short, (idle, short, long)
    assert requests.get(s.url + "/health", timeout=10).status_code == 200
