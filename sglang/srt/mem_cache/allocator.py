"""Free-slot allocator over the token KV pool (slot 0 is never handed out)."""

from __future__ import annotations

import torch


class TokenToKVPoolAllocator:
    def __init__(self, size: int, device: str | torch.device = "cpu"):
        self.size = size
        self.device = device
        self.clear()

    def clear(self) -> None:
        self._free = torch.arange(1, self.size + 1, dtype=torch.int64, device=self.device)

    def available_size(self) -> int:
        return int(self._free.numel())

    def alloc(self, n: int) -> torch.Tensor | None:
        if n > self._free.numel():
            return None
        out, self._free = self._free[:n], self._free[n:]
        return out

    def free(self, indices: torch.Tensor) -> None:
        if indices.numel():
            self._free = torch.cat([self._free, indices.to(self._free.device)])
