"""A device-agnostic allocator of byte ranges inside one fixed-size buffer.

It only does arithmetic on offsets: the buffer itself (a CUDA allocation, a shared-memory segment) is
someone else's. Policy: every slice starts at a multiple of `alignment` and its size is rounded up to
one; the lowest free block that fits is used (first fit); a freed slice merges with free neighbours
on both sides, so freeing everything always leaves one block spanning the whole buffer.

Not thread-safe by itself: the owner (`CudaIpcPool`) serializes calls under its lock.
"""

from __future__ import annotations

import bisect


class SliceAllocator:
    def __init__(self, capacity: int, alignment: int = 512):
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.alignment = alignment
        self.capacity = capacity - capacity % alignment  # a tail shorter than one alignment is never used
        # free blocks as two parallel lists sorted by offset (bisect on offsets)
        self._free_off: list[int] = [0] if self.capacity else []
        self._free_len: list[int] = [self.capacity] if self.capacity else []
        self._used: dict[int, int] = {}  # offset -> rounded size
        self.free_bytes = self.capacity

    def round_up(self, nbytes: int) -> int:
        a = self.alignment
        return max(a, (nbytes + a - 1) // a * a)

    def alloc(self, nbytes: int) -> int | None:
        """Offset of a new slice of at least `nbytes` (aligned), or None when no free block fits."""
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        size = self.round_up(nbytes)
        if size > self.free_bytes:
            return None
        for i, length in enumerate(self._free_len):
            if length >= size:
                off = self._free_off[i]
                if length == size:
                    del self._free_off[i], self._free_len[i]
                else:
                    self._free_off[i] = off + size
                    self._free_len[i] = length - size
                self._used[off] = size
                self.free_bytes -= size
                return off
        return None

    def free(self, offset: int) -> int:
        """Returns the slice at `offset` to the free list (merged with its neighbours); its size."""
        size = self._used.pop(offset, None)
        if size is None:
            raise KeyError(f"no allocated slice at offset {offset}")
        i = bisect.bisect_left(self._free_off, offset)
        start, length = offset, size
        if i < len(self._free_off) and self._free_off[i] == offset + size:  # merge with the next block
            length += self._free_len[i]
            del self._free_off[i], self._free_len[i]
        if i > 0 and self._free_off[i - 1] + self._free_len[i - 1] == offset:  # merge with the previous one
            self._free_len[i - 1] += length
        else:
            self._free_off.insert(i, start)
            self._free_len.insert(i, length)
        self.free_bytes += size
        return size

    def size_of(self, offset: int) -> int:
        return self._used[offset]

    def reset(self) -> int:
        """Frees every slice at once (shutdown); returns how many were still allocated."""
        n = len(self._used)
        self.__init__(self.capacity, self.alignment)
        return n

    @property
    def num_allocated(self) -> int:
        return len(self._used)

    def free_blocks(self) -> list[tuple[int, int]]:
        return list(zip(self._free_off, self._free_len))

    def largest_free_block(self) -> int:
        return max(self._free_len, default=0)

    def check(self) -> None:
        """Asserts the invariants (tests): blocks tile the buffer without overlap, free blocks are
        never adjacent (coalesced), offsets aligned, byte counts consistent."""
        spans = sorted([(o, n, "free") for o, n in zip(self._free_off, self._free_len)]
                       + [(o, n, "used") for o, n in self._used.items()])
        pos, prev_kind = 0, None
        for off, n, kind in spans:
            assert off == pos, f"gap or overlap at {pos}: next span starts at {off}"
            assert off % self.alignment == 0 and n % self.alignment == 0 and n > 0
            assert not (kind == "free" and prev_kind == "free"), f"adjacent free blocks at {off}"
            pos, prev_kind = off + n, kind
        assert pos == self.capacity, f"spans end at {pos}, capacity {self.capacity}"
        assert self.free_bytes == sum(self._free_len)
        assert self._free_off == sorted(self._free_off)
