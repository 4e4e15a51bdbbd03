"""Content-hash properties (hypothesis): equal content -> equal hash (numpy or torch, any copy);
any one-byte change, a reshape or a dtype view of the same bytes, or another patch grid -> a
different hash. sha256 is the baseline (raw bytes only), so the layout properties hold for the
fast algorithms xxh3_128 and blake3."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.multimodal.hashing import HASH_ALGOS, feature_hash, pad_value_from_hash

FAST = ("xxh3_128", "blake3")


@st.composite
def features(draw):
    rows = draw(st.integers(1, 24))
    cols = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    dtype = draw(st.sampled_from([np.float32, np.float16, np.uint8, np.int32]))
    raw = draw(st.binary(min_size=rows * cols * np.dtype(dtype).itemsize, max_size=rows * cols * np.dtype(dtype).itemsize))
    return np.frombuffer(raw, dtype=dtype).reshape(rows, cols).copy()


@settings(max_examples=60, deadline=None)
@given(x=features(), algo=st.sampled_from(HASH_ALGOS))
def test_equal_content_equal_hash(x, algo):
    h = feature_hash(x, algo, (1, 2, 2))
    assert h == feature_hash(x.copy(), algo, (1, 2, 2))
    assert h == feature_hash(torch.from_numpy(x.copy()), algo, (1, 2, 2))
    assert h == feature_hash(np.asfortranarray(x), algo, (1, 2, 2))  # contiguity is not content
    assert pad_value_from_hash(h) == pad_value_from_hash(feature_hash(x.copy(), algo, (1, 2, 2)))


@settings(max_examples=80, deadline=None)
@given(x=features(), data=st.data(), algo=st.sampled_from(HASH_ALGOS))
def test_any_one_byte_change_changes_the_hash(x, data, algo):
    b = x.view(np.uint8).reshape(-1)
    i = data.draw(st.integers(0, b.size - 1))
    delta = data.draw(st.integers(1, 255))
    y = x.copy()
    yb = y.view(np.uint8).reshape(-1)
    yb[i] = (int(yb[i]) + delta) % 256
    assert feature_hash(x, algo) != feature_hash(y, algo)


@settings(max_examples=60, deadline=None)
@given(x=features(), algo=st.sampled_from(FAST))
def test_same_bytes_other_layout_changes_the_hash(x, algo):
    h = feature_hash(x, algo)
    assert h != feature_hash(x.reshape(-1), algo)
    if x.shape[1] > 1:
        assert h != feature_hash(x.reshape(x.shape[1], x.shape[0]) if x.shape[0] != x.shape[1] else x.reshape(-1, 1), algo)
    other = np.uint8 if x.dtype != np.uint8 else np.int8
    assert h != feature_hash(x.view(other), algo)  # same bytes read as another dtype
    assert feature_hash(x, algo, (1, 2, 8)) != feature_hash(x, algo, (1, 4, 4))  # same pixels, other grid


def test_bfloat16_hashes_its_bytes_and_dtype():
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6).to(torch.bfloat16)
    for algo in FAST:
        assert feature_hash(t, algo) == feature_hash(t.clone(), algo)
        assert feature_hash(t, algo) != feature_hash(t.view(torch.int16), algo)
    assert feature_hash(t, "sha256") == feature_hash(t.view(torch.int16), "sha256")  # baseline: bytes only
