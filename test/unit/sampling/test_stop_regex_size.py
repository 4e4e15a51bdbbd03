"""The stop_regex size bound reads the pattern as the compiler will: inline flags cannot hide a repeat from
it. `(?x)(?:(?:a{1000} ) {1000} ) {100}` had been estimated from its text at 2,105 elements (a space before
`{1000}` looked like the thing repeated) while in verbose mode it unrolls to 10^8, and compiling it stalled
the tokenizer's event loop 3.4 s and kept 0.5 GB. Such patterns are refused before anything compiles, and
compiling at admission happens in the request's worker thread, never in the event-loop check."""

from __future__ import annotations

import pytest

import sglang.srt.sampling.stop_regex as stop_regex
from sglang.srt.errors import GenerateError
from sglang.srt.managers import request_validation as rv
from sglang.srt.sampling.stop_regex import MAX_STOP_REGEX_EXPANDED, StopRegexError, checked_patterns, expanded_size

HUGE = [
    "(?x)(?:(?:a{1000} ) {1000} ) {100}",  # verbose mode for the whole pattern
    "(?x:(?:(?:a{1000} ) {1000} ) {100})",  # scoped verbose group
    "(?x)(?:(?:a{1000} # a comment {1}\n ) {1000} # another\n ) {100}",  # comments and whitespace
    "(?x)(?:(?:a{100}#)\n){10}#)\n){1000}",  # a comment that hides a parenthesis from a text scan
    "(?ix)(?:(?:a{1000} ) {1000} ) {100}",  # verbose among other flags
    "(?V1)(?x)(?:(?:a{1000} ) {1000} ) {100}",  # version 1 syntax
    "x(?x)(?:(?:a{1000} ) {1000} ) {100}",  # a global flag after the start restarts the parse
    "(?x)(?:(?:a{50}\t)\t{50}\n)\t{50}",  # tabs and newlines are whitespace too
]


@pytest.fixture
def no_compiling(monkeypatch):
    """Fails the test if a pattern reaches the compiler."""
    def refuse(pattern):
        raise AssertionError(f"compiled {pattern!r}")
    monkeypatch.setattr(stop_regex, "compiled", refuse)


@pytest.mark.parametrize("pattern", HUGE)
def test_inline_flags_cannot_hide_a_repeat_from_the_estimate(pattern):
    assert expanded_size(pattern) >= 10 * MAX_STOP_REGEX_EXPANDED


@pytest.mark.parametrize("pattern", HUGE)
def test_such_patterns_are_refused_before_compiling_naming_the_limit(pattern, no_compiling):
    with pytest.raises(StopRegexError, match=f"more than the limit of {MAX_STOP_REGEX_EXPANDED}"):
        checked_patterns(pattern)
    with pytest.raises(GenerateError, match=f"limit of {MAX_STOP_REGEX_EXPANDED}") as e:  # the request's path
        rv.check_in_worker(rv.make_sampling_params({"stop_regex": pattern}, compile_patterns=False)[0], None)
    assert e.value.status_code == 400


def test_the_event_loop_check_compiles_nothing(no_compiling):
    sp, _ = rv.make_sampling_params({"stop_regex": [r"\d+ apples", HUGE[0]]}, compile_patterns=False)
    assert sp.stop_regex == [r"\d+ apples", HUGE[0]]  # left for check_in_worker
    with pytest.raises(GenerateError, match="at most 16"):  # the cheap checks still run there
        rv.make_sampling_params({"stop_regex": ["a"] * 17}, compile_patterns=False)


def test_sizes_follow_the_parsed_pattern():
    sizes = {
        "(?x) a b c ": 3,  # spaces ignored in verbose mode
        "a b": 3,  # and counted without it
        "(?x)(?: a{10} ){10}": 100,
        "(?x: a{10} )b{10}": 20,  # the scope ends with its group
        "(a{100})(?1)": 404,  # a called group may be compiled again (reversed, fuzzy): counted four times
        "[a-zA-Z0-9_]{100}": 100,  # a class is one element
        "(?:a|bc){10}": 30,
    }
    assert {p: expanded_size(p) for p in sizes} == sizes


def test_ordinary_patterns_still_pass_and_compile():
    ordinary = [r"\d+ apples", r"(?x) \d+ \s apples  # verbose is fine when small", r"(?i)the end",
                r"(?<=Total: )\d+", r"\p{Lu}{2,5}!", "a{5000}"]
    assert checked_patterns(ordinary) == ordinary
    sp, _ = rv.make_sampling_params({"stop_regex": ordinary}, compile_patterns=False)
    rv.check_in_worker(sp, None)
    assert sp.stop_regex == ordinary


@pytest.mark.parametrize("pattern, problem", [("a(", "not a valid regular expression"),
                                              ("(" * 500 + "a" + ")" * 500, "nests too deeply")])
def test_patterns_that_do_not_parse_are_a_400_naming_the_problem(pattern, problem):
    with pytest.raises(GenerateError, match=problem) as e:
        rv.check_in_worker(rv.make_sampling_params({"stop_regex": pattern}, compile_patterns=False)[0], None)
    assert e.value.status_code == 400
