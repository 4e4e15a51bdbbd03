"""Block FP8: the torch references (also the CPU path), and the Triton kernels against them on CPU under
the Triton interpreter (hypothesis over shapes, partial blocks included) and on CUDA (marked `gpu`)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sgl_kernel.quantization import (
    FP8_E4M3_MAX,
    dequantize_block_fp8,
    per_token_group_quant_fp8,
    per_token_group_quant_fp8_torch,
    quantize_weight_block_fp8,
    w8a8_block_fp8_matmul,
    w8a8_block_fp8_matmul_torch,
)

KERNEL_MODULE = "sgl_kernel.quantization._fp8_triton"
SETTINGS = settings(max_examples=25, deadline=None, database=None)
E4M3 = torch.float8_e4m3fn


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def _x(m: int, k: int, seed: int, scale: float = 4.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * scale
    if m and k:
        x[0, : min(k, 5)] = 0.0  # a row starting with zeros (an all-zero group when k <= 5)
    return x


def test_group_quant_scales_each_group_to_the_e4m3_range():
    x = _x(3, 300, 0)
    q, s = per_token_group_quant_fp8_torch(x, 128)
    assert q.dtype == E4M3 and q.shape == (3, 300) and s.shape == (3, 3)
    for g, (lo, hi) in enumerate(((0, 128), (128, 256), (256, 300))):
        torch.testing.assert_close(s[:, g], x[:, lo:hi].abs().amax(dim=1) / FP8_E4M3_MAX)
        assert (q[:, lo:hi].float().abs().amax(dim=1) == FP8_E4M3_MAX).all()  # each group's largest hits 448
    deq = dequantize_block_fp8(q, s, (1, 128))
    assert ((deq - x).abs() <= x.abs() * 2 ** -4 + 1e-6).all()  # e4m3 keeps 3 mantissa bits: half a step


def test_an_all_zero_group_quantizes_to_zeros_with_a_tiny_scale():
    q, s = per_token_group_quant_fp8_torch(torch.zeros(2, 40), 16)
    assert (q.float() == 0).all() and (s > 0).all() and torch.isfinite(s).all()


def test_weight_blocks_round_trip_within_half_an_e4m3_step():
    w = _x(200, 300, 1, 0.05)
    q, s = quantize_weight_block_fp8(w, (128, 128))
    assert s.shape == (2, 3)
    deq = dequantize_block_fp8(q, s, (128, 128))
    assert ((deq - w).abs() <= w.abs() * 2 ** -4 + s.repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)[:, :300] * 2 ** -9).all()


def test_the_reference_product_is_dequantize_then_matmul():
    x, w = _x(9, 256, 2), _x(130, 256, 3, 0.05)
    a_q, a_s = per_token_group_quant_fp8_torch(x, 128)
    b_q, b_s = quantize_weight_block_fp8(w)
    out = w8a8_block_fp8_matmul_torch(a_q, a_s, b_q, b_s)
    expect = dequantize_block_fp8(a_q, a_s, (1, 128)) @ dequantize_block_fp8(b_q, b_s).t()
    torch.testing.assert_close(out, expect)
    # and it approximates the float32 product (two 3-bit mantissas)
    exact = x @ w.t()
    assert (out - exact).abs().mean() < 0.08 * exact.abs().mean()


def test_bad_operands_are_refused_by_name():
    a_q, a_s = per_token_group_quant_fp8_torch(_x(4, 256, 4), 128)
    b_q, b_s = quantize_weight_block_fp8(_x(128, 256, 5))
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        w8a8_block_fp8_matmul_torch(a_q.float(), a_s, b_q, b_s)
    with pytest.raises(ValueError, match="do not fit"):
        w8a8_block_fp8_matmul_torch(a_q, a_s[:, :1], b_q, b_s)
    with pytest.raises(ValueError, match="columns"):
        w8a8_block_fp8_matmul_torch(a_q, a_s, b_q[:, :128], b_s)


# ----------------------------------------------------------------------------- the kernels, interpreted
@pytest.fixture
def interp():
    pytest.importorskip("triton")
    from sgl_kernel.testing import interpreted

    with interpreted(KERNEL_MODULE) as mod:
        yield mod


@SETTINGS
@given(m=st.integers(1, 40), k=st.integers(1, 300), group=st.sampled_from([16, 32, 128]), seed=st.integers(0, 99))
def test_interpreted_group_quant_equals_the_reference_bit_for_bit(m, k, group, seed):
    pytest.importorskip("triton")
    from sgl_kernel.testing import interpreted

    x = _x(m, k, seed)
    with interpreted(KERNEL_MODULE) as mod:
        q, s = mod.per_token_group_quant_fp8_triton(x, group)
    qr, sr = per_token_group_quant_fp8_torch(x, group)
    assert torch.equal(s, sr) and torch.equal(_bits(q), _bits(qr))


@SETTINGS
@given(m=st.integers(1, 40), n=st.integers(1, 80), k=st.integers(1, 200),
       block=st.sampled_from([(16, 16), (32, 32), (16, 32), (128, 128)]), seed=st.integers(0, 99))
def test_interpreted_block_fp8_matmul_equals_the_reference(m, n, k, block, seed):
    """Equal to within float32 accumulation order: the kernel scales each K block's partial product, the
    reference dequantizes first."""
    pytest.importorskip("triton")
    from sgl_kernel.testing import interpreted

    a_q, a_s = per_token_group_quant_fp8_torch(_x(m, k, seed), block[1])
    b_q, b_s = quantize_weight_block_fp8(_x(n, k, seed + 1, 0.05), block)
    with interpreted(KERNEL_MODULE) as mod:
        out = mod.w8a8_block_fp8_matmul_triton(a_q, a_s, b_q, b_s, block, torch.float32)
    ref = w8a8_block_fp8_matmul_torch(a_q, a_s, b_q, b_s, block)
    assert out.shape == (m, n)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * max(1.0, ref.abs().max().item()))


def test_the_dispatchers_forced_to_triton_use_the_kernels(interp):
    x = _x(5, 256, 7)
    q, s = per_token_group_quant_fp8(x, backend="triton")
    qr, sr = per_token_group_quant_fp8_torch(x)
    assert torch.equal(_bits(q), _bits(qr)) and torch.equal(s, sr)
    b_q, b_s = quantize_weight_block_fp8(_x(128, 256, 8, 0.05))
    out = w8a8_block_fp8_matmul(q, s, b_q, b_s, out_dtype=torch.float32, backend="triton")
    torch.testing.assert_close(out, w8a8_block_fp8_matmul_torch(q, s, b_q, b_s), rtol=1e-5, atol=1e-4)


def test_auto_takes_the_torch_path_for_cpu_tensors():
    x = _x(3, 128, 9)
    q, s = per_token_group_quant_fp8(x)
    assert torch.equal(_bits(q), _bits(per_token_group_quant_fp8_torch(x)[0]))


# ----------------------------------------------------------------------------- CUDA
gpu = pytest.mark.gpu


@gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 17, 64, 300])
@pytest.mark.parametrize("n,k", [(4096, 2560), (2560, 4096), (1216, 2560), (640, 384)])
def test_cuda_kernels_equal_the_reference(m, n, k):
    pytest.importorskip("triton")
    torch.manual_seed(m + n)
    x = (torch.randn(m, k) * 3).cuda().to(torch.bfloat16)
    q, s = per_token_group_quant_fp8(x)
    qr, sr = per_token_group_quant_fp8_torch(x)
    assert torch.equal(s, sr)
    bad = (_bits(q) != _bits(qr)).nonzero().tolist()
    assert not bad, [(x[i, j].item(), s[i, j // 128].item(), x[i, j].item() / s[i, j // 128].item(),
                      q[i, j].float().item(), qr[i, j].float().item()) for i, j in bad[:6]] + [len(bad)]
    b_q, b_s = quantize_weight_block_fp8((torch.randn(n, k) * 0.02).cuda())
    out = w8a8_block_fp8_matmul(q, s, b_q, b_s, out_dtype=torch.float32)
    ref = w8a8_block_fp8_matmul_torch(q, s, b_q, b_s)
    # Hopper's fp8 tensor-core dots accumulate with fewer mantissa bits than float32 inside each K block
    # (hence the per-block scale-and-add in float32): off the reference by up to ~2.4e-4 of max|ref| at
    # these shapes (H200, 2026-11-26), against exact float32 sums in the reference
    torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-3 * ref.abs().max().item())
    bf = w8a8_block_fp8_matmul(q, s, b_q, b_s)
    assert bf.dtype == torch.bfloat16
    torch.testing.assert_close(bf.float(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())
