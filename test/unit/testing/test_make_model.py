"""Tests for the deterministic random-weight model generator (sglang.testing.make_model): the bytes it
writes (seeds, dtypes, shards), the model cache and the CLI. The checkpoints in transformers:
``test_make_model_checkpoints.py``; names, shapes and counts: ``test_make_model_layout.py``."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from sglang.testing import make_model as mm

transformers = pytest.importorskip("transformers")
from transformers import Qwen2_5_VLForConditionalGeneration, Qwen3VLForConditionalGeneration  # noqa: E402

from make_model_utils import file_hashes  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_transformers")

REPO_ROOT = Path(__file__).resolve().parents[3]


# ----------------------------------------------------------------------------- determinism


def test_same_seed_identical_bytes(tmp_path, tiny_dirs):
    name = "qwen3-vl-tiny"
    again = mm.make_model(name, tmp_path / "again", progress=False)
    ref = {k: v for k, v in file_hashes(tiny_dirs[name]).items()}
    assert file_hashes(again) == ref


def test_same_seed_identical_bytes_across_processes(tmp_path, tiny_dirs):
    name = "qwen2.5-vl-tiny"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONHASHSEED="12345")
    out = tmp_path / "cli"
    r = subprocess.run(
        [sys.executable, "-m", "sglang.testing.make_model", "--preset", name, "--out", str(out), "--seed", "0"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert file_hashes(out) == file_hashes(tiny_dirs[name])


def test_different_seed_differs(tmp_path, tiny_dirs):
    name = "qwen3-vl-tiny"
    other = mm.make_model(name, tmp_path / "seed1", seed=1, progress=False)
    a, b = file_hashes(tiny_dirs[name]), file_hashes(other)
    assert a["model.safetensors"] != b["model.safetensors"]
    assert a["config.json"] == b["config.json"] and a["tokenizer.json"] == b["tokenizer.json"]
    w0 = load_file(tiny_dirs[name] / "model.safetensors")
    w1 = load_file(other / "model.safetensors")
    for k in w0:
        assert not torch.equal(w0[k], w1[k]), k


def test_tensor_seed_stable():
    # sha256-based, independent of PYTHONHASHSEED and of the process
    assert mm.tensor_seed(0, "lm_head.weight") == int.from_bytes(
        hashlib.sha256(b"0:lm_head.weight").digest()[:16], "little"
    )
    assert mm.tensor_seed(0, "a") != mm.tensor_seed(1, "a") != mm.tensor_seed(0, "b")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_dtypes_match_torch_rounding(tmp_path, tiny_dirs, dtype):
    name = "qwen2.5-vl-tiny"
    d = mm.make_model(name, tmp_path / dtype, dtype=dtype, progress=False)
    tdt = getattr(torch, dtype)
    half = load_file(d / "model.safetensors")
    full = load_file(tiny_dirs[name] / "model.safetensors")
    for k, v in full.items():
        assert half[k].dtype == tdt
        assert torch.equal(half[k], v.to(tdt)), k
    assert json.loads((d / "config.json").read_text())["dtype"] == dtype
    model, info = Qwen2_5_VLForConditionalGeneration.from_pretrained(d, output_loading_info=True)
    assert model.dtype == tdt and not info["missing_keys"] and not info["unexpected_keys"]


def test_bf16_conversion_exact():
    x = np.random.default_rng(0).standard_normal(100_000).astype(np.float32) * 3
    x[:4] = [0.0, -0.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8]  # ties round to even
    ours = torch.from_numpy(mm._float32_to_bf16_bits(x).view(np.int16)).view(torch.bfloat16)
    assert torch.equal(ours, torch.from_numpy(x).to(torch.bfloat16))


# ----------------------------------------------------------------------------- sharding


def test_sharded_output_loads_and_matches(tmp_path, tiny_dirs):
    name = "qwen3-vl-tiny"
    shard_limit = 4_000_000  # force several shards (the embedding alone is ~39 MB -> own shard)
    d = mm.make_model(name, tmp_path / "sharded", max_shard_bytes=shard_limit, progress=False)
    assert not (d / "model.safetensors").exists()
    index = json.loads((d / mm.SAFE_INDEX).read_text())
    shard_files = sorted(p.name for p in d.glob("model-*-of-*.safetensors"))
    n = len(shard_files)
    assert n >= 3
    assert shard_files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert set(index["weight_map"].values()) == set(shard_files)
    specs = mm.tensor_specs(name)
    assert set(index["weight_map"]) == {s.name for s in specs}
    assert index["metadata"]["total_size"] == sum(s.numel * 4 for s in specs)

    merged = {}
    for f in shard_files:
        with safe_open(str(d / f), framework="pt") as sf:
            keys = list(sf.keys())
            assert all(index["weight_map"][k] == f for k in keys)
            size = sum(sf.get_tensor(k).numel() * 4 for k in keys)
            assert size <= shard_limit or len(keys) == 1
            merged.update({k: sf.get_tensor(k) for k in keys})
    single = load_file(tiny_dirs[name] / "model.safetensors")
    assert merged.keys() == single.keys()
    for k in single:
        assert torch.equal(merged[k], single[k]), k

    model, info = Qwen3VLForConditionalGeneration.from_pretrained(d, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    sd = model.state_dict()
    for k, v in single.items():
        assert torch.equal(sd[k], v), k

    # Re-generating unsharded into the same dir removes the stale shards.
    mm.make_model(name, d, progress=False)
    assert not list(d.glob("model-*-of-*.safetensors")) and not (d / mm.SAFE_INDEX).exists()
    assert file_hashes(d)["model.safetensors"] == file_hashes(tiny_dirs[name])["model.safetensors"]


# ----------------------------------------------------------------------------- cache


def test_ensure_model_cache(tmp_path, tiny_dirs):
    cache = tmp_path / "cache"
    path = mm.ensure_model("qwen2.5-vl-tiny", cache_dir=cache, progress=False)
    assert path == cache / "qwen2.5-vl-tiny-seed0"
    assert file_hashes(path) == file_hashes(tiny_dirs["qwen2.5-vl-tiny"])
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert mm.ensure_model("qwen2.5-vl-tiny", cache_dir=cache) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime  # reused, not regenerated
    assert [p.name for p in cache.iterdir()] == [path.name]  # no temp dirs left behind

    # A stale/foreign directory (wrong stamp) is replaced.
    (path / mm.STAMP_FILE).write_text("{}")
    assert mm.ensure_model("qwen2.5-vl-tiny", cache_dir=cache, progress=False) == path
    assert json.loads((path / mm.STAMP_FILE).read_text())["preset"] == "qwen2.5-vl-tiny"
    assert [p.name for p in cache.iterdir()] == [path.name]

    other = mm.ensure_model("qwen2.5-vl-tiny", cache_dir=cache, seed=3, dtype="bfloat16", progress=False)
    assert other.name == "qwen2.5-vl-tiny-seed3-bfloat16"


def test_ensure_model_env_default(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_MODEL_CACHE", str(tmp_path / "envcache"))
    assert mm.default_cache_dir() == tmp_path / "envcache"
    monkeypatch.delenv("SGLANG_MODEL_CACHE")
    assert mm.default_cache_dir() == Path("~/.cache/sglang/models").expanduser()


def test_cli_list_and_errors(capsys):
    assert mm.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "qwen3-vl-4b" in out and "4,437,815,808" in out
    with pytest.raises(SystemExit):
        mm.main(["--preset", "qwen3-vl-tiny"])  # --out missing
    with pytest.raises(ValueError):
        mm.make_model("qwen3-vl-tiny", "/nonexistent-unused", dtype="int8")
