"""mm-hash-precompute: switches, both hashing paths give identical hashes and pad values, the
tokenizer side hashes on the image pool (never on the caller's thread), the `hash` stage is timed
where the hashing happens, and the baseline sha256 path is unchanged."""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image

from sglang.srt.environ import envs
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.request_builder import RequestBuilder
from sglang.srt.multimodal import hashing
from sglang.srt.multimodal.hashing import (
    HASH_ALGOS,
    combined_hash,
    configured_hash_algo,
    ensure_item_hashes,
    feature_hash,
    pad_value_from_hash,
    precompute_hash_enabled,
    precompute_item_hashes,
    sha256_feature_hash,
)
from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem, MultimodalInputs
from sglang.srt.server_args import ServerArgs

PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


def _mm(n=3, patches=64, seed=0) -> MultimodalInputs:
    rng = np.random.default_rng(seed)
    return MultimodalInputs([
        MultimodalDataItem(Modality.IMAGE, rng.standard_normal((patches, 96), dtype=np.float32), (1, 8, patches // 8))
        for _ in range(n)
    ])


def _img(seed, w=96, h=64):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


@pytest.mark.parametrize("raw, want", [("0", "0"), ("1", "1"), ("auto", "auto"), (" AUTO ", "auto"), ("true", "1"),
                                       ("false", "0")])
def test_precompute_switch_parses(monkeypatch, raw, want):
    monkeypatch.setenv("SGLANG_MM_PRECOMPUTE_HASH", raw)
    assert envs.SGLANG_MM_PRECOMPUTE_HASH.get() == want
    assert precompute_hash_enabled() == (want != "0")  # auto resolves to on (measured; see the docs page)


def test_switch_defaults_and_bad_values(monkeypatch):
    monkeypatch.delenv("SGLANG_MM_PRECOMPUTE_HASH", raising=False)
    monkeypatch.delenv("SGLANG_MM_HASH_ALGO", raising=False)
    assert precompute_hash_enabled() and configured_hash_algo() == "xxh3_128"
    monkeypatch.setenv("SGLANG_MM_PRECOMPUTE_HASH", "0")
    assert configured_hash_algo() == "sha256"  # switch off, algorithm unset: exactly the baseline
    monkeypatch.setenv("SGLANG_MM_HASH_ALGO", "blake3")
    assert configured_hash_algo() == "blake3"
    monkeypatch.setenv("SGLANG_MM_HASH_ALGO", "md5")
    with pytest.raises(ValueError, match="SGLANG_MM_HASH_ALGO"):
        configured_hash_algo()
    monkeypatch.setenv("SGLANG_MM_PRECOMPUTE_HASH", "2")
    with pytest.raises(ValueError, match="SGLANG_MM_PRECOMPUTE_HASH"):
        precompute_hash_enabled()


def test_sha256_is_the_baseline_function():
    x = np.random.default_rng(1).standard_normal((16, 12), dtype=np.float32)
    want = int.from_bytes(hashlib.sha256(x.tobytes()).digest()[:8], "little")
    assert sha256_feature_hash(x) == want == feature_hash(x, "sha256") == feature_hash(torch.from_numpy(x), "sha256")
    mm = _mm(2)
    ensure_item_hashes(mm, "sha256")
    assert [it.hash for it in mm.mm_items] == [sha256_feature_hash(it.feature) for it in mm.mm_items]


@pytest.mark.parametrize("algo", HASH_ALGOS)
def test_both_paths_give_identical_hashes_and_pad_values(algo):
    tok, sched, serial = _mm(seed=3), _mm(seed=3), _mm(seed=3)
    with ThreadPoolExecutor(4) as pool:
        assert precompute_item_hashes(tok, algo, pool) == 3
    assert ensure_item_hashes(sched, algo) == 3
    precompute_item_hashes(serial, algo, None)
    for a, b, c in zip(tok.mm_items, sched.mm_items, serial.mm_items):
        assert a.hash == b.hash == c.hash and a.pad_value == b.pad_value == c.pad_value == pad_value_from_hash(a.hash)
        assert 0 <= a.pad_value < hashing.PAD_VALUE_MODULUS
    # The scheduler's check after the tokenizer computed: nothing left to do, nothing changed.
    before = [(it.hash, it.pad_value) for it in tok.mm_items]
    assert ensure_item_hashes(tok, algo) == 0
    assert [(it.hash, it.pad_value) for it in tok.mm_items] == before


def test_check_fills_only_what_is_missing():
    mm = _mm(3)
    mm.mm_items[0].hash = 12345
    mm.mm_items[1].hash, mm.mm_items[1].pad_value = 7, 99
    assert ensure_item_hashes(mm, "xxh3_128") == 1
    assert (mm.mm_items[0].hash, mm.mm_items[0].pad_value) == (12345, 12345)
    assert (mm.mm_items[1].hash, mm.mm_items[1].pad_value) == (7, 99)
    assert mm.mm_items[2].hash == feature_hash(mm.mm_items[2].feature, "xxh3_128", mm.mm_items[2].image_grid_thw)


def test_scheduler_check_uses_the_configured_algorithm(monkeypatch):
    """An item reaching the scheduler unhashed gets the hash the tokenizer would have given it."""
    monkeypatch.delenv("SGLANG_MM_PRECOMPUTE_HASH", raising=False)
    monkeypatch.setenv("SGLANG_MM_HASH_ALGO", "blake3")
    a, b = _mm(seed=5), _mm(seed=5)
    ensure_item_hashes(a)
    precompute_item_hashes(b, "blake3")
    assert [it.hash for it in a.mm_items] == [it.hash for it in b.mm_items]


def test_tokenizer_side_hashes_on_the_pool_not_the_calling_thread(monkeypatch):
    threads = []
    inner = hashing.item_hash

    def spy(item, algo):
        threads.append(threading.current_thread().name)
        return inner(item, algo)

    monkeypatch.setattr(hashing, "item_hash", spy)
    with ThreadPoolExecutor(3, thread_name_prefix="pool") as pool:
        precompute_item_hashes(_mm(4), "xxh3_128", pool)
    assert len(threads) == 4 and all(t.startswith("pool") for t in threads)


def test_combined_hash_keeps_baseline_bytes_and_takes_wide_hashes():
    small = [1, 2**63 + 5]
    packed = b"".join(h.to_bytes(8, "little") for h in small)
    assert combined_hash(small) == int.from_bytes(hashlib.sha256(packed).digest()[:8], "little")
    wide = [2**100 + 1, 3]
    assert combined_hash(wide) != combined_hash(wide[::-1])


# ---------------------------------------------------------------------- through RequestBuilder.build
@pytest.fixture(scope="module")
def model_path(tiny_model_dir):
    return str(tiny_model_dir("qwen3-vl-tiny"))


def _build(model_path, monkeypatch, precompute: str, algo: str | None, timer: bool = False):
    monkeypatch.setenv("SGLANG_MM_PRECOMPUTE_HASH", precompute)
    if algo is None:
        monkeypatch.delenv("SGLANG_MM_HASH_ALGO", raising=False)
    else:
        monkeypatch.setenv("SGLANG_MM_HASH_ALGO", algo)
    # inline transport: the pixels stay in the message, so the scheduler-side hash can be recomputed from
    # it here (and no shared-memory segment is created without a scheduler to unlink it)
    monkeypatch.setenv("SGLANG_MM_SHM_TRANSPORT", "0")
    builder = RequestBuilder(ServerArgs(model_path=model_path, enable_vlm_stage_timer=timer,
                                        mm_feature_transport="cpu"), model_path)
    try:
        obj = GenerateReqInput(text="look " + PLACEHOLDER + " and " + PLACEHOLDER, image_data=[_img(1), _img(2, 64, 96)],
                               sampling_params={"max_new_tokens": 2})
        tokenized, _ = builder.build(builder.check(obj, "rid-1"))
    finally:
        builder.close()
    return tokenized


@pytest.mark.parametrize("algo", HASH_ALGOS)
def test_build_precomputes_what_the_scheduler_would_compute(model_path, monkeypatch, algo):
    on = _build(model_path, monkeypatch, "1", algo)
    off = _build(model_path, monkeypatch, "0", algo)
    assert all(it.hash is None and it.pad_value is None for it in off.mm_inputs.mm_items)  # baseline: not hashed here
    assert ensure_item_hashes(off.mm_inputs, algo) == 2
    got = [(it.hash, it.pad_value) for it in on.mm_inputs.mm_items]
    assert got == [(it.hash, it.pad_value) for it in off.mm_inputs.mm_items]
    assert got[0] != got[1]


def test_build_times_hash_where_it_runs(model_path, monkeypatch):
    on = _build(model_path, monkeypatch, "1", None, timer=True)
    assert {"processor", "hash"} <= set(on.stage_timings_ms)
    off = _build(model_path, monkeypatch, "0", None, timer=True)
    assert "hash" not in off.stage_timings_ms and "processor" in off.stage_timings_ms
