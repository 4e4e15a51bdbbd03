"""Small text helpers shared by the streaming parsers and stop-string handling."""

from __future__ import annotations

from typing import Iterable


def partial_match_len(text: str, patterns: Iterable[str]) -> int:
    """Length of the longest end of `text` that is a proper prefix of one of `patterns`: text a stream
    holds back because the next characters may complete the pattern."""
    best = 0
    for p in patterns:
        for k in range(min(len(p) - 1, len(text)), best, -1):
            if text.endswith(p[:k]):
                best = k
                break
    return best
