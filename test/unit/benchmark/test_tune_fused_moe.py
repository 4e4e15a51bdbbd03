"""benchmark/kernels/fused_moe_triton/ on CPU: tune_fused_moe.py refuses to tune without a GPU, and its
--smoke mode (a tiny shape, two candidates, under the Triton interpreter) writes an upstream-named file
that the engine's config lookup then reads; bench_fused_moe.py runs its rows on the tiny preset."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
SCRIPTS = Path(__file__).resolve().parents[3] / "benchmark" / "kernels" / "fused_moe_triton"


def _tuner(name="tune_fused_moe"):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is what a CPU host sees")
def test_refuses_without_a_gpu(capsys):
    with pytest.raises(SystemExit) as e:
        _tuner().main(["--preset", "qwen3-vl-30b-a3b"])
    assert e.value.code == 2 and "tuning needs a CUDA GPU" in capsys.readouterr().err


def test_smoke_writes_a_file_the_lookup_reads(tmp_path, monkeypatch):
    from sgl_kernel.moe import configs

    path = _tuner().main(["--smoke", "--out-dir", str(tmp_path)])
    assert path.name == "E=4,N=16,device_name=cpu,dtype=float32.json"
    table = json.loads(path.read_text())
    assert set(table) == {"1", "8"} and set(table["1"]) == {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K",
                                                           "GROUP_SIZE_M", "num_warps", "num_stages"}
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(tmp_path))
    configs.load_configs.cache_clear()
    try:
        assert configs.pick_config(2, 2, 4, 16, "float32", "cpu") == configs.to_launch(table["1"])
    finally:
        configs.load_configs.cache_clear()


def test_per_rank_shapes_follow_tp_and_ep():
    mod = _tuner()
    ap = lambda *a: type("A", (), dict(smoke=False, preset="qwen3-vl-30b-a3b", tp_size=a[0], ep_size=a[1]))  # noqa: E731
    assert mod.shape_of(ap(1, 1)) == (128, 2048, 768, 8)
    assert mod.shape_of(ap(4, 2)) == (64, 2048, 384, 8)
    assert mod.shape_of(ap(8, 8)) == (16, 2048, 768, 8)
    with pytest.raises(SystemExit):
        mod.shape_of(ap(4, 3))


def test_bench_rows_on_the_tiny_preset():
    rows = _tuner("bench_fused_moe").main(["--preset", "qwen3-vl-moe-tiny", "--tokens", "1", "5", "--ep", "1", "2",
                                           "--fp8", "--reps", "1", "--threads", "1", "--device", "cpu"])
    assert [(r["path"], r["ep"], r["tokens"]) for r in rows][:4] == [
        ("torch float32", 1, 1), ("fp8 w8a8", 1, 1), ("torch float32", 1, 5), ("fp8 w8a8", 1, 5)]
    assert all(r["ms"] > 0 and r["experts"] <= 8 // r["ep"] for r in rows)


def test_smoke_fp8_names_the_file_as_upstream(tmp_path):
    path = _tuner().main(["--smoke", "--dtype", "fp8_w8a8", "--out-dir", str(tmp_path)])
    assert path.name == "E=4,N=16,device_name=cpu,dtype=fp8_w8a8,block_shape=[128, 128].json"
    assert set(json.loads(path.read_text())) == {"1", "8"}
