"""What every quantization method shares: the refusal error, and the row/column layout of a linear
layer's local weight inside the checkpoint matrices it is cut from (TP shards, fused parts)."""

from __future__ import annotations

from sglang.srt.errors import ServeRefusal

from dataclasses import dataclass
from math import gcd


# the narrowest column group a block-FP8 GEMM takes (tl.dot's smallest tile); activation groups follow it
MIN_GROUP = 16


def column_groups_ok(in_features: int, tp_size: int, block: int) -> bool:
    """Row-parallel shards of `in_features` columns over `tp_size` ranks start on a grid of at least
    MIN_GROUP columns inside `block`-column scale blocks (rank 0 alone starts on a block)."""
    return in_features % tp_size == 0 and (tp_size == 1 or gcd(block, in_features // tp_size) >= MIN_GROUP)


def column_tp_sizes(in_features: int, block: int) -> list[int]:
    """The TP sizes up to 16 at which `in_features` columns can be served (for refusals that name them)."""
    return [t for t in (1, 2, 4, 8, 16) if column_groups_ok(in_features, t, block)]


class QuantizationError(ServeRefusal):
    """A checkpoint or flag asking for a quantization this engine cannot serve (one line, at start-up)."""


@dataclass(frozen=True)
class RowPart:
    """Rows [dst, dst + size) of the local weight are rows [src, src + size) of one checkpoint matrix,
    which has `total` rows in all (what its block-scale grid is checked against)."""

    dst: int
    src: int
    size: int
    total: int


@dataclass(frozen=True)
class LinearLayout:
    """A linear layer's local weight (rows, cols) as cut from its checkpoint matrices: `parts` along the
    output rows (one per fused matrix: q/k/v, gate/up), and columns [col_src, col_src + cols) of the
    `total_cols` every one of those matrices has."""

    parts: tuple[RowPart, ...]
    col_src: int
    cols: int
    total_cols: int

    def scale_shape(self, index: int, block: tuple[int, int]) -> tuple[int, int]:
        """The block-scale grid of part `index`'s checkpoint matrix: ceil(rows / bn) x ceil(cols / bk)."""
        return -(-self.parts[index].total // block[0]), -(-self.total_cols // block[1])

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
