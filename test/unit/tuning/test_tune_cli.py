"""python -m sglang.tune's flags: concurrency lists, pass-through to bench_serving, --dry-run, --report-only."""

from __future__ import annotations

import json

import pytest

from sglang.tuning import cli
from sglang.tuning import workload as wl


def test_concurrency_values():
    assert cli.parse_concurrency(None) == [None]
    assert cli.parse_concurrency(["4", "8,16"]) == [4, 8, 16]
    assert cli.parse_concurrency(["inf", "2"]) == [None, 2]
    for bad in (["0"], ["4", "4"], ["x"]):
        with pytest.raises(ValueError):
            cli.parse_concurrency(bad)


def test_bench_flags_pass_through_with_the_smoke_defaults_only_without_a_dataset():
    argv = wl.with_defaults(["--num-prompts", "8"])
    assert argv[:2] == ["--num-prompts", "8"] and "--dataset-name" in argv and argv.count("--num-prompts") == 1
    own = wl.with_defaults(["--dataset-name=random", "--random-input-len", "64"])
    assert own == ["--dataset-name=random", "--random-input-len", "64", "--disable-tqdm"]
    ns = wl.check_passthrough(["--request-rate", "4", "--num-prompts", "8"])
    assert ns.request_rate == 4.0 and ns.dataset_name == "random-mm"
    with pytest.raises(SystemExit, match="neither the tuner's nor bench_serving's: --random-inpt-len"):
        wl.check_passthrough(["--random-inpt-len", "3"])
    with pytest.raises(SystemExit, match="--num-prompts: invalid int"):
        wl.check_passthrough(["--num-prompts", "x"])
    with pytest.raises(SystemExit, match="--port is set by the tuner"):
        wl.check_passthrough(["--port", "30000"])


def test_trimmed_record_counts_failures_and_drops_arrays():
    rec = {"completed": 3, "ttfts": [0.1] * 4, "errors": ["", "x"], "error_summary": [{"count": 1, "error": "x"}]}
    assert wl.trim(rec) == {"completed": 3, "failed": 1, "error_summary": [{"count": 1, "error": "x"}]}


def test_dry_run_prints_every_configuration(capsys):
    code = cli.main(["--grid", "chunked-prefill-size=256,1024", "--grid", "disable-radix-cache=on,off",
                     "--server-args=--dtype float32", "--max-concurrency", "2", "4", "--num-prompts", "8", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("4 configuration(s) x 2 concurrency value(s)")
    assert ("[chunked-prefill-size=1024 disable-radix-cache=on]  python -m sglang.launch_server --dtype float32 "
            "--chunked-prefill-size 1024 --disable-radix-cache") in out


def test_bad_grid_fails_before_anything_starts():
    with pytest.raises(SystemExit, match="did you mean max-running-requests"):
        cli.main(["--grid", "max-running-request=8", "--dry-run"])
    with pytest.raises(SystemExit, match="use the tuner's --model-path"):
        cli.main(["--server-args=--model-path /x", "--dry-run"])


def test_report_only_reads_the_results_file(tmp_path, capsys):
    argv = ["--grid", "page-size=1,16", "--num-prompts", "8", "--output-dir", str(tmp_path), "--no-plot"]
    fp = wl.fingerprint({"base_argv": [], "server_env": {}, "bench": wl.with_defaults(["--num-prompts", "8"])})
    with open(tmp_path / "results.jsonl", "w") as f:
        for size, rps in (("1", 2.0), ("16", 3.0)):
            f.write(json.dumps({"fingerprint": fp, "key": f"page-size={size}", "concurrency": None, "status": "ok",
                                "server_argv": ["--page-size", size], "metrics": {
                                    "completed": 8, "failed": 0, "request_throughput": rps, "p99_ttft_ms": 10.0,
                                    "p99_tpot_ms": 1.0}}) + "\n")
    assert cli.main(argv + ["--report-only"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1] == "python -m sglang.launch_server --page-size 16"
    assert (tmp_path / "report.md").exists()
