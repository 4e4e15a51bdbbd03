"""Tensor-parallel group description handed down through constructors (no module-global state)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TPInfo:
    """Where this process sits in its tensor-parallel group.

    `group` is the torch.distributed process group for tensor collectives (None when size == 1);
    `cpu_group` is the gloo group used for object broadcasts.
    """

    rank: int = 0
    size: int = 1
    group: Any = None
    cpu_group: Any = None

    def __post_init__(self):
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tp rank {self.rank} out of range for tp size {self.size}")


SINGLE_RANK = TPInfo()


def divide(numerator: int, denominator: int) -> int:
    if numerator % denominator != 0:
        raise ValueError(f"{numerator} is not divisible by tensor-parallel size {denominator}")
    return numerator // denominator
