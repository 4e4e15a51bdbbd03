"""The pure-torch sampling reference and the wrapper's checks (no triton needed): the hash against a
scalar Python transcription, the kept sets against per-token brute force, and draws that follow the
filtered distribution."""

import os

import pytest
import torch

from sampling_inputs import distinct_logits
from sgl_kernel.sampling import hash_uniform_torch, sample_from_logits, sample_from_logits_torch

M = 0xFFFFFFFF


def _mix(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M
    x ^= x >> 15
    x = (x * 0x846CA68B) & M
    return x ^ (x >> 16)


def _uniform(seed: int, step: int, tok: int) -> float:
    s = seed & ((1 << 64) - 1)
    row = _mix((s & M) ^ _mix((s >> 32) ^ 0x9E3779B9))
    row = _mix(row ^ _mix((step & M) ^ 0x85EBCA6B))
    h24 = _mix((tok * 0x9E3779B1 + row) & M) >> 8
    u = float(torch.tensor(float(h24), dtype=torch.float32) + 0.5) / (1 << 24)
    return min(u, 1.0 - 2.0**-24)


def test_hash_matches_a_scalar_transcription():
    seeds = [0, 1, -1, 2**62, -(2**63), 98765432123]
    steps = [0, 5, 2**32 + 1, 3, 9, 2**40]
    u = hash_uniform_torch(torch.tensor(seeds), torch.tensor(steps), 300)
    for i, (s, t) in enumerate(zip(seeds, steps)):
        for tok in (0, 1, 77, 299):
            assert float(u[i, tok]) == _uniform(s, t, tok)
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0


def _kept(x: torch.Tensor, k: int, top_p: float, min_p: float) -> set[int]:
    """Brute force, token by token: mass and count of strictly larger logits."""
    p = torch.softmax(x.double(), -1)
    out = set()
    for i in range(x.shape[0]):
        bigger = x > x[i]
        if (k >= 1 and int(bigger.sum()) >= k) or (top_p < 1 and float(p[bigger].sum()) >= top_p):
            continue
        if float(p[i]) < float(p.max()) * min_p:
            continue
        out.add(i)
    return out


@pytest.mark.parametrize("k,top_p,min_p,temp", [(5, 1.0, 0.0, 1.0), (60, 0.7, 0.0, 1.0), (60, 0.93, 0.0, 0.5),
                                                (60, 1.0, 0.1, 1.5), (3, 0.4, 0.2, 1.0)])
def test_reference_draws_only_and_all_of_the_kept_set(k, top_p, min_p, temp):
    v, n = 60, 800
    logits = distinct_logits(1, v, seed=k).expand(n, v)
    x = logits[0] / temp
    kept = _kept(x, k, top_p, min_p)
    full = lambda val, dt=torch.float32: torch.full((n,), val, dtype=dt)  # noqa: E731
    ids = sample_from_logits_torch(logits, full(temp), full(k, torch.int64), full(top_p), full(min_p),
                                   torch.arange(n), torch.zeros(n, dtype=torch.int64))
    assert set(ids.tolist()) <= kept
    # every kept token with at least 2% of the kept mass shows up
    p = torch.softmax(x.double(), -1)
    mass = sum(float(p[i]) for i in kept)
    assert {i for i in kept if float(p[i]) / mass > 0.02} <= set(ids.tolist())


def test_reference_frequencies_follow_the_filtered_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05] + [1e-4] * 20)
    n = 6000
    logits = probs.log().expand(n, -1)
    full = lambda val, dt=torch.float32: torch.full((n,), val, dtype=dt)  # noqa: E731
    ids = sample_from_logits_torch(logits, full(1.0), full(3, torch.int64), full(1.0), full(0.0),
                                   torch.arange(n) * 7919, torch.full((n,), 4, dtype=torch.int64))
    freq = torch.bincount(ids, minlength=24).double() / n
    assert torch.allclose(freq[:3], torch.tensor([0.5, 0.3, 0.15], dtype=torch.float64) / 0.95, atol=0.03), freq
    assert float(freq[3:].sum()) == 0.0


def _args(b=2, v=10):
    return [torch.randn(b, v), torch.ones(b), torch.full((b,), 3), torch.ones(b), torch.zeros(b),
            torch.arange(b), torch.arange(b)]


@pytest.mark.parametrize("i,bad", [(0, torch.randn(10)), (0, torch.zeros(2, 10, dtype=torch.int64)),
                                   (1, torch.ones(3)), (1, torch.ones(2, 1)), (2, torch.ones(2)),
                                   (5, torch.arange(2, dtype=torch.int32)), (6, torch.ones(2))])
def test_wrapper_checks_shapes_and_dtypes(i, bad):
    args = _args()
    args[i] = bad
    for fn in (sample_from_logits, sample_from_logits_torch):
        with pytest.raises(ValueError):
            fn(*args)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter runs CPU tensors")
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only check")
def test_kernel_wrapper_refuses_cpu_without_the_interpreter():
    with pytest.raises(RuntimeError, match="sample_from_logits_torch"):
        sample_from_logits(*_args())
