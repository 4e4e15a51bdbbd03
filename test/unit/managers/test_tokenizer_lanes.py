"""Client text through the tokenizer (managers/tokenizer_lanes.py): text too long for the context in any
tokenization is refused before the tokenizer sees it, naming the limit; a long input runs in its own lane
and an ordinary prompt does not wait for it; results equal the tokenizer's own."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from sglang.srt.errors import GenerateError
from sglang.srt.managers.tokenizer_lanes import LONG_CHARS, LONG_IDS, TokenizerLanes

GUARD_S = 120  # a deadlock guard only: the waits below end on events, not on time
gate = threading.Event()  # module level: the long lane's deep copy of the tokenizer shares it
long_started = threading.Event()


class FakeTokenizer:
    def __init__(self):
        self.calls = 0

    def encode(self, text, add_special_tokens=True):
        self.calls += 1
        if len(text) >= LONG_CHARS:
            long_started.set()
            assert gate.wait(GUARD_S)
        return [len(text)] + ([0] if add_special_tokens else [])

    def decode(self, ids, skip_special_tokens=True):
        self.calls += 1
        if len(ids) >= LONG_IDS:
            long_started.set()
            assert gate.wait(GUARD_S)
        return "x" * len(ids)


@pytest.fixture(autouse=True)
def _events():
    gate.clear()
    long_started.clear()
    yield
    gate.set()  # never leave a lane blocked


def test_text_beyond_the_context_bound_is_refused_before_tokenizing():
    tok = FakeTokenizer()
    lanes = TokenizerLanes(tok, context_length=100, chars_per_token=4)
    assert lanes.encode("a" * 400, add_special_tokens=False) == [400]
    with pytest.raises(GenerateError) as e:
        lanes.encode("a" * 401, add_special_tokens=False)
    msg = str(e.value)
    assert "401 characters" in msg and "100 tokens" in msg and "400 characters" in msg
    assert "SGLANG_MAX_PROMPT_CHARS_PER_TOKEN" in msg and tok.calls == 1
    with pytest.raises(GenerateError, match=r"The input \(101 tokens\) is longer than the model's context length"):
        lanes.decode([1] * 101, skip_special_tokens=True)
    assert tok.calls == 1


@pytest.mark.parametrize("call", ["encode", "decode"])
def test_an_ordinary_input_does_not_wait_for_a_long_one(call):
    tok = FakeTokenizer()
    lanes = TokenizerLanes(tok, context_length=1 << 20, chars_per_token=4)
    long_input = "a" * LONG_CHARS if call == "encode" else [1] * LONG_IDS
    short_input = "short" if call == "encode" else [1, 2]
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(getattr(lanes, call), long_input, True)
        assert long_started.wait(GUARD_S)  # the long input is inside the tokenizer, holding its lane
        short = pool.submit(getattr(lanes, call), short_input, True)
        assert short.result(GUARD_S) in ([5, 0], "xx")  # done while the long one is still held
        assert not held.done()
        gate.set()
        assert held.result(GUARD_S) in ([LONG_CHARS, 0], "x" * LONG_IDS)
    assert lanes._long_tokenizer is not tok  # its own copy: the lanes share no tokenizer state


def test_lanes_give_the_tokenizers_own_results(tiny_model_dir):
    from transformers import AutoTokenizer

    gate.set()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir("qwen3-vl-tiny"))
    lanes = TokenizerLanes(tok, context_length=1 << 16, chars_per_token=32)
    long_text = ("Long text, with  spaces\nand lines. " * (LONG_CHARS // 30))[: LONG_CHARS + 7]
    for text in ("An ordinary prompt.", long_text):
        ids = tok.encode(text, add_special_tokens=False)
        assert lanes.encode(text, add_special_tokens=False) == ids
        assert lanes.decode(ids, skip_special_tokens=True) == tok.decode(ids, skip_special_tokens=True)
    assert lanes._long_tokenizer is not None and lanes._long_tokenizer is not tok


class BorrowingTokenizer:
    """An HF fast tokenizer's borrow rule: encode holds it mutably (truncation and padding are set on
    it), and a decode meanwhile fails with "Already borrowed"."""

    def __init__(self):
        self.borrowed = False

    def __deepcopy__(self, memo):
        return BorrowingTokenizer()

    def encode(self, text, add_special_tokens=True):
        self.borrowed = True
        long_started.set()
        assert gate.wait(GUARD_S)
        self.borrowed = False
        return [len(text)]

    def decode(self, ids, skip_special_tokens=False):
        if self.borrowed:
            raise RuntimeError("Already borrowed")
        return "t" * len(ids)


def test_output_text_does_not_race_a_prompt_being_tokenized():
    tok = BorrowingTokenizer()
    lanes = TokenizerLanes(tok, context_length=1 << 16, chars_per_token=32)
    gate.set()
    assert lanes.decode_output([1]) == "t"  # the output lane's copy is made on first use
    gate.clear()
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(lanes.encode, "a prompt", True)
        assert long_started.wait(GUARD_S)
        with pytest.raises(RuntimeError, match="borrowed"):
            tok.decode([5])  # what logprob texts and echo called before: the shared tokenizer, mid-encode
        assert lanes.decode_output([5, 6]) == "tt"
        gate.set()
        assert fut.result(GUARD_S) == [8]
