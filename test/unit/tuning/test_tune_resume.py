"""sglang.tuning.sweep + store without real servers: a resumed sweep skips finished runs and starts servers only
for configurations with runs left; interruption, failed starts, torn lines, the time budget."""

from __future__ import annotations

import json
import os

import pytest

from sglang.tuning import sweep as sw
from sglang.tuning.grid import expand, flag_kinds, parse_grid
from sglang.tuning.server import ServerStartError
from sglang.tuning.store import ResultsStore


class FakeProc:
    pid = os.getpid()

    def poll(self):
        return None


class FakeServer:
    started: list[list[str]] = []
    stopped = 0
    fail_for: set[str] = set()

    def __init__(self, argv, log_path, env=None):
        self.argv, self.url, self.proc = argv, "http://fake", FakeProc()
        FakeServer.started.append(argv)

    def wait_healthy(self, timeout):
        if any(a in FakeServer.fail_for for a in self.argv):
            raise ServerStartError("server exited with code 1 during start-up")
        return 1.5

    def server_info(self):
        return {"max_total_num_tokens": 65536}

    def stop(self, timeout=30.0):
        FakeServer.stopped += 1
        return 0


@pytest.fixture
def fake(monkeypatch):
    FakeServer.started, FakeServer.stopped, FakeServer.fail_for = [], 0, set()
    monkeypatch.setattr(sw, "ServerHandle", FakeServer)
    return FakeServer


def plan(workload, fingerprint="fp1", **kw):
    configs = expand(parse_grid(["chunked-prefill-size=256,512,1024"]))
    return sw.Plan(configs, [1, 4], flag_kinds(), [], fingerprint, workload, progress=False, **kw)


def metrics(url, conc, log):
    return {"completed": 4, "failed": 0, "request_throughput": float(conc), "output_throughput": 1.0,
            "p99_ttft_ms": 1.0, "p99_tpot_ms": 1.0}


def test_interrupted_sweep_resumes_where_it_stopped(tmp_path, fake):
    store = ResultsStore(tmp_path)
    calls = []

    def interrupted_on_third(url, conc, log):
        calls.append(conc)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return metrics(url, conc, log)

    out = sw.run_sweep(plan(interrupted_on_third), store)
    assert out.interrupted and out.ran == 2 and out.left == 4
    assert fake.stopped == len(fake.started) == 2  # the interrupted configuration's server was stopped too
    assert [(r["key"], r["concurrency"]) for r in store.load()] == [
        ("chunked-prefill-size=256", 1), ("chunked-prefill-size=256", 4)]

    fake.started = []
    seen = []
    out = sw.run_sweep(plan(lambda u, c, lg: seen.append(c) or metrics(u, c, lg)), store)
    assert (out.ran, out.skipped, out.left, out.interrupted) == (4, 2, 0, False)
    assert [a[-1] for a in fake.started] == ["512", "1024"]  # no server for the finished configuration
    assert len(store.latest("fp1")) == 6 and all(r["status"] == "ok" for r in store.load())

    fake.started = []
    out = sw.run_sweep(plan(metrics), store)
    assert (out.ran, out.skipped) == (0, 6) and fake.started == []


def test_another_workload_fingerprint_runs_everything_again(tmp_path, fake):
    store = ResultsStore(tmp_path)
    sw.run_sweep(plan(metrics), store)
    out = sw.run_sweep(plan(metrics, fingerprint="fp2"), store)
    assert out.ran == 6 and len(store.load()) == 12


def test_failed_start_is_recorded_skipped_on_resume_and_retried_on_request(tmp_path, fake):
    store = ResultsStore(tmp_path)
    fake.fail_for = {"512"}
    out = sw.run_sweep(plan(metrics), store)
    assert out.ran == 6 and fake.stopped == 3
    failed = [r for r in store.load() if r["status"] == "failed"]
    assert [(r["key"], r["concurrency"]) for r in failed] == [("chunked-prefill-size=512", 1),
                                                              ("chunked-prefill-size=512", 4)]
    assert "during start-up" in failed[0]["error"]
    assert sw.run_sweep(plan(metrics), store).ran == 0
    fake.fail_for = set()
    out = sw.run_sweep(plan(metrics, retry_failed=True), store)
    assert out.ran == 2
    assert all(r["status"] == "ok" for r in store.latest("fp1").values())


def test_workload_errors_are_recorded_and_the_sweep_goes_on(tmp_path, fake):
    store = ResultsStore(tmp_path)

    def broken_at_4(url, conc, log):
        if conc == 4:
            raise RuntimeError("bench_serving: all 1 warmup request(s) failed")
        return metrics(url, conc, log)

    out = sw.run_sweep(plan(broken_at_4), store)
    assert out.ran == 6
    recs = store.load()
    assert {r["status"] for r in recs if r["concurrency"] == 4} == {"failed"}
    assert recs[0]["server_info"] == {"max_total_num_tokens": 65536} and recs[0]["peak_rss_mb"] > 0


def test_torn_last_line_is_ignored_and_the_next_line_starts_clean(tmp_path, fake):
    store = ResultsStore(tmp_path)
    sw.run_sweep(plan(metrics), store)
    with open(store.path, "a") as f:
        f.write('{"fingerprint": "fp1", "key": "chunked-pre')  # a crash mid-write
    assert len(store.load()) == 6
    store.append({"fingerprint": "fp1", "key": "k", "concurrency": None, "status": "ok"})
    lines = store.path.read_text().splitlines()
    assert json.loads(lines[-1])["key"] == "k" and len(store.load()) == 7


def test_time_budget_stops_before_the_next_configuration(tmp_path, fake):
    store = ResultsStore(tmp_path)
    out = sw.run_sweep(plan(metrics, time_budget_s=0.0), store)
    assert out.budget_hit and out.ran == 0 and out.left == 6 and fake.started == []
