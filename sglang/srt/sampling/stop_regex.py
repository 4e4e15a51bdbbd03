"""stop_regex: the admission check, the scheduler's per-token search and the stream's hold-back.

A client's pattern is parsed, size-checked and compiled at admission in a worker thread (never on the HTTP
event loop), and runs against the output once per token in the scheduler and once per streamed chunk on
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
MAX_STOP_REGEX_CHARS = 4096  # per pattern
# Counted repeats are unrolled by the compiler: `(?:(?:a{1000}){1000}){1000}` is 28 characters and takes the
# process down. A pattern's size with every repeat unrolled is bounded before it is compiled: 100,000
# elements compile to ~15 MB in ~57 ms, 10,000 to ~1.5 MB in a few ms (a stop pattern needs far fewer).
# The size is read from the pattern as the `regex` module parses it (inline flags such as `(?x)` included),
# never from its text: in verbose mode `(?:a{1000} ) {1000}` repeats the group, not a space.
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


def checked_pattern_shapes(value) -> list[str]:
    """stop_regex as a list of at most MAX_STOP_REGEXES non-empty strings of at most MAX_STOP_REGEX_CHARS
    each. Compiles nothing: cheap enough for the event loop (checked_patterns does the rest)."""
    patterns = [value] if isinstance(value, str) else value
    if not isinstance(patterns, list) or not all(isinstance(p, str) and p for p in patterns):
        raise StopRegexError("stop_regex must be a non-empty string or a list of non-empty strings")
    if len(patterns) > MAX_STOP_REGEXES:
        raise StopRegexError(f"at most {MAX_STOP_REGEXES} stop_regex patterns")
    for p in patterns:
        if len(p) > MAX_STOP_REGEX_CHARS:
            raise StopRegexError(f"stop_regex is {len(p)} characters long, more than the limit of {MAX_STOP_REGEX_CHARS}")
    return list(patterns)


def checked_patterns(value) -> list[str]:
    """stop_regex as a list of patterns that pass checked_pattern_shapes, unroll to at most
    MAX_STOP_REGEX_EXPANDED elements (checked on the parsed pattern, before compiling), compile (the
    `regex` module's syntax, a superset of `re`'s) and cannot match an empty string (which would end every
    request at its first token). Parses and compiles: run it off the event loop."""
    patterns = checked_pattern_shapes(value)
    budget = timeout_s()
    for p in patterns:
        size = expanded_size(p)
        if size > MAX_STOP_REGEX_EXPANDED:
            raise StopRegexError(f"stop_regex {p[:200]!r} unrolls to about {size} elements with its counted "
                                 f"repeats, more than the limit of {MAX_STOP_REGEX_EXPANDED}")
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
    return patterns


def expanded_size(pattern: str) -> int:
    """An upper estimate of the elements a pattern compiles to when counted repeats ({n}, {m,n}, {m,}) are
    unrolled, read from the tree the `regex` module parses it into (so every inline flag, scoped or not,
    counts as the compiler will read it): a sequence or an alternation adds up, a repeat multiplies its body
    by its largest count (`{m,}`, `*`, `+`: the smallest plus one), a literal string counts its characters,
    anything else one. A group called elsewhere (`(?1)`, `(?R)`) may be compiled up to three more times
    (reversed or fuzzy copies), which the estimate counts. A pattern that does not parse is a StopRegexError
    naming the problem. Linear in the pattern's length: nothing is unrolled to count it."""
    tree = _parsed(pattern)
    calls: set = set()
    size = _size(tree, calls)
    return size * (1 + 3 * len(calls))


def _parsed(pattern: str):
    """The `regex` module's parse tree of `pattern`, as `regex.compile` builds it: a flag set outside any
    group (`(?x)` anywhere) restarts the parse with it global. Its private parser is the only one that reads
    the syntax exactly as the compiler will; a `regex` release without it refuses every stop_regex (checked
    by test/unit/sampling/test_stop_regex.py) rather than estimate from the text, which `(?x)` defeats."""
    try:
        from regex import _regex_core as core

        parse, source_cls, info_cls, unscoped = core._parse_pattern, core.Source, core.Info, core._UnscopedFlagSet
        verbose, unicode = core.VERBOSE, core.UNICODE
    except (ImportError, AttributeError):
        raise StopRegexError("stop_regex cannot be size-checked with this server's version of the regex "
                             "package, so it is refused") from None
    flags = 0
    try:
        while True:
            source = source_cls(pattern)
            info = info_cls(flags, source.char_type, {})
            info.guess_encoding = unicode
            source.ignore_space = bool(info.flags & verbose)
            try:
                return parse(source, info)
            except unscoped:
                flags = info.global_flags
    except RecursionError:
        raise StopRegexError(f"stop_regex {pattern[:200]!r} nests too deeply") from None
    except (regex.error, ValueError, OverflowError) as e:
        raise StopRegexError(f"stop_regex {pattern[:200]!r} is not a valid regular expression: {e}") from None


def _size(node, calls: set) -> int:
    """Elements of `node` unrolled; the group calls found are added to `calls`."""
    kinds = {c.__name__ for c in type(node).__mro__}
    if "CallGroup" in kinds:
        calls.add(node.group)
        return 1
    if "SetBase" in kinds:  # a character class is one element, however many members it lists
        return 1
    chars = getattr(node, "characters", None)
    if isinstance(chars, (list, tuple)):  # String / Literal: one element per character
        return max(len(chars), 1)
    children = list(getattr(node, "items", None) or ()) + list(getattr(node, "branches", None) or ())
    children += [getattr(node, a) for a in ("subpattern", "yes_item", "no_item") if getattr(node, a, None) is not None]
    if not children:
        return 1
    inner = sum(_size(child, calls) for child in children)
    if hasattr(node, "min_count") and hasattr(node, "max_count"):  # greedy, lazy and possessive repeats
        count = node.max_count if node.max_count is not None else node.min_count + 1
        return inner * max(count, 1)
    return inner


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
