"""Weight values are generated in independently seeded blocks by a thread pool: the bytes do not
depend on the thread count (sglang.testing.weight_gen, make_model --threads)."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from sglang.testing import make_model as mm
from sglang.testing import weight_gen
from sglang.testing.presets import get_preset

TINY = "qwen3-vl-tiny"


def _hashes(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_thread_count_does_not_change_bytes(tmp_path, dtype):
    a = mm.make_model("qwen2.5-vl-tiny", tmp_path / "t1", dtype=dtype, threads=1, progress=False)
    b = mm.make_model("qwen2.5-vl-tiny", tmp_path / "t3", dtype=dtype, threads=3, progress=False)
    assert _hashes(a) == _hashes(b)


def test_thread_count_does_not_change_bytes_with_small_blocks(tmp_path, monkeypatch):
    """Scaled-down blocks: every tensor spans many blocks and sub-chunks that do not divide it."""
    monkeypatch.setattr(weight_gen, "BLOCK_ELEMS", 4096)
    monkeypatch.setattr(weight_gen, "SUB_ELEMS", 1000)
    specs = mm.tensor_specs(TINY)
    assert max(weight_gen.TensorValues(s, get_preset(TINY), 0, "float32").num_blocks for s in specs) > 1000
    a = mm.make_model(TINY, tmp_path / "t1", dtype="bfloat16", threads=1, progress=False)
    b = mm.make_model(TINY, tmp_path / "t3", dtype="bfloat16", threads=3, progress=False)
    assert _hashes(a) == _hashes(b)


SMALL_SPECS = [
    weight_gen.TensorSpec("w", (37, 53), weight_gen.WEIGHT),
    weight_gen.TensorSpec("conv", (5, 3, 2, 4, 4), weight_gen.WEIGHT),
    weight_gen.TensorSpec("b", (301,), weight_gen.BIAS),
    weight_gen.TensorSpec("n", (129,), weight_gen.NORM),
    weight_gen.TensorSpec("pos", (16, 24), weight_gen.EMBED),
    weight_gen.TensorSpec("emb", (151700, 3), weight_gen.VOCAB),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_blocks_are_thread_and_order_independent(monkeypatch, dtype):
    monkeypatch.setattr(weight_gen, "BLOCK_ELEMS", 500)
    monkeypatch.setattr(weight_gen, "SUB_ELEMS", 77)
    p = get_preset(TINY)

    def serial(d):
        return {s.name: np.concatenate(list(weight_gen.iter_tensor_chunks(s, p, 5, d))) for s in SMALL_SPECS}

    def parallel(threads):
        got: dict[str, list] = {}
        for spec, block in weight_gen.iter_blocks(SMALL_SPECS, p, 5, dtype, threads):
            got.setdefault(spec.name, []).append(block)
        return {k: np.concatenate(v) for k, v in got.items()}

    ref = serial(dtype)
    for threads in (1, 3):
        got = parallel(threads)
        assert list(got) == [s.name for s in SMALL_SPECS]
        for s in SMALL_SPECS:
            assert got[s.name].size == s.numel and np.array_equal(got[s.name], ref[s.name]), (threads, s.name)
    # a block is a pure function of its index: filled alone, in reverse order, it is the same
    tv = weight_gen.TensorValues(SMALL_SPECS[-1], p, 5, dtype)
    assert tv.num_blocks > 3
    rev = [tv.block(i) for i in reversed(range(tv.num_blocks))][::-1]
    assert np.array_equal(np.concatenate(rev), ref["emb"])
    if dtype != "float32":  # half dtypes are the float32 values rounded (round to nearest even)
        f32 = serial("float32")
        tdt = getattr(torch, dtype)
        for s in SMALL_SPECS:
            half = torch.from_numpy(ref[s.name].view(np.int16)).view(tdt) if dtype == "bfloat16" else \
                torch.from_numpy(ref[s.name])
            assert torch.equal(half, torch.from_numpy(f32[s.name]).to(tdt)), s.name


def test_block_statistics():
    """Scales per kind as before the blocked generator: std, norm mean 1, vocab filler rows shrunk."""
    p = get_preset("qwen3-vl-2b")
    init = p.init
    for spec, mean, std in [
        (weight_gen.TensorSpec("w", (2048, 2048), weight_gen.WEIGHT), 0.0, init.weight_std),
        (weight_gen.TensorSpec("b", (300_000,), weight_gen.BIAS), 0.0, init.bias_std),
        (weight_gen.TensorSpec("n", (300_000,), weight_gen.NORM), 1.0, init.norm_noise_std),
    ]:
        x = np.concatenate(list(weight_gen.iter_tensor_chunks(spec, p, 0, "float32"))).astype(np.float64)
        assert abs(x.mean() - mean) < 0.01 * std and abs(x.std() / std - 1) < 0.01, spec.name
    from sglang.testing.tokenizer_builder import trained_vocab_size

    emb = weight_gen.TensorSpec("emb", (151936, 8), weight_gen.VOCAB)
    x = np.concatenate(list(weight_gen.iter_tensor_chunks(emb, p, 0, "float32"))).reshape(emb.shape)
    n = trained_vocab_size()
    assert abs(x[:n].std() / init.embed_std - 1) < 0.02
    assert abs(x[n:151643].std() / (init.embed_std * init.unused_vocab_scale) - 1) < 0.02


def test_ordered_map_keeps_order_and_propagates_errors():
    first_may_finish = threading.Event()

    def fn(i):
        if i == 0:
            assert first_may_finish.wait(timeout=30)  # item 0 finishes after item 2
        if i == 2:
            first_may_finish.set()
        if i == 9:
            raise ValueError("boom")
        return i * i

    it = weight_gen.ordered_map(fn, range(20), threads=3)
    assert [next(it) for _ in range(9)] == [i * i for i in range(9)]
    with pytest.raises(ValueError, match="boom"):
        next(it)
    with pytest.raises(ValueError):
        list(weight_gen.ordered_map(fn, range(3), threads=0))

    # closing early: nothing beyond the window was started
    started: list = []
    it = weight_gen.ordered_map(lambda i: started.append(i) or i, range(1000), threads=2, window=4)
    assert next(it) == 0
    it.close()
    assert len(started) <= 5



def test_cli_rejects_zero_threads():
    with pytest.raises(SystemExit):
        mm.main(["--preset", TINY, "--out", "/nonexistent-unused", "--threads", "0"])
