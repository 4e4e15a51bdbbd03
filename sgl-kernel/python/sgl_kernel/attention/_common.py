"""Argument checks shared by the attention wrappers. They read shapes, dtypes and devices only, never
tensor values, so calling them costs no host-device sync."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

_INDEX_DTYPES = (torch.int32, torch.int64)
# an FP8 KV cache (--kv-cache-dtype): the kernels convert K/V tiles to q's dtype as they load them; the
# caller folds the per-layer scales into q (k_scale) and the output (v_scale)
FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def check_heads(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q (*, Hq, D); k, v (*, Hk, D) with Hq a multiple of Hk; one float dtype, one device."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(
            f"{name}: expected q (*, Hq, D) and k, v (*, Hk, D); got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    if k.shape != v.shape:
        raise ValueError(f"{name}: k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    hq, d = q.shape[1], q.shape[2]
    hk = k.shape[1]
    if k.shape[2] != d:
        raise ValueError(f"{name}: head dim of q ({d}) and k/v ({k.shape[2]}) differ")
    if hk == 0 or hq % hk != 0:
        raise ValueError(f"{name}: query heads ({hq}) must be a positive multiple of kv heads ({hk})")
    for t, what in ((q, "q"), (k, "k"), (v, "v")):
        if not t.is_floating_point():
            raise ValueError(f"{name}: {what} must be a float tensor, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: {what} is on {t.device}, q on {q.device}")
    if k.dtype != v.dtype or (k.dtype != q.dtype and k.dtype not in FP8_KV_DTYPES):
        raise ValueError(f"{name}: q, k and v must share one dtype (or k and v be one FP8 dtype: an FP8 KV cache, "
                         f"read as q's dtype), got {q.dtype}, {k.dtype}, {v.dtype}")


def check_index(name: str, what: str, t: torch.Tensor, device: torch.device) -> None:
    if t.dim() != 1 or t.dtype not in _INDEX_DTYPES:
        raise ValueError(f"{name}: {what} must be 1-D int32/int64, got {tuple(t.shape)} {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name}: {what} is on {t.device}, q on {device}")


def check_indptr(name: str, what: str, t: torch.Tensor, device: torch.device) -> None:
    check_index(name, what, t, device)
    if t.shape[0] < 1:
        raise ValueError(f"{name}: {what} needs at least one entry (B + 1 with B >= 0)")


def unit_last_stride(t: torch.Tensor) -> torch.Tensor:
    """The kernels take any row/head strides but need the head dim contiguous."""
    return t if t.stride(-1) == 1 or t.numel() == 0 else t.contiguous()


def output(name: str, q: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """A fresh (like q) output, or `out` after checking it: same shape and device as q, float, and
    unit stride along D (any row/head strides)."""
    if out is None:
        return torch.empty_like(q, memory_format=torch.contiguous_format)
    if out.shape != q.shape or out.device != q.device or not out.is_floating_point():
        raise ValueError(
            f"{name}: out must be a float tensor of q's shape {tuple(q.shape)} on {q.device}; got "
            f"{tuple(out.shape)} {out.dtype} on {out.device}"
        )
    if out.numel() and out.stride(-1) != 1:
        raise ValueError(f"{name}: out must have unit stride along the head dim")
    return out


def require_kernel(name: str, q: torch.Tensor) -> None:
    """The Triton path runs on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1 (float32:
    the interpreter mishandles half precision)."""
    if q.is_cuda:
        return
    if os.environ.get("TRITON_INTERPRET", "") != "1":
        raise RuntimeError(
            f"{name} runs the Triton kernel: it needs CUDA tensors, or TRITON_INTERPRET=1 for CPU "
            f"tensors; use the pure-torch reference ({name.replace('_fwd', '_torch')}) here"
        )


FP32_PRECISIONS = ("tf32", "ieee")


def check_fp32_precision(name: str, value: str) -> None:
    if value not in FP32_PRECISIONS:
        raise ValueError(f"{name}: fp32_precision must be one of {FP32_PRECISIONS}, got {value!r}")


def dot_precision(dtype: torch.dtype, on_cuda: bool = True, fp32_precision: str = "tf32") -> str:
    """tl.dot's input precision. Half-precision inputs always take the tensor cores. float32 on CUDA
    takes them too (tf32) unless asked for "ieee": exact float32 dots run on the FMA units and spill
    at head_dim 128 on sm_90a. The interpreter (CPU) always computes exactly."""
    if dtype != torch.float32:
        return "tf32"
    return fp32_precision if on_cuda else "ieee"


def stride_unit(strides, element_size: int) -> int:
    """How many elements make 16 bytes, when every stride is a multiple of that (a kernel taking strides
    in that unit can prove 16-byte aligned rows and issue 128-bit loads); else 1 (the fallback launch)."""
    unit = max(1, 16 // element_size)
    return unit if all(x % unit == 0 for x in strides) else 1


@dataclass
class LaunchPlan:
    """One kernel launch, described before it happens: the launcher runs it, the machine-code report
    (`sgl_kernel.codegen_report`) compiles exactly the same specialization for a GPU it lacks."""

    kernel: Any  # a triton.JITFunction
    grid: tuple
    args: dict  # the kernel's runtime arguments by name, in any order
    constexprs: dict
    options: dict = field(default_factory=dict)  # num_warps, num_stages

    def launch(self) -> None:
        self.kernel[self.grid](**self.args, **self.constexprs, **self.options)
