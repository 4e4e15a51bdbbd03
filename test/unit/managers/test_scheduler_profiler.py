"""The scheduler's torch profiler (CPU): start/stop writes a gzipped Chrome trace named by profile id
and rank into the request's directory or SGLANG_TORCH_PROFILER_DIR, `num_steps` stops it by itself,
and a second start, a stop without a start or an unusable directory are refused with a reason. Traces
go only under SGLANG_TORCH_PROFILER_DIR, and every profile stops by itself within a bounded step count."""

from __future__ import annotations

import gzip
import json
import os
import threading
import time

import pytest
import torch

from sglang.srt.managers.io_struct import ProfileReq
from sglang.srt.managers.profiler import SchedulerProfiler


@pytest.fixture(autouse=True)
def _profiler_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_TORCH_PROFILER_DIR", str(tmp_path))


def wait_for_file(path, timeout: float = 60) -> None:
    """The background writer renames the finished trace into place."""
    deadline = time.monotonic() + timeout
    while not path.is_file():
        assert time.monotonic() < deadline, f"{path} not written within {timeout:g} s"
        time.sleep(0.01)


def _events(path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _work():
    a = torch.randn(64, 64)
    for _ in range(3):
        a = torch.matmul(a, a).tanh()


def test_start_stop_writes_a_trace_of_what_ran_in_between(tmp_path):
    p = SchedulerProfiler(tp_rank=1)
    out = p.start(ProfileReq("start", output_dir=str(tmp_path / "traces"), activities=["CPU"], profile_id="42"))
    assert out.success and p.active
    path = tmp_path / "traces" / "42-TP-1.trace.json.gz"
    assert out.files == [str(path)] and not path.exists()
    _work()
    out = p.stop()
    assert out.success and out.files == [str(path)] and not p.active
    assert any("matmul" in e.get("name", "") for e in _events(path))


def test_default_directory_is_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_TORCH_PROFILER_DIR", str(tmp_path))
    p = SchedulerProfiler()
    assert p.handle(ProfileReq("start", profile_id="7")).success  # CPU and GPU: GPU records nothing on CPU
    assert p.handle(ProfileReq("stop")).success
    assert (tmp_path / "7-TP-0.trace.json.gz").is_file()


def test_num_steps_stops_after_that_many_forward_steps(tmp_path):
    p = SchedulerProfiler()
    assert p.start(ProfileReq("start", output_dir=str(tmp_path), num_steps=2, activities=["CPU"], profile_id="s")).success
    p.after_forward()
    assert p.active and not (tmp_path / "s-TP-0.trace.json.gz").exists()
    p.after_forward()
    assert not p.active
    wait_for_file(tmp_path / "s-TP-0.trace.json.gz")
    assert [f.name for f in tmp_path.iterdir()] == ["s-TP-0.trace.json.gz"]  # the partial file was renamed
    p.after_forward()  # not profiling: nothing happens
    assert not p.stop().success


def test_refusals_name_the_problem(tmp_path):
    p = SchedulerProfiler()
    out = p.stop()
    assert not out.success and "not in progress" in out.message
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = p.start(ProfileReq("start", output_dir=str(blocker / "sub"), activities=["CPU"], profile_id="x"))
    assert not out.success and str(blocker / "sub") in out.message and not p.active
    assert not p.start(ProfileReq("start", output_dir=str(tmp_path), activities=["MEM"])).success
    assert p.start(ProfileReq("start", output_dir=str(tmp_path), activities=["CPU"], profile_id="a")).success
    out = p.start(ProfileReq("start", output_dir=str(tmp_path), activities=["CPU"], profile_id="b"))
    assert not out.success and "already in progress" in out.message
    assert p.stop().success
    assert not p.handle(ProfileReq("pause")).success
    if not torch.cuda.is_available():
        out = p.start(ProfileReq("start", output_dir=str(tmp_path), activities=["GPU"]))
        assert not out.success and "no CUDA device" in out.message


def test_replicas_name_their_traces_on_every_rank(tmp_path):
    """--dp-size > 1: each replica's ranks write `<id>-DP-<k>-TP-<r>`, also ranks without the controller's
    load socket (only rank 0 has one), so two replicas' rank 1 never write the same file."""
    from types import SimpleNamespace

    from sglang.srt.distributed.parallel_state import SINGLE_RANK
    from sglang.srt.managers.scheduler_io_mixin import SchedulerIOMixin

    sent = []
    replica = SimpleNamespace(_profiler=None, tp=SINGLE_RANK, dp_rank=1, report_dp_rank=True, load_socket=None,
                              send=sent.append)
    SchedulerIOMixin.handle_profile(replica, ProfileReq("start", output_dir=str(tmp_path), activities=["CPU"],
                                                        profile_id="9", req_id=3))
    SchedulerIOMixin.handle_profile(replica, ProfileReq("stop", req_id=4))
    assert [o.req_id for o in sent] == [3, 4] and all(o.success for o in sent)
    assert sent[1].files == [str(tmp_path / "9-DP-1-TP-0.trace.json.gz")] and (tmp_path / "9-DP-1-TP-0.trace.json.gz").is_file()


def test_output_dir_outside_the_launch_directory_is_refused_and_not_created(tmp_path, monkeypatch):
    root = tmp_path / "traces"
    monkeypatch.setenv("SGLANG_TORCH_PROFILER_DIR", str(root))
    (tmp_path / "elsewhere").mkdir()
    root.mkdir()
    os.symlink(tmp_path / "elsewhere", root / "escape")
    p = SchedulerProfiler()
    for bad in (str(tmp_path / "outside"), "../outside", str(root / "escape" / "sub"), "/etc/sglang-profile"):
        out = p.start(ProfileReq("start", output_dir=bad, activities=["CPU"], profile_id="x"))
        assert not out.success and "SGLANG_TORCH_PROFILER_DIR" in out.message and not p.active, (bad, out)
    assert not (tmp_path / "outside").exists() and not (tmp_path / "elsewhere" / "sub").exists()
    # inside it: a relative directory is taken from it, an absolute one may name it
    out = p.start(ProfileReq("start", output_dir="run1/a", activities=["CPU"], profile_id="r"))
    assert out.success and out.files == [str(root / "run1" / "a" / "r-TP-0.trace.json.gz")]
    assert p.stop().success
    assert p.start(ProfileReq("start", output_dir=str(root / "b"), activities=["CPU"], profile_id="s")).success
    assert p.stop().success and (root / "b" / "s-TP-0.trace.json.gz").is_file()


def test_a_profile_without_num_steps_stops_by_itself_and_a_larger_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_PROFILE_NUM_STEPS", "3")
    monkeypatch.setenv("SGLANG_PROFILE_MAX_STEPS", "5")
    p = SchedulerProfiler()
    assert p.start(ProfileReq("start", activities=["CPU"], profile_id="d")).success
    for _ in range(3):
        assert p.active
        p.after_forward()
    assert not p.active
    wait_for_file(tmp_path / "d-TP-0.trace.json.gz")
    out = p.start(ProfileReq("start", num_steps=6, activities=["CPU"], profile_id="e"))
    assert not out.success and "SGLANG_PROFILE_MAX_STEPS" in out.message and "5" in out.message and not p.active
    assert p.start(ProfileReq("start", num_steps=5, activities=["CPU"], profile_id="f")).success
    assert p.stop().success


def test_a_profile_that_stops_by_itself_is_written_outside_the_scheduler_loop(tmp_path):
    p = SchedulerProfiler()
    assert p.start(ProfileReq("start", num_steps=1, activities=["CPU"], profile_id="w")).success
    release = threading.Event()
    real_export = p._prof.export_chrome_trace

    def slow_export(path):  # stands in for a large trace: writes only once released
        assert release.wait(60)
        real_export(path)

    p._prof.export_chrome_trace = slow_export
    p.after_forward()  # returns while the trace is still unwritten: the loop is not held by the writing
    assert not p.active and not p.wait_written(0) and not (tmp_path / "w-TP-0.trace.json.gz").exists()
    out = p.start(ProfileReq("start", num_steps=1, activities=["CPU"], profile_id="v"))
    assert not out.success and "still being written" in out.message
    release.set()
    assert p.wait_written()
    wait_for_file(tmp_path / "w-TP-0.trace.json.gz")
    assert p.start(ProfileReq("start", num_steps=1, activities=["CPU"], profile_id="v")).success
    assert p.stop().success
