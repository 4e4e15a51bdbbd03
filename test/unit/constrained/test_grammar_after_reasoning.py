"""A grammar that starts after the end of reasoning (`start_after`: the `</think>` token): rows are not
masked until that token is output, then masked as a fresh grammar; replays after a retraction skip the
reasoning; a structural tag compiles with the server's JSON whitespace options."""

from __future__ import annotations

import json

import pytest
import torch

from sglang.srt.constrained.matcher import RequestGrammar, apply_grammar_bitmask
from sglang.srt.constrained.xgrammar_backend import JsonOptions, XGrammarBackend

VOCAB = 151936
THINK_END = 151668
KEY = ("regex", "[0-9]{3}")


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    return XGrammarBackend(str(tiny_model_dir("qwen3-vl-tiny")), VOCAB, stop_token_ids=[151645])


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir("qwen3-vl-tiny")))


def _masked(backend, g: RequestGrammar, outputs: list[int]) -> torch.Tensor:
    logits = torch.zeros(1, VOCAB)
    apply_grammar_bitmask(logits, [g], [outputs], VOCAB)
    return torch.isneginf(logits[0])


def test_no_mask_until_the_reasoning_ends(backend, tok):
    g = RequestGrammar(backend.matcher(backend.compile(KEY)), KEY, start_after=THINK_END)
    reasoning = tok.encode("I think about letters", add_special_tokens=False)
    out = []
    for t in reasoning:  # letters: the regex would forbid every one of them
        assert not _masked(backend, g, out).any()
        assert g.accept(t) and not g.is_terminated()
        out.append(t)
    assert g.accept(THINK_END)
    out.append(THINK_END)
    masked = _masked(backend, g, out)
    digit = tok.encode("7", add_special_tokens=False)[0]
    assert not masked[digit] and masked[reasoning[0]] and masked[THINK_END]
    for t in tok.encode("123", add_special_tokens=False):
        assert g.accept(t)
        out.append(t)
    assert g.accept(151645) and g.is_terminated()


def test_replay_skips_the_reasoning(backend, tok):
    digits = tok.encode("12", add_special_tokens=False)
    history = tok.encode("hmm", add_special_tokens=False) + [THINK_END] + digits
    g = RequestGrammar(backend.matcher(backend.compile(KEY)), KEY, start_after=THINK_END)
    g.sync(history)  # a fresh matcher brought to the output (after a retraction / on another rank)
    assert g.accepted == digits and g.is_active()
    g.sync(history[:2])  # back inside the reasoning: not started
    assert not g.is_active() and not _masked(backend, g, history[:2]).any()


def test_structural_tag_gets_the_json_whitespace_limit(tiny_model_dir):
    b = XGrammarBackend(str(tiny_model_dir("qwen3-vl-tiny")), VOCAB, json_options=JsonOptions(max_whitespace_cnt=1))
    tag = {"type": "structural_tag", "format": {"type": "json_schema", "json_schema": {"type": "object"}}}
    text = b._with_json_options(json.dumps(tag))
    assert json.loads(text)["format"]["max_whitespace_cnt"] == 1
    m = b.matcher(b.compile(("structural_tag", json.dumps(tag))))
    assert m.accept_string('{ "a": 1}') and not m.accept_string("  ")
