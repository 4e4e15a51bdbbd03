"""The Triton `gather_blend_rows` kernel: on CPU under the Triton interpreter in float32 (the
interpreter mishandles bf16), and on CUDA in every dtype (tests marked `gpu`). Skipped as a whole
where triton is not installed."""

import pytest
import torch

pytest.importorskip("triton")

from sgl_kernel.testing import interpreted  # noqa: E402
from sgl_kernel.vision import gather_blend_rows, gather_blend_rows_torch  # noqa: E402
from test_gather_blend_torch import _inputs, reference  # noqa: E402

KERNEL_MODULE = "sgl_kernel.vision._pos_embed_triton"
# (V, D, N, taps): tiny, the Qwen3-VL table at tiny width, a row count that is not a block multiple,
# D spanning several column blocks and not a power of two, and bicubic-sized bags
SHAPES = [(1, 1, 1, 1), (2304, 32, 48, 4), (36, 72, 37, 4), (49, 600, 21, 4), (16, 24, 5, 16)]


@pytest.fixture
def interp():
    # Function scope: the interpreted module leaves sys.modules after each test, so a later CUDA test
    # imports the compiled kernel.
    with interpreted(KERNEL_MODULE) as mod:
        yield mod


@pytest.mark.parametrize("v,d,n,taps", SHAPES)
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
def test_interpreted_kernel_matches_reference_float32(interp, v, d, n, taps, idx_dtype):
    table, idx, w = _inputs(v, d, n, taps, idx_dtype=idx_dtype, seed=v + n)
    out = interp.gather_blend_rows_triton(table, idx, w, torch.float32)
    torch.testing.assert_close(out, reference(table, idx, w), rtol=1e-6, atol=1e-6)


def test_dispatcher_forced_to_triton_uses_the_kernel(interp):
    table, idx, w = _inputs(40, 24, 30, 4)
    out = gather_blend_rows(table, idx, w, backend="triton")
    torch.testing.assert_close(out, gather_blend_rows_torch(table, idx, w), rtol=1e-6, atol=1e-6)


def test_non_contiguous_inputs(interp):
    table, idx, w = _inputs(30, 20, 12, 4)
    wide = torch.zeros(30, 40)
    wide[:, ::2] = table
    out = gather_blend_rows(wide[:, ::2], idx.t().contiguous().t(), w, backend="triton")
    torch.testing.assert_close(out, reference(table, idx, w), rtol=1e-6, atol=1e-6)


def test_empty_rows(interp):
    table, idx, w = _inputs(8, 5, 0, 4)
    assert interp.gather_blend_rows_triton(table, idx, w, torch.float32).shape == (0, 5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("v,d,n,taps", SHAPES + [(2304, 1152, 96_000, 4)])
def test_cuda_kernel_matches_torch_path(v, d, n, taps, dtype):
    table, idx, w = (t.cuda() for t in _inputs(v, d, n, taps, dtype=dtype))
    out = gather_blend_rows(table, idx, w, backend="triton", out_dtype=torch.float32)
    ref = gather_blend_rows_torch(table, idx, w, out_dtype=torch.float32)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    rounded = gather_blend_rows(table, idx, w)  # auto picks the kernel on CUDA; output in table dtype
    assert rounded.dtype == dtype
    torch.testing.assert_close(rounded.float(), ref.to(dtype).float(), rtol=1e-2, atol=1e-2)
