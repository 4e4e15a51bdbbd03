"""The Qwen3 reasoning split: one shot, and streamed in pieces cut anywhere (the same reasoning and
content for every split); when the output begins inside the reasoning; separate reasoning delivery."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.parser.reasoning_parser import ReasoningParser, prompt_opens_reasoning

CASES = [  # (parser, begins inside the reasoning, output, (reasoning, content))
    ("qwen3", False, "<think>\nweigh it\n twice \n</think>\n\nThe answer  \n", ("weigh it\n twice", "The answer  \n")),
    ("qwen3", False, "  plain answer <think>x</think>", (None, "  plain answer <think>x</think>")),
    ("qwen3", False, "<think></think>only content", (None, "only content")),
    ("qwen3", False, "<thi", (None, "<thi")),
    ("qwen3", True, "still thinking </thi", ("still thinking </thi", None)),
    ("qwen3", True, "short</think>", ("short", None)),
    ("qwen3-thinking", False, "\n all reasoning, never closed  \n", ("all reasoning, never closed", None)),
    ("qwen3-thinking", False, "<think>a</think> b", ("a", "b")),  # a repeated start tag is dropped
]


def streamed(parser: ReasoningParser, pieces: list[str]) -> tuple[str | None, str | None]:
    reasoning, content = "", ""
    for r, c in [parser.parse_stream_chunk(p) for p in pieces] + [parser.finish()]:
        reasoning += r or ""
        content += c or ""
    return reasoning or None, content or None


@pytest.mark.parametrize("name, inside, text, want", CASES)
def test_split_one_shot_and_every_cut(name, inside, text, want):
    assert ReasoningParser(name, inside).parse_non_stream(text) == want
    for cut in range(len(text) + 1):
        assert streamed(ReasoningParser(name, inside), [text[:cut], text[cut:]]) == want, cut
    assert streamed(ReasoningParser(name, inside), list(text)) == want


@settings(max_examples=80, deadline=None)
@given(st.text(alphabet="ab <>/thinkx\n", max_size=40), st.lists(st.integers(0, 40), max_size=8), st.booleans())
def test_random_text_random_cuts(text, cuts, inside):
    bounds = [0, *sorted(min(c, len(text)) for c in cuts), len(text)]
    want = ReasoningParser("qwen3", inside).parse_non_stream(text)
    assert streamed(ReasoningParser("qwen3", inside), [text[a:b] for a, b in zip(bounds, bounds[1:])]) == want


def test_stream_reasoning_false_sends_the_reasoning_in_one_piece():
    parser = ReasoningParser("qwen3-thinking", stream_reasoning=False)
    assert parser.parse_stream_chunk("step one, ") == (None, None)
    assert parser.parse_stream_chunk("step two</think>\n") == ("step one, step two", None)
    assert parser.parse_stream_chunk("done") == (None, "done")


def test_pieces_are_sent_as_soon_as_decided():
    parser = ReasoningParser("qwen3")
    assert parser.parse_stream_chunk("<thi") == (None, None)  # may still become the start tag
    assert parser.parse_stream_chunk("nk>abc </") == ("abc", None)  # the space waits: it may be trailing
    assert parser.parse_stream_chunk("think>Hi") == (None, "Hi")


def test_prompt_opens_reasoning():
    assert prompt_opens_reasoning("qwen3-thinking", "anything")
    assert prompt_opens_reasoning("qwen3", "<|im_start|>assistant\n<think>\nso far")
    assert not prompt_opens_reasoning("qwen3", "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("qwen3", "<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        ReasoningParser("deepseek-r1")
