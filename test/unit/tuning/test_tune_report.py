"""sglang.tuning.report / plot on recorded results: objective ranking, SLO filtering, the Pareto front, the
recommended command, and the plot's optional dependency."""

from __future__ import annotations

import builtins
import shlex

import pytest

from sglang.tuning import report as rp
from sglang.tuning.plot import plot_pareto


def run(key, rps, ttft99, tpot99=10.0, conc=None, failed=0, status="ok", argv=(), env=None):
    m = {"completed": 10 - failed, "failed": failed, "request_throughput": rps, "output_throughput": rps * 32,
         "median_ttft_ms": ttft99 / 2, "p99_ttft_ms": ttft99, "median_tpot_ms": tpot99 / 2, "p99_tpot_ms": tpot99}
    rec = {"key": key, "concurrency": conc, "status": status, "server_argv": list(argv), "config_env": env or {},
           "peak_rss_mb": 1000.0, "peak_gpu_mem_mb": None}
    if status == "ok":
        rec["metrics"] = m
    else:
        rec["error"] = "server exited with code 1 during start-up"
    return rec


RECORDS = [
    run("a", 10.0, 900.0, argv=["--chunked-prefill-size", "256"]),
    run("b", 12.0, 1500.0, tpot99=40.0),
    run("c", 8.0, 300.0),
    run("d", 9.0, 950.0),            # dominated by a (more throughput, less latency)
    run("e", 20.0, 200.0, failed=2),  # best figures, but requests failed
    run("f", 0.0, 0.0, status="failed"),
]


def test_ranking_by_objective_without_slos():
    passing, failing = rp.rank(RECORDS, "request-throughput", rp.SLO())
    assert [r["key"] for r in passing] == ["b", "a", "d", "c"]
    assert {r["key"]: why for r, why in failing} == {
        "e": ["2 failed request(s)"], "f": ["run failed: server exited with code 1 during start-up"]}
    passing, _ = rp.rank(RECORDS, "ttft-p99", rp.SLO())
    assert [r["key"] for r in passing] == ["c", "a", "d", "b"]


def test_slos_move_runs_to_the_violating_list_with_reasons():
    passing, failing = rp.rank(RECORDS, "request-throughput", rp.SLO(ttft_p99_ms=1000, tpot_p99_ms=20))
    assert [r["key"] for r in passing] == ["a", "d", "c"]
    reasons = {r["key"]: why for r, why in failing}
    assert reasons["b"] == ["TTFT p99 1500 > 1000 ms", "TPOT p99 40.0 > 20 ms"]
    passing, _ = rp.rank(RECORDS, "request-throughput", rp.SLO(ttft_p99_ms=500))
    assert [r["key"] for r in passing] == ["c"]


def test_pareto_front_excludes_dominated_and_failed_runs():
    front = rp.pareto_front(RECORDS)
    assert [r["key"] for r in front] == ["c", "a", "b"]  # by latency; d is dominated, e and f failed


def test_pareto_front_keeps_ties_and_one_point():
    recs = [run("x", 5.0, 100.0), run("y", 5.0, 100.0)]
    assert [r["key"] for r in rp.pareto_front(recs)] == ["x", "y"]
    assert [r["key"] for r in rp.pareto_front(recs[:1])] == ["x"]


def test_recommended_command_is_shell_ready():
    rec = run("z", 1.0, 1.0, argv=["--model-path", "/m/with space", "--cuda-graph-bs", "1", "2", "--disable-radix-cache"],
              env={"SGLANG_MM_SHM_TRANSPORT": "0"})
    cmd = rp.launch_command(rec)
    assert cmd == ("SGLANG_MM_SHM_TRANSPORT=0 python -m sglang.launch_server --model-path '/m/with space' "
                   "--cuda-graph-bs 1 2 --disable-radix-cache")
    assert shlex.split(cmd)[1:4] == ["python", "-m", "sglang.launch_server"]
    assert rp.launch_command(run("n", 1.0, 1.0)) == "python -m sglang.launch_server"


def test_rendered_report_ends_with_the_recommendation():
    text, best = rp.render(RECORDS, "request-throughput", rp.SLO(ttft_p99_ms=1000))
    assert best["key"] == "a"
    assert text.splitlines()[-1] == "python -m sglang.launch_server --chunked-prefill-size 256"
    assert "## Runs violating the SLOs or failing (3)" in text
    text, best = rp.render(RECORDS, "request-throughput", rp.SLO(ttft_p99_ms=1))
    assert best is None and text.splitlines()[-1].startswith("No configuration meets the SLOs")


def test_unknown_objective_is_refused():
    with pytest.raises(ValueError, match="choose from"):
        rp.objective_spec("goodput")
    assert rp.objective_spec("output_throughput")[0] == "output_throughput"


def test_plot_writes_a_png_or_says_why_not(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    note = plot_pareto(RECORDS, tmp_path / "p.png")
    assert note.startswith("Pareto plot: ") and (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    real_import = builtins.__import__

    def no_matplotlib(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert "matplotlib is not installed" in plot_pareto(RECORDS, tmp_path / "q.png")
    assert not (tmp_path / "q.png").exists()
