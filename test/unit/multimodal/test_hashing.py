"""MMHashConfig: both hashing switches resolved together into one frozen value; the module-level
helpers are views of it."""

from __future__ import annotations

import dataclasses

import pytest

from sglang.srt.multimodal.hashing import (
    BASELINE_HASH_ALGO,
    DEFAULT_HASH_ALGO,
    HASH_ALGOS,
    MMHashConfig,
    configured_hash_algo,
    precompute_hash_enabled,
)


@pytest.mark.parametrize("precompute, algo, want", [
    (None, None, MMHashConfig(True, DEFAULT_HASH_ALGO)),
    ("auto", None, MMHashConfig(True, DEFAULT_HASH_ALGO)),
    ("0", None, MMHashConfig(False, BASELINE_HASH_ALGO)),
    ("0", "blake3", MMHashConfig(False, "blake3")),
    ("1", "sha256", MMHashConfig(True, "sha256")),
])
def test_from_env(monkeypatch, precompute, algo, want):
    for name, value in (("SGLANG_MM_PRECOMPUTE_HASH", precompute), ("SGLANG_MM_HASH_ALGO", algo)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    cfg = MMHashConfig.from_env()
    assert cfg == want
    assert (precompute_hash_enabled(), configured_hash_algo()) == (cfg.precompute, cfg.algo)


def test_defaults_and_validation():
    assert MMHashConfig() == MMHashConfig(True, DEFAULT_HASH_ALGO) and DEFAULT_HASH_ALGO in HASH_ALGOS
    with pytest.raises(ValueError, match="md5"):
        MMHashConfig(algo="md5")
    with pytest.raises(dataclasses.FrozenInstanceError):
        MMHashConfig().algo = "sha256"
