"""`gather_blend_rows` torch path (the fallback used wherever the Triton kernel cannot run) against a
plain sequential float32 sum, and the dispatcher's argument checks."""

import pytest
import torch

from sgl_kernel.vision import gather_blend_rows, gather_blend_rows_torch


def reference(table, idx, weights):
    """sum_k table[idx[:, k]] * weights[:, k], accumulated in float32 in tap order."""
    out = torch.zeros(idx.shape[0], table.shape[1], dtype=torch.float32)
    for k in range(idx.shape[1]):
        out = out + table[idx[:, k].long()].float() * weights[:, k : k + 1]
    return out


def _inputs(v, d, n, taps, dtype=torch.float32, idx_dtype=torch.int32, seed=0):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(v, d, generator=g).to(dtype)
    idx = torch.randint(0, v, (n, taps), generator=g).to(idx_dtype)
    weights = torch.rand(n, taps, generator=g)
    return table, idx, weights


@pytest.mark.parametrize("v,d,n,taps", [(1, 1, 1, 1), (36, 32, 50, 4), (2304, 72, 333, 4), (49, 300, 17, 16)])
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
def test_torch_path_matches_reference_float32(v, d, n, taps, idx_dtype):
    table, idx, w = _inputs(v, d, n, taps, idx_dtype=idx_dtype)
    ref = reference(table, idx, w)
    out = gather_blend_rows_torch(table, idx, w)
    assert out.dtype == torch.float32 and out.shape == (n, d)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


def test_half_table_is_blended_in_float32():
    table, idx, w = _inputs(64, 40, 100, 4, dtype=torch.bfloat16)
    ref = reference(table, idx, w)
    out = gather_blend_rows_torch(table, idx, w, out_dtype=torch.float32)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    assert gather_blend_rows_torch(table, idx, w).dtype == torch.bfloat16


def test_empty_rows():
    table, idx, w = _inputs(8, 5, 0, 4)
    assert gather_blend_rows(table, idx, w).shape == (0, 5)


def test_auto_backend_on_cpu_is_the_torch_path():
    table, idx, w = _inputs(16, 8, 9, 4)
    assert torch.equal(gather_blend_rows(table, idx, w), gather_blend_rows_torch(table, idx, w))


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda t, i, w: (t, i, w[:, :2]), "expected table"),
        (lambda t, i, w: (t, i.float(), w), "int32/int64"),
        (lambda t, i, w: (t, i, w.double()), "float32"),
        (lambda t, i, w: (t[0], i, w), "expected table"),
    ],
)
def test_bad_arguments_fail_loudly(change, match):
    args = change(*_inputs(8, 4, 3, 4))
    with pytest.raises(ValueError, match=match):
        gather_blend_rows(*args, backend="torch")


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown backend"):
        gather_blend_rows(*_inputs(8, 4, 3, 4), backend="cuda")
