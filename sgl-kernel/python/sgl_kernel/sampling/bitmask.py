"""Constrained decoding's token bitmask applied to a batch's logits, in place.

Arguments (R masked rows, V tokens):

- logits (B, >= V) float (any float dtype, any row stride, unit column stride): row rows[r] is masked.
- bitmask (R, >= ceil(V / 32)) int32, on the logits' device: bit j of word i of row r allows token
  32 i + j of logits row rows[r] (xgrammar's layout: `xgrammar.allocate_token_bitmask`). A row stride
  of `padded_words(V)` lets the kernel load 4 words at once.
- rows (R,) int32/int64 on the logits' device: distinct logits rows.
- vocab: tokens >= vocab are left as they are (the caller masks a padded head's extra columns).

A token whose bit is clear becomes -inf; every other logit keeps its bits (allowed tokens, tokens past
`vocab`, rows not listed).

`apply_token_bitmask` runs the Triton kernel (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1):
one pass reading only the packed words and storing -inf at the banned tokens, no (R, V) temporary.
`apply_token_bitmask_torch` is the pure-torch reference (an unpack to (R, V) booleans and a masked
fill; runs anywhere).
"""

from __future__ import annotations

import os

import torch

_NAME = "apply_token_bitmask"


def _check(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor, vocab: int) -> None:
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"{_NAME}: logits must be a (B, V) float tensor, got {tuple(logits.shape)} {logits.dtype}")
    if not 0 <= vocab <= logits.shape[1]:
        raise ValueError(f"{_NAME}: vocab {vocab} outside the logits' {logits.shape[1]} columns")
    if rows.dim() != 1 or rows.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{_NAME}: rows must be a 1-D int32/int64 tensor, got {tuple(rows.shape)} {rows.dtype}")
    words = (vocab + 31) // 32
    if bitmask.dim() != 2 or bitmask.dtype != torch.int32 or bitmask.shape[0] != rows.shape[0] \
            or bitmask.shape[1] < words:
        raise ValueError(f"{_NAME}: bitmask must be int32 ({rows.shape[0]}, >= {words}), got "
                         f"{tuple(bitmask.shape)} {bitmask.dtype}")
    if not (logits.device == bitmask.device == rows.device):
        raise ValueError(f"{_NAME}: tensors on different devices: {logits.device}, {bitmask.device}, {rows.device}")
    if logits.stride(1) != 1:
        raise ValueError(f"{_NAME}: logits must have unit column stride (it is masked in place)")


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor, vocab: int) -> None:
    """The Triton kernel (see the module docstring). Runs on CUDA tensors, or CPU tensors under
    TRITON_INTERPRET=1; raises otherwise."""
    _check(logits, bitmask, rows, vocab)
    if not logits.is_cuda and os.environ.get("TRITON_INTERPRET", "") != "1":
        raise RuntimeError(f"{_NAME} runs the Triton kernel: it needs CUDA tensors, or TRITON_INTERPRET=1 for "
                           "CPU tensors; use apply_token_bitmask_torch here")
    from sgl_kernel.sampling._bitmask_triton import apply_token_bitmask_triton

    if bitmask.shape[0] and bitmask.stride(1) != 1:
        bitmask = bitmask.contiguous()
    apply_token_bitmask_triton(logits, bitmask, rows.contiguous(), vocab)


def padded_words(vocab: int) -> int:
    """A bitmask row stride (in words) for the kernel's 128-bit loads: ceil(vocab / 32) rounded up to 16
    (the divisibility a launch can mark), e.g. 4,752 for V = 151,936. Any stride >= ceil(vocab / 32) works."""
    return -(-((vocab + 31) // 32) // 16) * 16


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def apply_token_bitmask_torch(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor, vocab: int) -> None:
    """Pure-torch reference: unpack each listed row's words to V booleans, masked fill, write back."""
    _check(logits, bitmask, rows, vocab)
    if rows.numel() == 0 or vocab == 0:
        return
    shifts = _SHIFTS.get(logits.device)
    if shifts is None:
        shifts = _SHIFTS[logits.device] = torch.arange(32, device=logits.device, dtype=torch.int32)
    words = (vocab + 31) // 32
    allowed = ((bitmask[:, :words].unsqueeze(-1) >> shifts) & 1).view(rows.shape[0], -1)[:, :vocab].bool()
    idx = rows.long()
    logits[idx, :vocab] = logits[idx, :vocab].masked_fill(~allowed, float("-inf"))
