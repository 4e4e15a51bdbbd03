"""Counting aten ops under a TorchDispatchMode: how much tensor work a call does, independent of the
machine's speed. Used by tests that hold an op count flat across batch sizes, and by benchmarks that
report how many full passes over a large tensor (a (B, vocab) logits row block) a step makes.

    result, n, by_op = count_aten_ops(lambda: step(batch))
    result, passes = count_large_passes(lambda: sampler(logits, info), min_numel=logits.numel())

Every op dispatched to aten while `fn` runs is counted once (views and in-place ops included; an op
that a composite decomposes into several is counted as those several). Ops run inside
`torch.inference_mode` count the same as outside it."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def _op_name(func) -> str:
    return func._overloadpacket.__name__


class _AtenOpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[_op_name(func)] += 1
        return func(*args, **(kwargs or {}))


class _LargePassCounter(TorchDispatchMode):
    def __init__(self, min_numel: int):
        super().__init__()
        self.min_numel = min_numel
        self.count = 0
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        tensors = [x for x in tree_leaves((args, kwargs, out)) if isinstance(x, torch.Tensor)]
        if any(t.numel() >= self.min_numel for t in tensors):
            self.count += 1
            self.ops[_op_name(func)] += 1
        return out


def count_aten_ops(fn: Callable[[], Any]) -> tuple[Any, int, Counter]:
    """Runs `fn()`; returns (its result, the number of aten ops it dispatched, a Counter by op name)."""
    counter = _AtenOpCounter()
    with counter:
        result = fn()
    return result, sum(counter.ops.values()), counter.ops


def count_large_passes(fn: Callable[[], Any], min_numel: int, by_op: bool = False):
    """Runs `fn()`; returns (its result, the number of aten ops with any input or output tensor of at
    least `min_numel` elements). Views of a large tensor count too (they are ops on it); with
    `by_op=True`, a third element: a Counter of those ops by name."""
    counter = _LargePassCounter(min_numel)
    with counter:
        result = fn()
    if by_op:
        return result, counter.count, counter.ops
    return result, counter.count
