"""benchmark/performance/bench_host_overhead.py --counter on a tiny workload: bytecodes run anywhere and write
{workload: {batch: {"bytecodes_per_step": N, "host_ms_per_step": x}}}, the same N on a second run; the
instruction counter either writes its count or refuses in one line (a machine without a PMU). The stand-in
vocabulary the valgrind count uses samples within it; the valgrind count itself is slow (marked so)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TINY = ["--batch-sizes", "2", "--prompt-len", "16", "--output-len", "6"]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_host_overhead",
                                                  REPO / "benchmark/performance/bench_host_overhead.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bytecodes_counter_writes_the_json_shape_and_repeats_exactly(bench, tiny_model_dir, tmp_path):
    model = str(tiny_model_dir("qwen3-vl-tiny"))
    runs = []
    for i in range(2):
        out = tmp_path / f"run{i}.json"
        assert bench.main(["--counter", "bytecodes", "--workloads", "greedy,penalties", "--model-path", model,
                           "--json", str(out), *TINY]) == 0
        runs.append(json.loads(out.read_text()))
    first = runs[0]
    assert set(first) == {"greedy", "penalties"}
    for w in first:
        assert set(first[w]) == {"2"}
        cell = first[w]["2"]
        assert isinstance(cell["bytecodes_per_step"], int) and cell["bytecodes_per_step"] > 100
        assert cell["host_ms_per_step"] > 0 and cell["steps"] == 4  # 6 outputs: the prefill's and the last apart
    # penalties add their bookkeeping to the same greedy step
    assert first["penalties"]["2"]["bytecodes_per_step"] > first["greedy"]["2"]["bytecodes_per_step"]
    counts = [[run[w]["2"]["bytecodes_per_step"] for w in first] for run in runs]
    assert counts[0] == counts[1]


def test_instructions_counter_counts_or_refuses_in_one_line(bench, tiny_model_dir, tmp_path):
    out = tmp_path / "instr.json"
    try:
        bench.main(["--counter", "instructions", "--workloads", "greedy", "--model-path",
                    str(tiny_model_dir("qwen3-vl-tiny")), "--json", str(out), *TINY])
    except SystemExit as e:  # no PMU here: refused before any work
        msg = str(e.code)
        assert "\n" not in msg and msg.startswith("instructions counter unavailable: perf_event_open")
        assert not out.exists()
        return
    cell = json.loads(out.read_text())["greedy"]["2"]
    assert cell["instructions_per_step"] > 0 and cell["host_ms_per_step"] > 0


def test_a_standin_vocabulary_runs_every_step_on_tiny_tensors(tiny_model_dir):
    sys.path.insert(0, str(REPO / "benchmark/performance"))
    try:
        from host_overhead_run import WORKLOADS, HostOverheadRun
    finally:
        sys.path.remove(str(REPO / "benchmark/performance"))
    run = HostOverheadRun(str(tiny_model_dir("qwen3-vl-tiny")), 3, 8, 5, WORKLOADS["penalties"], elide=False,
                          standin_vocab=16)
    run.prefill()
    run.decode_step()
    worker = run.sched.worker
    assert run.vocab == worker.vocab_size == worker.penalties.vocab == 16
    outputs = [r.output_ids for r in run.sched.running]
    assert all(len(o) == 2 and max(o) < 16 for o in outputs), outputs
    while run.decode_step() is not None:
        pass
    assert run.sched.is_idle() and worker.penalties.rows_in_use == 0


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed")
def test_valgrind_counts_each_marked_step():
    spec = importlib.util.spec_from_file_location("host_instructions_valgrind",
                                                  REPO / "benchmark/performance/host_instructions_valgrind.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    per_step = mod.count(str(REPO), "greedy", 2, 2, 8)
    assert len(per_step) == 2 and all(n > 10_000 for n in per_step)
