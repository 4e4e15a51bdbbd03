"""stop_regex: admission refusals, the bounded per-token search, where the output is cut, and the
stream's bounded hold-back."""

from __future__ import annotations

import pytest
import regex
from hypothesis import given
from hypothesis import strategies as st

from sglang.srt.managers.io_struct import FinishReason
from sglang.srt.managers.stop_holdback import StopHoldback
from sglang.srt.sampling.stop_regex import (
    CONTEXT_TOKENS,
    HOLDBACK_CHARS,
    WINDOW_TOKENS,
    StopRegexError,
    checked_patterns,
    expanded_size,
    partial_match_start,
    search_output,
    search_window,
)
from sglang.srt.utils.text import partial_match_len

BACKTRACKING = "(a|aa)+b"  # exponential in the run of a's it fails on


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode(ids: list[int]) -> str:
    return "".join(map(chr, ids))


@pytest.mark.parametrize("pattern", [r"\b", r"\B", "^", "$", "x*", r"(?=a)", r"(?<=\d)", r"(?m)$"])
def test_a_pattern_with_an_empty_match_anywhere_is_refused(pattern):
    with pytest.raises(StopRegexError, match="matches the empty string"):
        checked_patterns(pattern)


@pytest.mark.parametrize("pattern", ["(?:(?:a{1000}){1000}){1000}", "(?:a{1000}){1000}", "a{65535}", "x" * 5000])
def test_a_pattern_that_compiles_huge_is_refused_before_compiling(pattern):
    with pytest.raises(StopRegexError, match="limit"):
        checked_patterns(pattern)


def test_expanded_size_multiplies_nested_repeats_and_adds_sequences():
    assert expanded_size("abc") == 3
    assert expanded_size("a{100}") == 100
    assert expanded_size("(a{10}){10}") == 100  # ten runs of ten
    assert expanded_size(r"[{}]{3}\{9\}") == 6  # braces in a class or escaped are no repeat
    assert expanded_size(r"\d{1,4}x{2,}") == 7


def test_ordinary_patterns_pass_the_checks():
    assert checked_patterns([r"\d+ apples", r"(?<=Total: )\d+", r"\bend\b", "a{5000}"]) == [
        r"\d+ apples", r"(?<=Total: )\d+", r"\bend\b", "a{5000}"]


def test_a_backtracking_search_ends_with_an_error_naming_the_budget(monkeypatch):
    monkeypatch.setenv("SGLANG_STOP_REGEX_TIMEOUT_MS", "5")
    with pytest.raises(StopRegexError, match="SGLANG_STOP_REGEX_TIMEOUT_MS"):
        search_window(["x", BACKTRACKING], "a" * 64 * 4, 0)


def test_the_cut_is_where_the_match_was_found_not_the_first_occurrence_of_its_text():
    found = search_window([r"(?<=Total: )\d+"], "I counted 12 apples. Total: 1", 0)
    assert (found.text, found.chars_after) == ("1", 0)
    final = "I counted 12 apples. Total: 12"  # the detokenizer's whole text, one more character than searched
    fr = FinishReason("stop", matched=found.pattern, stop_text=found.text, stop_chars_after=found.chars_after + 1)
    assert final[: fr.stop_cut(final)] == "I counted 12 apples. Total: "
    # a stop string has no offset: its first occurrence
    assert FinishReason("stop", stop_text="12").stop_cut(final) == len("I counted ")
    assert FinishReason("stop", stop_text=None).stop_cut(final) is None


def test_lookahead_matches_are_cut_at_their_start_with_the_text_after_them_counted():
    found = search_window(["a(?=bc)"], "xxabc", 0)
    assert (found.text, found.chars_after) == ("a", 2)


def test_the_window_is_the_output_end_with_left_context_and_no_start_anchor():
    head = "I " + "w" * (WINDOW_TOKENS + CONTEXT_TOKENS + 10)
    assert search_output(["^I"], chars("I am"), decode) is not None  # the whole output: ^ is its start
    assert search_output(["^w"], chars(head), decode) is None  # ^ never matches inside the window
    # a lookbehind reaches into the context before the window
    text = "x" * 200 + "Total: " + "9" * (WINDOW_TOKENS - 1)
    found = search_output([r"(?<=Total: )9"], chars(text), decode)
    assert found is not None and found.chars_after == WINDOW_TOKENS - 2


@given(text=st.text("abc", max_size=12), stops=st.lists(st.text("abc", min_size=1, max_size=4), max_size=3))
def test_regex_holdback_of_a_literal_is_the_partial_match_len(text, stops):
    assert partial_match_start(text, [regex.escape(s) for s in stops]) == partial_match_len(text, stops)


def test_regex_holdback_covers_a_match_in_progress():
    assert partial_match_start("total: 12", [r"\d+ apples"]) == 2  # "12" may become "12 apples"
    assert partial_match_start("total: 12 pears", [r"\d+ apples"]) == 0


def test_a_holdback_search_past_its_budget_holds_the_searched_end_and_is_not_tried_again(monkeypatch):
    monkeypatch.setenv("SGLANG_STOP_REGEX_TIMEOUT_MS", "1")
    hb = StopHoldback([], ["a*a*a*a*a*b"])
    text = "a" * 1000 + "cccc"  # no match can start in it, and every start backtracks
    assert hb.length(text) == len(text) and hb.regex_exhausted
    searched = []
    monkeypatch.setattr("sglang.srt.managers.stop_holdback.partial_match_start", lambda *a: searched.append(a))
    assert hb.length("zz") == 2 and searched == []
