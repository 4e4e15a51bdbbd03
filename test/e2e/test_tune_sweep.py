"""`python -m sglang.tune` end to end on the tiny model: two configurations, each started, benchmarked and
stopped; the results file, the report's recommendation, resuming, and no server left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, wait_until

WORKLOAD = ["--dataset-name", "random-mm", "--random-input-len", "32", "--random-output-len", "4",
            "--random-mm-bucket-config", "{(64, 64, 1): 1.0}"]


def tune_cmd(model_dir: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sglang.tune", "--model-path", str(model_dir), "--output-dir", str(out),
            "--server-args=--dtype float32 --device cpu --log-level warning", "--server-env", "OMP_NUM_THREADS=1",
            "--disable-progress", "--start-timeout-s", "120", *WORKLOAD, *extra]


def env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path)


def server_ports(out: Path) -> set[str]:
    ports = set()
    for log in (out / "logs").glob("*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("$ "):
                words = line.split()
                ports.add(words[words.index("--port") + 1])
    return ports


def live_servers(ports: set[str]) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            words = [a.decode(errors="replace") for a in args]
            if state != "Z" and "sglang.launch_server" in words and "--port" in words:
                if words[words.index("--port") + 1] in ports:
                    found.append(" ".join(words))
    return found


def results(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def check_run(proc: subprocess.CompletedProcess, model_dir: Path, out: Path, n_runs: int, prompts: int) -> list[dict]:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recs = results(out)
    assert len(recs) == n_runs
    for r in recs:
        assert r["status"] == "ok", r.get("error")
        m = r["metrics"]
        assert m["completed"] == prompts and m["failed"] == 0 and m["request_throughput"] > 0
        assert m["total_input_vision_tokens"] > 0 and r["peak_rss_mb"] > 100
    assert proc.stdout.rstrip().splitlines()[-1].startswith(f"python -m sglang.launch_server --model-path {model_dir}")
    ports = server_ports(out)
    assert len(ports) >= 2 and live_servers(ports) == []  # a resumed configuration starts again
    return recs


@pytest.mark.slow  # two server start-ups and a benchmark each: ~24 s on 2 cores
def test_two_configuration_sweep(model_dir, tmp_path):
    out = tmp_path / "tune"
    cmd = tune_cmd(model_dir, out, "--grid", "chunked-prefill-size=64,default", "--num-prompts", "4")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=REPO, timeout=300)
    recs = check_run(proc, model_dir, out, 2, 4)
    assert [r["key"] for r in recs] == ["chunked-prefill-size=64", "chunked-prefill-size=default"]
    assert recs[0]["server_info"]["chunked_prefill_size"] == 64
    assert recs[1]["server_info"]["chunked_prefill_size"] == 8192
    assert "## Runs meeting the SLOs (2)" in proc.stdout


@pytest.mark.slow
def test_interrupted_sweep_resumes_and_leaves_nothing(model_dir, tmp_path):
    out = tmp_path / "tune"
    cmd = tune_cmd(model_dir, out, "--grid", "disable-radix-cache=on,off", "--max-concurrency", "2", "8",
                   "--num-prompts", "16")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(), cwd=REPO,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    wait_until(lambda: (out / "results.jsonl").exists(), 180, what="the first result")
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    text = p.communicate(timeout=60)[0]
    assert p.returncode == 130, text[-3000:]
    assert "interrupted" in text
    assert live_servers(server_ports(out)) == []
    done = len(results(out))
    assert 1 <= done < 4

    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=REPO, timeout=600)
    recs = check_run(proc, model_dir, out, 4, 16)
    assert f"resumed {done}" in proc.stdout
    info = {(r["key"], r["concurrency"]): r["server_info"] for r in recs}
    assert info[("disable-radix-cache=on", 8)]["radix_cache_tokens"] == 0
    assert info[("disable-radix-cache=off", 8)]["radix_cache_tokens"] > 0
    assert (out / "report.md").read_text().rstrip().endswith(proc.stdout.rstrip().splitlines()[-1])

    again = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=REPO, timeout=120)
    assert again.returncode == 0 and "ran 0, resumed 4" in again.stdout
