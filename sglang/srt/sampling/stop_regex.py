"""stop_regex: the admission check, the scheduler's per-token search and the stream's hold-back.

A client's pattern runs against the output once per token in the scheduler and once per streamed chunk on
the HTTP event loop, so every search is bounded in time (`SGLANG_STOP_REGEX_TIMEOUT_MS`): a pattern that
backtracks past the budget ends its own request with a 400 instead of stalling everyone else's.

What is searched: the decoded text of the last `WINDOW_TOKENS` output tokens, with up to `CONTEXT_TOKENS`
more decoded before them only as left context (lookbehinds and `\\b` see it, no match starts in it; `^` is
the start of the output, never of the window). The first non-empty match ends the request; the output is
cut at the match's start, located by its distance from the end of the text (`chars_after`), so a lookbehind
or a repeated fragment cannot move the cut.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import regex

from sglang.srt.environ import envs

MAX_STOP_REGEXES = 16
MAX_STOP_REGEX_CHARS = 4096  # per pattern: compiled on the event loop at admission
# Counted repeats are unrolled by the compiler: `(?:(?:a{1000}){1000}){1000}` is 28 characters and takes the
# process down. A pattern's size with every repeat unrolled is bounded before it is compiled: 100,000
# elements compile to ~15 MB in ~57 ms, 10,000 to ~1.5 MB in a few ms (a stop pattern needs far fewer).
MAX_STOP_REGEX_EXPANDED = 10_000
# compiled patterns kept per process (the tokenizer's admission check and each scheduler rank):
# with the bound above at most ~100 MB however many distinct patterns clients send
_COMPILED_CACHE = 64
# a stop_regex match lies within the last WINDOW_TOKENS output tokens
WINDOW_TOKENS = 64
CONTEXT_TOKENS = 16
# Strings a pattern must not match with an empty match anywhere in (`\b`, `^`, `$`, `x*`, lookarounds of
# common characters); a rarer empty match that slips through is never taken as a stop at run time.
_EMPTY_PROBES = ("", "a", "a b", " a1. \n", "0", "\t-_\n", "Total: 12")


class StopRegexError(ValueError):
    """A pattern refused at admission, or one whose search ran past the time budget (a 400 either way)."""


@functools.lru_cache(maxsize=_COMPILED_CACHE)
def compiled(pattern: str) -> regex.Pattern:
    return regex.compile(pattern)


def timeout_s() -> float:
    return envs.SGLANG_STOP_REGEX_TIMEOUT_MS.get() / 1e3


def checked_patterns(value) -> list[str]:
    """stop_regex as a list of patterns that compile (the `regex` module's syntax, a superset of `re`'s),
    are at most MAX_STOP_REGEX_CHARS long and cannot match an empty string (which would end every
    request at its first token)."""
    patterns = [value] if isinstance(value, str) else value
    if not isinstance(patterns, list) or not all(isinstance(p, str) and p for p in patterns):
        raise StopRegexError("stop_regex must be a non-empty string or a list of non-empty strings")
    if len(patterns) > MAX_STOP_REGEXES:
        raise StopRegexError(f"at most {MAX_STOP_REGEXES} stop_regex patterns")
    budget = timeout_s()
    for p in patterns:
        if len(p) > MAX_STOP_REGEX_CHARS:
            raise StopRegexError(f"stop_regex is {len(p)} characters long, more than the limit of {MAX_STOP_REGEX_CHARS}")
        size = expanded_size(p)
        if size > MAX_STOP_REGEX_EXPANDED:
            raise StopRegexError(f"stop_regex {p!r} unrolls to about {size} elements with its counted repeats, more than "
                                 f"the limit of {MAX_STOP_REGEX_EXPANDED}")
        try:
            c = compiled(p)
        except regex.error as e:
            raise StopRegexError(f"stop_regex {p!r} is not a valid regular expression: {e}") from None
        try:
            empty = any(m.end() == m.start() for probe in _EMPTY_PROBES for m in c.finditer(probe, timeout=budget))
        except TimeoutError:
            raise StopRegexError(f"stop_regex {p!r} took longer than {budget * 1e3:g} ms to match a short probe "
                                 "string (SGLANG_STOP_REGEX_TIMEOUT_MS)") from None
        if empty:
            raise StopRegexError(f"stop_regex {p!r} matches the empty string")
    return list(patterns)


_REPEAT = regex.compile(r"\{(\d*)(?:,(\d*))?\}")


def expanded_size(pattern: str) -> int:
    """An upper estimate of the elements a pattern compiles to when counted repeats ({n}, {m,n}, {m,})
    are unrolled: a sequence adds up, a repeat multiplies what it follows, groups nest. Escapes and
    character classes count as one element; unbalanced text is left for the compiler to refuse."""
    stack = [[0, 0]]  # per open group: [size so far, size of the last element]
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        frame = stack[-1]
        if c == "\\":
            j = i + 2
            if j < n + 1 and pattern[i + 1 : i + 2] in ("p", "P", "N", "x", "u", "U", "g") and pattern[j : j + 1] == "{":
                j = pattern.find("}", j) + 1 or n
            frame[0] += 1
            frame[1] = 1
            i = j
            continue
        if c == "[":
            j = i + 1
            if pattern[j : j + 1] == "^":
                j += 1
            if pattern[j : j + 1] == "]":
                j += 1
            depth = 1
            while j < n and depth:
                if pattern[j] == "\\":
                    j += 1
                elif pattern[j] == "[":
                    depth += 1
                elif pattern[j] == "]":
                    depth -= 1
                j += 1
            frame[0] += 1
            frame[1] = 1
            i = j
            continue
        if c == "(":
            stack.append([0, 0])
        elif c == ")" and len(stack) > 1:
            inner = stack.pop()[0]
            stack[-1][0] += inner
            stack[-1][1] = inner
        elif c == "{" and (m := _REPEAT.match(pattern, i)) is not None and (m.group(1) or m.group(2)):
            lo, hi = m.group(1), m.group(2)
            count = max(int(lo or 0), int(hi) if hi else 0) + (1 if hi == "" else 0)
            frame[0] += frame[1] * max(count - 1, 0)
            frame[1] *= max(count, 1)
            i = m.end()
            continue
        elif c not in "|*+?":
            frame[0] += 1
            frame[1] = 1
        i += 1
    return sum(f[0] for f in stack)


@dataclass(frozen=True)
class StopRegexMatch:
    pattern: str
    text: str  # the matched text
    chars_after: int  # characters of the searched text after the match's end


def search_window(patterns: list[str], text: str, pos: int) -> StopRegexMatch | None:
    """The first non-empty match of any pattern in `text[pos:]` (`text[:pos]` is left context). All
    patterns together get one time budget; running past it raises StopRegexError naming the pattern."""
    budget = timeout_s()
    deadline = time.monotonic() + budget
    for p in patterns:
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            m = next((m for m in compiled(p).finditer(text, pos, timeout=left) if m.end() > m.start()), None)
        except TimeoutError:
            raise StopRegexError(f"stop_regex {p!r} took longer than {budget * 1e3:g} ms to search the last "
                                 f"{WINDOW_TOKENS} output tokens (SGLANG_STOP_REGEX_TIMEOUT_MS); simplify the pattern") from None
        if m is not None:
            return StopRegexMatch(p, m.group(0), len(text) - m.end())
    return None


def search_output(patterns: list[str], output_ids: list[int], decode) -> StopRegexMatch | None:
    """search_window over the end of a request's output; `decode(ids) -> str` must decode the way the
    detokenizer does for this request, so that `chars_after` counts the same characters there."""
    if len(output_ids) <= WINDOW_TOKENS + CONTEXT_TOKENS:
        return search_window(patterns, decode(output_ids), 0)
    ids = output_ids[-(WINDOW_TOKENS + CONTEXT_TOKENS):]
    # pos > 0: `^` cannot match inside the output, lookbehinds see the context
    return search_window(patterns, decode(ids), max(1, len(decode(ids[:CONTEXT_TOKENS]))))


# the end of the text searched for a partial stop_regex match (a match is at most WINDOW_TOKENS long)
HOLDBACK_CHARS = 1024


def partial_match_start(text: str, patterns: list[str]) -> int:
    """Length of the longest suffix of `text` where a stop_regex match could begin: a match of a pattern
    that the text ends in the middle of (the `regex` module's partial matching). Bounded like
    search_window (a tenth of its budget): past it, the whole searched end (HOLDBACK_CHARS) is held back and
    StopRegexError tells the caller to stop asking for this request."""
    window = text[-HOLDBACK_CHARS:]
    deadline = time.monotonic() + timeout_s() / 10  # runs on the event loop; running out only delays text
    best = 0
    for p in patterns:
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            for m in compiled(p).finditer(window, partial=True, overlapped=True, timeout=left):
                if m.partial:
                    best = max(best, len(window) - m.start())
                    break
        except TimeoutError:
            raise StopRegexError(f"stop_regex {p!r} ran out of time looking for a partial match") from None
    return best
