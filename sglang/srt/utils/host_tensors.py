"""Host (CPU) tensors from flat Python lists, converted in C by `array` rather than by torch's per-element
object parsing: what a decode step builds for every request, every step."""

from __future__ import annotations

from array import array

import torch


def host_int64(values: list) -> torch.Tensor:
    """The 1-D host int64 tensor of a flat list of ints, as torch.as_tensor(values, dtype=torch.int64) makes it,
    converted by `array` (a few instructions per element in C) instead of torch's per-element object parsing
    (about 1,000 instructions each). What `array` refuses (floats, ints past int64) is left to torch, which
    then converts or raises as it always did. The tensor shares the array's memory and keeps it alive."""
    try:
        buf = array("q", values)
    except (TypeError, OverflowError):
        return torch.as_tensor(values, dtype=torch.int64)
    return torch.frombuffer(buf, dtype=torch.int64) if buf else torch.empty(0, dtype=torch.int64)


def host_float32(values: list) -> torch.Tensor:
    """`host_int64` for float32: each Python float rounded to float32 by the same C cast torch applies."""
    try:
        buf = array("f", values)
    except (TypeError, OverflowError):
        return torch.as_tensor(values, dtype=torch.float32)
    return torch.frombuffer(buf, dtype=torch.float32) if buf else torch.empty(0, dtype=torch.float32)
