"""sglang.testing.op_count: aten op counts and passes over large tensors."""

from __future__ import annotations

import torch

from sglang.testing.op_count import count_aten_ops, count_large_passes


def test_count_aten_ops_returns_result_count_and_names():
    x = torch.ones(4, 3)
    result, n, by_op = count_aten_ops(lambda: (x + 1).mul_(2).sum())
    assert float(result) == 48.0
    assert by_op["add"] == 1 and by_op["mul_"] == 1  # in-place ops keep their aten name and by_op["sum"] == 1
    assert n == sum(by_op.values()) == 3


def test_count_aten_ops_grows_with_a_per_row_loop_and_not_with_a_vector_op():
    def per_row(x):
        for row in x:
            row.add_(1)
        return x

    _, loop1, _ = count_aten_ops(lambda: per_row(torch.zeros(1, 3)))
    _, loop8, _ = count_aten_ops(lambda: per_row(torch.zeros(8, 3)))
    _, vec1, _ = count_aten_ops(lambda: torch.zeros(1, 3).add_(1))
    _, vec8, _ = count_aten_ops(lambda: torch.zeros(8, 3).add_(1))
    assert loop8 > loop1 and vec8 == vec1


def test_count_aten_ops_sees_ops_under_inference_mode():
    def fn():
        with torch.inference_mode():
            return torch.arange(5).cumsum(0)

    result, n, by_op = count_aten_ops(fn)
    assert result.tolist() == [0, 1, 3, 6, 10] and by_op["cumsum"] == 1 and n >= 2


def test_count_large_passes_counts_only_ops_touching_a_large_tensor():
    big = torch.randn(8, 1000)
    small = torch.randn(8, 1)

    def fn():
        s = small * 2  # small only: not counted
        y = big - s  # big input: counted
        m = y.max(dim=-1).values  # big input, small output: counted
        return m + s.squeeze(1)  # small: not counted

    result, passes = count_large_passes(fn, min_numel=big.numel())
    assert result.shape == (8,) and passes == 2
    # the output side counts too: a large tensor made from small inputs
    _, passes = count_large_passes(lambda: small.expand(8, 1000).contiguous(), min_numel=8000)
    assert passes >= 1
    _, passes, by_op = count_large_passes(fn, min_numel=big.numel(), by_op=True)
    assert passes == 2 and set(by_op) == {"sub", "max"}


def test_count_large_passes_threshold_is_inclusive():
    x = torch.zeros(10)
    _, at, = count_large_passes(lambda: x + 1, min_numel=10)
    _, above = count_large_passes(lambda: x + 1, min_numel=11)
    assert at == 1 and above == 0
