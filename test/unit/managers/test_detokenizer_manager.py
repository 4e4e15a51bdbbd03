"""Incremental detokenization: deltas concatenate to the full decode, multi-byte characters split
across tokens are never emitted half, special tokens are skipped on request, stop strings trim."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.managers.detokenizer_manager import IncrementalDetokenizer
from sglang.srt.managers.io_struct import BatchTokenIDOut, FinishReason

IM_END = 151645


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir("qwen3-vl-tiny"))


def feed(detok, rid, ids, sizes, skip=True, finish=FinishReason("length")) -> list[str]:
    deltas, pos = [], 0
    for n in sizes:
        deltas.append(detok.step(rid, ids[pos : pos + n], skip, None))
        pos += n
    deltas.append(detok.step(rid, ids[pos:], skip, finish))
    return deltas


def test_multibyte_characters_are_never_split(tokenizer):
    text = "naïve café — 日本語のテキスト 🤖🎨 done"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    deltas = feed(detok, "r", ids, [1] * (len(ids) - 1))
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)
    assert detok.states == {}


def test_skip_special_tokens_is_honoured(tokenizer):
    ids = tokenizer.encode("hello", add_special_tokens=False) + [IM_END]
    for skip, expected in ((True, "hello"), (False, "hello<|im_end|>")):
        assert "".join(feed(IncrementalDetokenizer(tokenizer), "r", ids, [1] * (len(ids) - 1), skip)) == expected


def test_a_stop_match_is_left_whole_for_the_tokenizer_manager_to_cut(tokenizer):
    """The detokenizer sends every character; the one cut happens where the whole text is
    (FinishReason.stop_cut in the tokenizer manager), so a match in text already sent cuts right too."""
    ids = tokenizer.encode("the answer is 42. The end", add_special_tokens=False)
    for sent in ([2], [len(ids) - 1]):
        detok = IncrementalDetokenizer(tokenizer)
        finish = FinishReason("stop", matched="42.", stop_text="42.")
        full = "".join(feed(detok, "r", ids, sent, finish=finish))
        assert full == "the answer is 42. The end" and full[: finish.stop_cut(full)] == "the answer is "


def test_batch_message_keeps_order_and_frees_finished_state(tokenizer):
    detok = IncrementalDetokenizer(tokenizer)
    a, b = tokenizer.encode("alpha", add_special_tokens=False), tokenizer.encode("beta", add_special_tokens=False)
    msg = BatchTokenIDOut(["a", "b"], [a, b], [None, FinishReason("length")], [3, 4], [len(a), len(b)], [0, 0],
                          [True, True], [{}, {}])
    out = detok.handle(msg)
    assert out.rids == ["a", "b"] and out.output_strs[1] == "beta" and out.new_token_ids == [a, b]
    assert set(detok.states) == {"a"}


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=40), cuts=st.lists(st.integers(1, 4), max_size=40))
def test_any_chunking_reproduces_the_full_decode(tokenizer, text, cuts):
    ids = tokenizer.encode(text, add_special_tokens=False)
    sizes, total = [], 0
    for c in cuts:
        if total + c > len(ids):
            break
        sizes.append(c)
        total += c
    deltas = feed(IncrementalDetokenizer(tokenizer), "r", ids, sizes)
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in d for d in deltas[:-1])


def test_skip_tokenizer_init_passes_ids_through_with_no_text():
    """--skip-tokenizer-init: no tokenizer is loaded and nothing is decoded; the ids and counts pass through."""
    from sglang.srt.managers.detokenizer_manager import DetokenizerManager
    from sglang.srt.port_args import PortArgs
    from sglang.srt.server_args import ServerArgs

    detok = IncrementalDetokenizer(None)
    msg = BatchTokenIDOut(["a", "b"], [[1, 2], [3]], [None, FinishReason("length")], [3, 4], [2, 1], [0, 0],
                          [True, True], [{}, {}])
    out = detok.handle(msg)
    assert out.output_strs == ["", ""] and out.new_token_ids == [[1, 2], [3]] and detok.states == {}
    args = ServerArgs(model_path="/nonexistent/model", skip_tokenizer_init=True)
    manager = DetokenizerManager(args, PortArgs.create(args))  # would fail loading a tokenizer from the path
    try:
        assert manager.detokenizer.tokenizer is None
    finally:
        manager.close()
