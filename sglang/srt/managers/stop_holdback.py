"""How much of a streamed output's end is held back because it may turn into a stop match.

A stop string or stop_regex match cuts the output before it; text already streamed cannot be taken back,
so a stream sends only the text that cannot be the beginning of a match. This runs on the HTTP event loop
for every chunk: the stop_regex part is bounded in time (sampling/stop_regex.py), and a pattern that once
runs out of time is not searched again for this request: its stream holds back the whole searched end."""

from __future__ import annotations

from sglang.srt.sampling.stop_regex import HOLDBACK_CHARS, StopRegexError, partial_match_start
from sglang.srt.utils.text import partial_match_len


class StopHoldback:
    def __init__(self, stops: list[str], patterns: list[str]):
        self.stops = list(stops)
        self.patterns = list(patterns)
        self.regex_exhausted = False  # a partial-match search ran out of time once

    def length(self, text: str) -> int:
        held = partial_match_len(text, self.stops)
        if not self.patterns:
            return held
        if not self.regex_exhausted:
            try:
                return max(held, partial_match_start(text, self.patterns))
            except StopRegexError:
                self.regex_exhausted = True
        return max(held, min(len(text), HOLDBACK_CHARS))
