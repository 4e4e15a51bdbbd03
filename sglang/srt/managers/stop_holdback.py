"""How much of a streamed output's end is held back because it may turn into a stop match.

A stop string or stop_regex match cuts the output before it; text already streamed cannot be taken back,
so a stream sends only the text that cannot be the beginning of a match."""

from __future__ import annotations

import regex

from sglang.srt.utils.text import partial_match_len

# the end of the text searched for a partial stop_regex match (a match is at most 64 tokens long)
_REGEX_HOLDBACK_CHARS = 1024


def stop_regex_holdback(text: str, patterns: list[str]) -> int:
    """Length of the longest suffix of `text` where a stop_regex match could begin: a match of the
    pattern that the text ends in the middle of (the `regex` module's partial matching)."""
    window = text[-_REGEX_HOLDBACK_CHARS:]
    best = 0
    for p in patterns:
        for m in regex.finditer(p, window, partial=True, overlapped=True):
            if m.partial:
                best = max(best, len(window) - m.start())
                break
    return best


def stop_holdback(text: str, stops: list[str], patterns: list[str]) -> int:
    return max(partial_match_len(text, stops), stop_regex_holdback(text, patterns) if patterns else 0)
