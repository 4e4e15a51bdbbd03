"""bench_qwen3_5's capacity formulas are the model runner's: KV bytes per token and state bytes per row
of the tiny presets equal the pools the runner builds, and at 4B the hybrid model holds more tokens."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_qwen3_5", REPO / "benchmark/performance/bench_qwen3_5.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("preset", ["qwen3.5-tiny", "qwen3.5-moe-tiny", "qwen3-vl-tiny"])
def test_capacity_formulas_equal_the_runners_pools(bench, tiny_model_dir, preset):
    from sglang.testing.presets import get_preset

    bench.check_against_runner(tiny_model_dir(preset), get_preset(preset))  # asserts inside


def test_the_4b_hybrid_holds_more_tokens_even_after_its_state(bench):
    budget = 40 << 30
    vl, hybrid = (bench.capacity(p, budget, 128) for p in bench.PAIR)
    assert hybrid["kv_bytes_per_token"] * 4.5 == vl["kv_bytes_per_token"]  # 8 of 32 layers, 4 vs 8 kv heads x 2
    assert hybrid["state_bytes_per_row"] > 0 and vl["state_bytes_per_row"] == 0
    assert vl["kv_tokens"] < hybrid["kv_tokens"] < hybrid["kv_tokens_without_state"]
