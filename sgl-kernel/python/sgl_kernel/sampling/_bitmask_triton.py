"""Triton kernel behind `apply_token_bitmask`. Imported lazily: triton is optional, and `triton.jit` decides
compiled vs interpreted (TRITON_INTERPRET=1) when this module is imported.

Grid (R, word blocks): program (r, b) reads BLOCK_WORDS consecutive int32 words of bitmask row r and
writes -inf to the logits of row rows[r] whose bit is clear, as one (BLOCK_WORDS, 32) tile of predicated
stores. The logits are never read: a token's new value does not depend on its old one, so the traffic is
the packed mask (V / 8 bytes a row) plus the banned tokens' stores. No matrix work: no tensor cores.

Each thread loads 4 consecutive words in one 128-bit load when the bitmask's row stride is a multiple of
16 words (`padded_words`: the launch then marks it divisible) and the word count is a multiple of 4
(every Qwen vocabulary: 4,748 and 4,752 words); otherwise 32-bit loads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel.attention._common import LaunchPlan


@triton.jit
def _bitmask_kernel(
    logits_ptr, stride_logits,
    bitmask_ptr, stride_bitmask,
    rows_ptr,
    VOCAB: tl.constexpr,
    BLOCK_WORDS: tl.constexpr,
):
    r = tl.program_id(0)
    row = tl.load(rows_ptr + r).to(tl.int64)
    w = tl.program_id(1) * BLOCK_WORDS + tl.arange(0, BLOCK_WORDS)
    # words past the row's end read as all-allowed (-1): nothing to write there. The bound is in words, not
    # tokens (w * 32 < VOCAB), so the compiler sees the mask constant over 4 words and vectorises the load.
    words = tl.load(bitmask_ptr + r.to(tl.int64) * stride_bitmask + w, mask=w < (VOCAB + 31) // 32, other=-1)
    bit = tl.arange(0, 32)
    cols = w[:, None] * 32 + bit[None, :]  # (BLOCK_WORDS, 32): token 32 w + j is bit j of word w
    banned = (((words[:, None] >> bit[None, :]) & 1) == 0) & (cols < VOCAB)
    inf = tl.full((BLOCK_WORDS, 32), float("-inf"), logits_ptr.dtype.element_ty)
    tl.store(logits_ptr + row * stride_logits + cols, inf, mask=banned)


def _words(vocab: int, on_cuda: bool) -> int:
    """Words per program: 256 on CUDA (8,192 tokens; 19 programs a row at V = 151,936, so even one row
    spreads over 19 SMs), with 2 warps: 4 words a thread, one 128-bit load. Fewer under the interpreter,
    where a smaller tile is faster."""
    return min(256 if on_cuda else 16, triton.next_power_of_2(max((vocab + 31) // 32, 1)))


def plan_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor, vocab: int,
                 on_cuda: bool) -> LaunchPlan:
    """The launch (shapes, strides and dtypes only: meta tensors do, for the machine-code report)."""
    words = _words(vocab, on_cuda)
    n_words = (vocab + 31) // 32
    return LaunchPlan(
        _bitmask_kernel, (rows.shape[0], triton.cdiv(n_words, words)),
        dict(logits_ptr=logits, stride_logits=logits.stride(0), bitmask_ptr=bitmask,
             stride_bitmask=bitmask.stride(0), rows_ptr=rows),
        dict(VOCAB=vocab, BLOCK_WORDS=words),
        dict(num_warps=2) if on_cuda else {},
    )


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor, vocab: int) -> None:
    """Launches the kernel; arguments already checked by `apply_token_bitmask` (unit column strides)."""
    if rows.shape[0] == 0 or vocab == 0:
        return
    plan_bitmask(logits, bitmask, rows, vocab, logits.is_cuda).launch()
