"""What every quantization method shares: the refusal error, and the row/column layout of a linear
layer's local weight inside the checkpoint matrices it is cut from (TP shards, fused parts)."""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd


class QuantizationError(ValueError):
    """A checkpoint or flag asking for a quantization this engine cannot serve (one line, at start-up)."""


@dataclass(frozen=True)
class RowPart:
    """Rows [dst, dst + size) of the local weight are rows [src, src + size) of one checkpoint matrix."""

    dst: int
    src: int
    size: int


@dataclass(frozen=True)
class LinearLayout:
    """A linear layer's local weight (rows, cols) as cut from its checkpoint matrices: `parts` along the
    output rows (one per fused matrix: q/k/v, gate/up), and columns [col_src, col_src + cols)."""

    parts: tuple[RowPart, ...]
    col_src: int
    cols: int

    def row_granularity(self, block: int) -> int:
        """The largest divisor of `block` at which every part starts, in the local weight and in its
        checkpoint matrix: a scale kept per that many rows is then one checkpoint block's scale. (A part
        ends where the next starts, or at the end of the weight, where a partial group is fine.)"""
        g = block
        for p in self.parts:
            g = gcd(g, gcd(p.dst, p.src))
        return g

    def col_granularity(self, block: int) -> int:
        return gcd(block, self.col_src)
