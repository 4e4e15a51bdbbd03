"""Stop strings: the scheduler ends a request at the first step whose decoded output tail contains one.

The rule (`stop_in_tail`): after each output token, decode the last 8 + (longest stop string) tokens and
look for every stop string in that text. Decoding that window costs a tokenizer call per request and
step; `StopStrings` skips the call at the steps where the rule cannot fire, so the same token ends the
request as under the plain rule.

Why a skip is safe (byte-level BPE decoding, the Qwen tokenizers: the text of a token list is its
tokens' bytes, concatenated, read as UTF-8 with each invalid or truncated sequence replaced by U+FFFD,
with no clean-up of spaces afterwards):

1. Dropping the window's first token keeps the rest of the text, but for some U+FFFD at its start (the
   bytes after the dropped token resynchronise within one character). So with no U+FFFD in any stop
   string, a stop string absent from the previous window's text is absent from that text minus its
   first token. (The previous window had no stop string: otherwise the request would have ended.)
2. A token whose own text has no U+FFFD is a run of whole UTF-8 characters starting on a character
   boundary, so appending it appends exactly its own text `piece`.
3. Hence a stop string s can appear only if it ends inside `piece`: s is in `piece`, or a suffix of s
   shorter than s is a prefix of `piece`. When neither holds for any s, the window has no stop string.

Otherwise (a token with U+FFFD: part of a character; a stop string with U+FFFD; a tokenizer decoding
another way) the window is decoded as the rule says.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"
MAX_STOP_SETS = 256  # distinct stop lists whose suffix tables are kept (a request's list is small)


def tail_tokens(stop) -> int:
    """Tokens in the decoded window: a stop string spans at most one token per character, plus margin."""
    return 8 + max(len(s) for s in stop)


def stop_in_tail(tokenizer, output_ids, stop) -> str | None:
    """The rule itself: the first stop string (in the request's order) in the decoded window, or None."""
    tail = tokenizer.decode(output_ids[-tail_tokens(stop):])
    for s in stop:
        if s in tail:
            return s
    return None


def decodes_by_concatenation(tokenizer) -> bool:
    """The tokenizer's text of a token list is its tokens' bytes read as UTF-8 (see the module docstring):
    a ByteLevel decoder and no space clean-up. Anything else (an unknown tokenizer object included) is
    decoded at every step."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    return type(decoder).__name__ == "ByteLevel" and getattr(tokenizer, "clean_up_tokenization_spaces", True) is False


class _StopSet:
    """One request's stop strings, prepared for the per-token test."""

    __slots__ = ("stop", "always", "suffixes", "longest_suffix", "suffix_starts")

    def __init__(self, stop: tuple[str, ...]):
        self.stop = stop
        self.always = any(REPLACEMENT in s for s in stop)  # step 1 of the argument does not hold
        self.suffixes = {s[-k:] for s in stop for k in range(1, len(s))}  # proper, non-empty
        self.longest_suffix = max((len(s) - 1 for s in stop), default=0)
        self.suffix_starts = {x[0] for x in self.suffixes}

    def may_end_in(self, piece: str) -> bool:
        """Some stop string could end inside `piece` (a token's whole-character text)."""
        if any(s in piece for s in self.stop):
            return True
        if not piece or piece[0] not in self.suffix_starts:
            return False
        return any(piece[:k] in self.suffixes for k in range(1, min(self.longest_suffix, len(piece)) + 1))


class StopStrings:
    """The stop-string check of one scheduler; `check` answers as `stop_in_tail` would, decoding the
    window only at steps where a stop string can appear. Caches: each token's own text (at most the
    vocabulary) and the prepared stop lists (bounded), both for the current tokenizer."""

    def __init__(self):
        self._tokenizer = None
        self._concat = False
        self._pieces: dict[int, str] = {}
        self._sets: dict[tuple[str, ...], _StopSet] = {}
        self.window_decodes = 0  # windows decoded (the rule's tokenizer calls that were not skipped)

    def _bind(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._concat = decodes_by_concatenation(tokenizer)
        self._pieces.clear()
        self._sets.clear()

    def _piece(self, tok: int) -> str:
        piece = self._pieces.get(tok)
        if piece is None:
            piece = self._pieces[tok] = self._tokenizer.decode([tok])
        return piece

    def _set(self, stop) -> _StopSet:
        key = tuple(stop)
        got = self._sets.get(key)
        if got is None:
            if len(self._sets) >= MAX_STOP_SETS:
                self._sets.clear()
            got = self._sets[key] = _StopSet(key)
        return got

    def check(self, tokenizer, output_ids, stop) -> str | None:
        """After the output's last token was appended, and the same call after each earlier one (the
        skip relies on the previous window having no stop string): the stop string that ends the
        request, or None."""
        if tokenizer is not self._tokenizer:
            self._bind(tokenizer)
        if self._concat and output_ids:
            stops = self._set(stop)
            if not stops.always:
                piece = self._piece(int(output_ids[-1]))
                if REPLACEMENT not in piece and not stops.may_end_in(piece):
                    return None
        self.window_decodes += 1
        return stop_in_tail(tokenizer, output_ids, stop)
