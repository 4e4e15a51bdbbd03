"""Block FP8: the torch references (also the CPU path) and the dispatchers to the Triton kernels.

Layout, as in Qwen's (and DeepSeek's) -FP8 checkpoints:
- a weight W (N, K) is stored as `W_q` in float8_e4m3fn plus `scale` (ceil(N/bn), ceil(K/bk)) in float32,
  W ~= W_q * scale[n // bn, k // bk] (the checkpoints call it `weight_scale_inv`: it is multiplied);
- an activation x (M, K) is quantized on the fly per token and group of `bk` columns:
  x_q = x / s, s = max(|x_group|) / 448 (e4m3's largest finite value), one s per (row, group);
- y = x W^T is then sum over k-groups of (x_q W_q^T over the group) * s[m, g] * scale[n // bn, g],
  accumulated in float32.

Shapes need not be block multiples: a partial last block or group is quantized over the columns it has.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sgl_kernel import pick_backend

FP8_E4M3_MAX = 448.0
FP8_DTYPE = torch.float8_e4m3fn
DEFAULT_GROUP = 128
_EPS = 1e-10  # an all-zero group gets this amax instead of a zero scale


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_2d(name: str, what: str, t: torch.Tensor) -> None:
    if t.dim() != 2:
        raise ValueError(f"{name}: {what} must be 2-D, got shape {tuple(t.shape)}")


def per_token_group_quant_fp8_torch(x: torch.Tensor, group_size: int = DEFAULT_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) float -> (x_q (M, K) float8_e4m3fn, scales (M, ceil(K/group)) float32)."""
    _check_2d("per_token_group_quant_fp8", "x", x)
    m, k = x.shape
    groups = _cdiv(k, group_size)
    xp = F.pad(x.float(), (0, groups * group_size - k)).view(m, groups, group_size)
    scale = xp.abs().amax(dim=-1).clamp_min(_EPS) / FP8_E4M3_MAX
    q = (xp / scale[..., None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8_DTYPE)
    return q.view(m, groups * group_size)[:, :k].contiguous(), scale


def quantize_weight_block_fp8(w: torch.Tensor, block: tuple[int, int] = (DEFAULT_GROUP, DEFAULT_GROUP)
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight (N, K) in the released layout: (W_q float8_e4m3fn (N, K), scale float32 per block)."""
    _check_2d("quantize_weight_block_fp8", "w", w)
    bn, bk = block
    n, k = w.shape
    gn, gk = _cdiv(n, bn), _cdiv(k, bk)
    wp = F.pad(w.float(), (0, gk * bk - k, 0, gn * bn - n)).view(gn, bn, gk, bk)
    scale = wp.abs().amax(dim=(1, 3)).clamp_min(_EPS) / FP8_E4M3_MAX
    q = (wp / scale[:, None, :, None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8_DTYPE)
    return q.view(gn * bn, gk * bk)[:n, :k].contiguous(), scale


def dequantize_block_fp8(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] = (DEFAULT_GROUP, DEFAULT_GROUP),
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """W_q (N, K) with its block scales -> W (N, K) in `dtype` (computed in float32)."""
    _check_2d("dequantize_block_fp8", "q", q)
    bn, bk = block
    n, k = q.shape
    if scale.shape != (_cdiv(n, bn), _cdiv(k, bk)):
        raise ValueError(f"dequantize_block_fp8: a ({n}, {k}) weight in {bn}x{bk} blocks needs scales of shape "
                         f"{(_cdiv(n, bn), _cdiv(k, bk))}, got {tuple(scale.shape)}")
    full = scale.float().repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]
    return (q.float() * full).to(dtype)


def _check_matmul(a_q, a_s, b_q, b_s, block) -> None:
    name = "w8a8_block_fp8_matmul"
    for t, what in ((a_q, "a_q"), (a_s, "a_s"), (b_q, "b_q"), (b_s, "b_s")):
        _check_2d(name, what, t)
        if t.device != a_q.device:
            raise ValueError(f"{name}: {what} is on {t.device}, a_q on {a_q.device}")
    if a_q.dtype != FP8_DTYPE or b_q.dtype != FP8_DTYPE:
        raise ValueError(f"{name}: a_q and b_q must be float8_e4m3fn, got {a_q.dtype} and {b_q.dtype}")
    if a_s.dtype != torch.float32 or b_s.dtype != torch.float32:
        raise ValueError(f"{name}: scales must be float32, got {a_s.dtype} and {b_s.dtype}")
    (m, k), (n, k2) = a_q.shape, b_q.shape
    bn, bk = block
    if k != k2:
        raise ValueError(f"{name}: a_q has {k} columns, b_q {k2}")
    if a_s.shape != (m, _cdiv(k, bk)) or b_s.shape != (_cdiv(n, bn), _cdiv(k, bk)):
        raise ValueError(f"{name}: scales {tuple(a_s.shape)} and {tuple(b_s.shape)} do not fit a ({m}, {k}) x "
                         f"({n}, {k}) product in {bn}x{bk} blocks")


def w8a8_block_fp8_matmul_torch(a_q: torch.Tensor, a_s: torch.Tensor, b_q: torch.Tensor, b_s: torch.Tensor,
                                block: tuple[int, int] = (DEFAULT_GROUP, DEFAULT_GROUP),
                                out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Reference and CPU path: both operands dequantized to float32, one matmul. (M, K) x (N, K) -> (M, N)."""
    _check_matmul(a_q, a_s, b_q, b_s, block)
    a = dequantize_block_fp8(a_q, a_s, (1, block[1]))
    b = dequantize_block_fp8(b_q, b_s, block)
    return (a @ b.t()).to(out_dtype)


def per_token_group_quant_fp8(x: torch.Tensor, group_size: int = DEFAULT_GROUP, backend: str = "auto"
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> (x_q, scales) as the torch reference; "auto": the Triton kernel for CUDA tensors."""
    if pick_backend(backend, x) == "torch":
        return per_token_group_quant_fp8_torch(x, group_size)
    _check_2d("per_token_group_quant_fp8", "x", x)
    from sgl_kernel.quantization._fp8_triton import per_token_group_quant_fp8_triton

    return per_token_group_quant_fp8_triton(x if x.stride(-1) == 1 else x.contiguous(), group_size)


def w8a8_block_fp8_matmul(a_q: torch.Tensor, a_s: torch.Tensor, b_q: torch.Tensor, b_s: torch.Tensor,
                          block: tuple[int, int] = (DEFAULT_GROUP, DEFAULT_GROUP), out_dtype: torch.dtype = torch.bfloat16,
                          backend: str = "auto") -> torch.Tensor:
    """(M, K) x (N, K)^T -> (M, N) in `out_dtype`, float32 accumulation; "auto": the Triton kernel on CUDA."""
    if pick_backend(backend, a_q) == "torch":
        return w8a8_block_fp8_matmul_torch(a_q, a_s, b_q, b_s, block, out_dtype)
    _check_matmul(a_q, a_s, b_q, b_s, block)
    from sgl_kernel.quantization._fp8_triton import w8a8_block_fp8_matmul_triton

    return w8a8_block_fp8_matmul_triton(a_q.contiguous(), a_s.contiguous(), b_q.contiguous(), b_s.contiguous(),
                                        block, out_dtype)
