"""Tensor-parallel group description handed down through constructors (no module-global state)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TPInfo:
    """Where this process sits in its tensor-parallel group.

    `group` is the torch.distributed process group for tensor collectives (None when size == 1);
    `cpu_group` is the gloo group used for object broadcasts.

    `ep_size` (--ep-size) splits the MoE experts over the group as upstream does: `ep_size` expert groups
    of `moe_tp_size = size / ep_size` consecutive ranks; rank r holds expert group r // moe_tp_size and
    shards those experts' intermediate dim over the moe_tp_size ranks of its group (index r % moe_tp_size).
    Everything else (attention, dense MLPs, the vision tower) stays sharded over all `size` ranks.
    """

    rank: int = 0
    size: int = 1
    group: Any = None
    cpu_group: Any = None
    ep_size: int = 1

    def __post_init__(self):
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tp rank {self.rank} out of range for tp size {self.size}")
        if self.ep_size < 1 or self.size % self.ep_size:
            raise ValueError(f"ep size {self.ep_size} must divide tp size {self.size}")

    @property
    def moe_tp_size(self) -> int:
        return self.size // self.ep_size

    @property
    def moe_tp_rank(self) -> int:
        return self.rank % self.moe_tp_size

    @property
    def moe_ep_rank(self) -> int:
        return self.rank // self.moe_tp_size


SINGLE_RANK = TPInfo()


def divide(numerator: int, denominator: int) -> int:
    if numerator % denominator != 0:
        raise ValueError(f"{numerator} is not divisible by tensor-parallel size {denominator}")
    return numerator // denominator


def init_tp_group(tp_size: int, tp_rank: int, init_addr: str, backend: str, timeout_s: float,
                  ep_size: int = 1) -> TPInfo:
    """Joins the server's torch.distributed group (one rank per TP worker, possibly across nodes) and
    creates the gloo CPU group used for object broadcasts. `timeout_s` bounds every collective, so a
    dead peer makes the others fail instead of waiting forever. `init_addr`: host:port of a TCP
    rendezvous (across nodes: torch's store listens on every interface), or file://PATH for ranks on one
    host (a file in the server's private directory: no listening socket at all)."""
    from datetime import timedelta

    import torch.distributed as dist

    if tp_size == 1:
        return TPInfo(ep_size=ep_size)
    timeout = timedelta(seconds=timeout_s)
    dist.init_process_group(
        backend=backend, init_method=init_addr if init_addr.startswith("file://") else f"tcp://{init_addr}",
        world_size=tp_size, rank=tp_rank, timeout=timeout
    )
    # its own communicator even on gloo: the scheduler thread broadcasts on it while the overlap
    # scheduler's forward thread runs the model's collectives on the TP group
    cpu_group = dist.new_group(backend="gloo", timeout=timeout)
    return TPInfo(rank=tp_rank, size=tp_size, group=dist.group.WORLD, cpu_group=cpu_group, ep_size=ep_size)
