"""Stop strings: `StopStrings.check` ends a request on the same token as the plain rule (`stop_in_tail`:
decode the window at every step), over random texts, token sequences and stop strings with the real
Qwen tokenizer; and it decodes far fewer windows."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.sampling.stop_strings import StopStrings, decodes_by_concatenation, stop_in_tail

# text made of what model output holds: words, punctuation, markup, newlines, multi-byte characters
# (CJK, accents, emoji: several tokens per character), the replacement character itself
ALPHABET = list("abcdefghij xyz   .,:;!?<>/\"'{}[]()\n\t0123456789")
ALPHABET += ["é", "ß", "中", "文", "😀", "🙂", "\ufffd", "</answer>", "<think>", "```", "\n\n"]
SPECIAL = [151643, 151645, 151644, 151667, 151668]  # <|endoftext|>, <|im_end|>, <|im_start|>, <think>, </think>


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir("qwen3-vl-tiny")))


def _first_stop(check, ids, stop) -> tuple[int, str] | None:
    """(number of tokens when the request ends, matched stop string) under `check`, stepping as the
    scheduler does: the check after each appended token, ending at the first hit."""
    out: list[int] = []
    for t in ids:
        out.append(t)
        s = check(out, stop)
        if s is not None:
            return len(out), s
    return None


def _case(tok, rng: random.Random) -> tuple[list[int], list[str]]:
    text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(5, 80)))
    ids = tok.encode(text, add_special_tokens=False)
    for _ in range(rng.randint(0, 3)):  # specials, raw random ids (byte pieces, ids past the tokenizer)
        ids.insert(rng.randint(0, len(ids)), rng.choice(SPECIAL + [rng.randrange(151936) for _ in range(3)]))
    full = tok.decode(ids)
    stop = []
    for _ in range(rng.randint(1, 3)):
        if full and rng.random() < 0.8:  # mostly a piece of the text, so that it does stop
            a = rng.randrange(len(full))
            stop.append(full[a:a + rng.randint(1, 12)])
        else:
            stop.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 4))))
    return ids, stop


def test_the_qwen_tokenizer_takes_the_fast_path(tok):
    assert decodes_by_concatenation(tok)


@settings(max_examples=400, deadline=None, database=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_same_token_ends_the_request_as_with_a_decode_every_step(tok, seed):
    ids, stop = _case(tok, random.Random(seed))
    fast = StopStrings()
    want = _first_stop(lambda out, stop: stop_in_tail(tok, out, stop), ids, stop)
    got = _first_stop(lambda out, stop: fast.check(tok, out, stop), ids, stop)
    assert got == want, (ids, stop)


def test_any_other_tokenizer_is_decoded_every_step():
    class Chars:  # not byte-level: no skipping
        def decode(self, ids):
            return "".join(chr(97 + i % 26) for i in ids)

    check = StopStrings()
    out = []
    for t in range(40):
        out.append(t)
        assert check.check(Chars(), out, ["zzz"]) is None
    assert check.window_decodes == 40


class CountingTokenizer:
    """The real tokenizer, counting decode calls by length."""

    def __init__(self, tok):
        self.tok, self.windows, self.singles = tok, 0, 0
        self.backend_tokenizer = tok.backend_tokenizer
        self.clean_up_tokenization_spaces = tok.clean_up_tokenization_spaces

    def decode(self, ids):
        if len(ids) == 1:
            self.singles += 1
        else:
            self.windows += 1
        return self.tok.decode(ids)


def test_a_long_output_decodes_a_window_only_where_a_stop_string_can_end(tok):
    """A 2,000-token answer with stop strings "</answer>" and "\\n\\n\\n": the plain rule decodes a
    window at each of the 2,000 steps; the check decodes one only after a token whose text could end
    one (a '>', a newline, ...), plus each distinct token once on its own."""
    rng = random.Random(0)
    words = ["the", "model", "reasons", "about", "an", "image", "of", "a", "cat", "on", "mat", "and", "then",
             "answers", "with", "care", "<b>", "x", "y", "1", "2"]
    text = " ".join(rng.choice(words) for _ in range(3000)) + " </answer>"
    ids = tok.encode(text, add_special_tokens=False)[-2000:]
    stop = ["</answer>", "\n\n\n"]
    counting = CountingTokenizer(tok)
    fast = StopStrings()
    got = _first_stop(lambda out, stop: fast.check(counting, out, stop), ids, stop)
    assert got == _first_stop(lambda out, stop: stop_in_tail(tok, out, stop), ids, stop)
    assert got is not None and got[0] == len(ids) and got[1] == "</answer>"
    assert counting.windows == fast.window_decodes
    assert counting.windows <= len(ids) // 10, f"{counting.windows} windows decoded over {len(ids)} steps"
    assert counting.singles == len(set(ids))


def test_a_stop_string_with_the_replacement_character_is_decoded_every_step(tok):
    """'中' is two tokens (its first byte, then the other two): once the window slides past the first,
    its text starts with U+FFFD, so "\ufffdab" appears at a step whose own token is a plain 'c'."""
    ids = tok.encode("中", add_special_tokens=False) + tok.encode("ab", add_special_tokens=False)
    ids += tok.encode("c", add_special_tokens=False) * 12
    assert len(ids) == 16 and tok.decode(ids[1:4]) == "\ufffdab"
    stop = ["\ufffdab"]
    want = _first_stop(lambda out, stop: stop_in_tail(tok, out, stop), ids, stop)
    assert want == (12, "\ufffdab")  # the window of 11 tokens no longer starts at '中''s first byte
    assert _first_stop(lambda out, stop: StopStrings().check(tok, out, stop), ids, stop) == want
