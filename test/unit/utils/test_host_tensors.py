"""host_int64 / host_float32 make the tensor torch.as_tensor makes from the same flat list, values and dtype,
including the cases `array` refuses and leaves to torch."""

from __future__ import annotations

import random

import pytest
import torch

from sglang.srt.utils.host_tensors import host_float32, host_int64


def test_int64_equals_torch_on_random_lists():
    rng = random.Random(7)
    for n in (0, 1, 5, 300):
        values = [rng.randint(-2**63, 2**63 - 1) for _ in range(n)]
        got = host_int64(values)
        assert got.dtype == torch.int64 and got.shape == (n,)
        assert torch.equal(got, torch.as_tensor(values, dtype=torch.int64))


def test_float32_rounds_as_torch_does():
    rng = random.Random(8)
    values = [rng.uniform(-1e6, 1e6) for _ in range(257)] + [1 / 3, 1e-40, 0.0, -0.0]
    got = host_float32(values)
    assert got.dtype == torch.float32
    assert torch.equal(got, torch.as_tensor(values, dtype=torch.float32))


def test_what_array_refuses_goes_to_torch():
    assert torch.equal(host_int64([1.0, 2.0]), torch.as_tensor([1.0, 2.0], dtype=torch.int64))
    with pytest.raises(Exception) as torch_error:
        torch.as_tensor([2**64], dtype=torch.int64)
    with pytest.raises(torch_error.type):  # whatever torch raises for an int past int64, unchanged
        host_int64([2**64])
    assert torch.equal(host_float32([1, 2**70]), torch.as_tensor([1, 2**70], dtype=torch.float32))


def test_tensor_outlives_its_list():
    values = list(range(100))
    t = host_int64(values)
    del values
    assert t.sum().item() == sum(range(100))
