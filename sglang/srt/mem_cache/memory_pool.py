"""Memory pools: request -> token-slot table, and the per-layer KV buffers indexed by token slot."""

from __future__ import annotations

import threading
from itertools import chain
from typing import Sequence

import torch

from sglang.srt.utils.host_tensors import host_int64


class ReqToTokenPool:
    """Row r maps the token positions of the request in slot r to KV-pool slots.

    The table lives on the model's device; the scheduler's writes (host tensors) are queued by `write`
    (a run of one row) and `write_cells` (one cell per row: a decode step's slots) and applied by
    `apply_pending` at the start of the next forward, all in one host-to-device copy and one scatter,
    instead of a copy per request. A row's queued cells are dropped when the row is freed, so a later
    owner of the row never receives them (and one scatter never holds two values for one cell). The queue
    has a lock: with the overlap scheduler the forward thread applies it while the scheduler thread queues
    the next step's writes (applied early, they touch only cells no running step reads)."""

    def __init__(self, size: int, max_context_len: int, device: str | torch.device = "cpu"):
        self.size = size
        self.max_context_len = max_context_len
        self.device = torch.device(device)
        self.req_to_token = torch.zeros(size, max_context_len, dtype=torch.int64, device=device)
        self._free = list(range(size))
        # queued writes: (rows, cols, slots), cell (rows[i], cols[i]) := slots[i]
        self._pending: list[tuple[Sequence[int], Sequence[int], torch.Tensor]] = []
        self._lock = threading.Lock()

    def write(self, index: int, start: int, slots: torch.Tensor) -> None:
        """Row `index`, columns [start, start + len(slots)) := slots (applied before the next forward)."""
        n = slots.numel()
        if n:
            self._queue(([index] * n, range(start, start + n), slots))

    def write_cells(self, rows: list[int], cols: list[int], slots: torch.Tensor) -> None:
        """Cell (rows[i], cols[i]) := slots[i] for every i, as one queued entry (applied before the next
        forward); a decode step writes each request's new slot so, without a Python step per request."""
        if rows:
            self._queue((rows, cols, slots))

    def _queue(self, write: tuple[Sequence[int], Sequence[int], torch.Tensor]) -> None:
        rows, cols, slots = write
        write = (rows, cols, slots.reshape(-1).to("cpu", torch.int64))
        with self._lock:
            self._pending.append(write)

    def apply_pending(self) -> None:
        if not self._pending:
            return
        with self._lock:
            pending, self._pending = self._pending, []
        rows = list(chain.from_iterable(w[0] for w in pending))
        cols = list(chain.from_iterable(w[1] for w in pending))
        vals = pending[0][2] if len(pending) == 1 else torch.cat([w[2] for w in pending])
        host = torch.cat([host_int64(rows + cols), vals])
        if self.device.type == "cuda":
            host = host.pin_memory()
        dev = host.to(self.device, non_blocking=True).view(3, -1)
        self.req_to_token[dev[0], dev[1]] = dev[2]

    def available_size(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        return self._free.pop() if self._free else None

    def free(self, index: int) -> None:
        if index in self._free:
            raise RuntimeError(f"request slot {index} freed twice")
        with self._lock:
            self._pending = [kept for w in self._pending if (kept := _without_row(w, index)) is not None]
        self._free.append(index)


def _without_row(write: tuple[Sequence[int], Sequence[int], torch.Tensor], index: int):
    """A queued write without its cells in row `index`; None when nothing is left of it."""
    rows, cols, slots = write
    if index not in rows:
        return write
    keep = [i for i, r in enumerate(rows) if r != index]
    if not keep:
        return None
    return [rows[i] for i in keep], [cols[i] for i in keep], slots[keep]


class MHATokenToKVPool:
    """K and V buffers of shape (size + 1, kv_heads, head_dim) per layer; slot 0 is a padding sink.

    `dtype` an FP8 type (--kv-cache-dtype fp8_*): entries are stored divided by the layer's scale and
    saturated; readers multiply back through `kv_scales` (mem_cache/kv_cache_dtype.py)."""

    def __init__(self, size: int, head_num: int, head_dim: int, layer_num: int, dtype: torch.dtype, device="cpu",
                 kv_scales: dict[int, list[float]] | None = None):
        self.size = size
        self.head_num = head_num
        self.head_dim = head_dim
        self.dtype = dtype
        self.fp8_max = torch.finfo(dtype).max if dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else None
        self.scales = [tuple((kv_scales or {}).get(i, (1.0, 1.0))) for i in range(layer_num)]
        shape = (size + 1, head_num, head_dim)
        self.k_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layer_num)]
        self.v_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layer_num)]

    def kv_scales(self, layer_id: int) -> tuple[float, float]:
        """(k_scale, v_scale): a stored entry times its scale is the value written."""
        return self.scales[layer_id]

    def _store(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        if self.fp8_max is None:
            return x.to(self.dtype)
        if scale != 1.0:
            x = x.float() / scale
        return x.clamp(-self.fp8_max, self.fp8_max).to(self.dtype)  # a plain cast turns overflow into NaN

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[layer_id]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        ks, vs = self.scales[layer_id]
        self.k_buffer[layer_id][loc] = self._store(k, ks)
        self.v_buffer[layer_id][loc] = self._store(v, vs)

    def bytes_per_token(self) -> int:
        elem = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * len(self.k_buffer) * self.head_num * self.head_dim * elem
