"""--grammar-backend llguidance: every grammar kind compiles from the same request fields as xgrammar's,
invalid ones are GrammarCompileError naming the problem, and the server's JSON whitespace options apply.
Matcher behaviour (accept, terminate, rollback, bitmask) runs for both backends in test_grammar_matcher.py."""

from __future__ import annotations

import json

import pytest
import torch

from sglang.srt.constrained.backends import make_grammar_backend
from sglang.srt.constrained.matcher import RequestGrammar, apply_grammar_bitmask
from sglang.srt.constrained.xgrammar_backend import GrammarCompileError, JsonOptions

pytest.importorskip("llguidance")  # declared, so installed on CPU; the GPU image may lack its wheel

VOCAB, EOS = 151936, 151645


@pytest.fixture(scope="module")
def path(tiny_model_dir):
    return str(tiny_model_dir("qwen3-vl-tiny"))


@pytest.fixture(scope="module")
def tok(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _backend(path, **opts):
    return make_grammar_backend("llguidance", path, VOCAB, [EOS], JsonOptions(**opts))


def _first_texts(backend, tok, key) -> set[str]:
    g = RequestGrammar(backend.matcher(backend.compile(key)), key)
    logits = torch.zeros(1, VOCAB)
    apply_grammar_bitmask(logits, [g], [[]], VOCAB)
    return {tok.decode([t]) for t in torch.isfinite(logits[0]).nonzero().view(-1).tolist()}


TAG = {"type": "structural_tag", "triggers": ["<tool_call>"],
       "structures": [{"begin": "<tool_call>{\"name\": \"f\", \"arguments\": ", "end": "}</tool_call>",
                       "schema": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}]}


@pytest.mark.parametrize("key,prefix_of", [
    (("regex", "(yes|no)"), ("yes", "no")),
    (("ebnf", 'root ::= "answer: " ("yes" | "no")'), ("answer: ",)),
    (("json_schema", json.dumps({"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]})),
     ("{",)),
])
def test_each_kind_compiles_and_masks_to_its_language(path, tok, key, prefix_of):
    texts = _first_texts(_backend(path), tok, key)
    assert texts and all(any(p.startswith(t) or t.lstrip().startswith("{") for p in prefix_of) for t in texts), texts


def test_structural_tags_in_the_structures_and_triggers_form(path):
    b = _backend(path)
    assert b.compile(("structural_tag", json.dumps(TAG))).text


@pytest.mark.parametrize("key,word", [
    (("regex", "(unclosed"), "regex"),
    (("json_schema", "{not json"), "json_schema"),
    (("ebnf", "root ::= missing_rule"), "ebnf"),
    (("structural_tag", json.dumps({"type": "structural_tag", "format": {"type": "const_string", "value": "x"}})),
     "structures"),
])
def test_invalid_grammars_name_the_problem(path, key, word):
    with pytest.raises(GrammarCompileError, match=word):
        _backend(path).compile(key)


def test_compact_json_allows_no_whitespace_after_the_brace(path, tok):
    key = ("json_schema", json.dumps({"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]}))
    for opts, spaced in (({}, True), ({"disable_any_whitespace": True}, False)):
        b = _backend(path, **opts)
        g = RequestGrammar(b.matcher(b.compile(key)), key)
        assert g.accept(tok.encode("{", add_special_tokens=False)[0])
        logits = torch.zeros(1, VOCAB)
        apply_grammar_bitmask(logits, [g], [list(g.accepted)], VOCAB)
        allowed = {tok.decode([t]) for t in torch.isfinite(logits[0]).nonzero().view(-1).tolist()}
        assert any(t.startswith((" ", "\n")) for t in allowed) is spaced


def test_server_flag_accepts_llguidance_and_refuses_outlines_by_name():
    from sglang.srt.server_args import ServerArgs

    assert ServerArgs(model_path="m", grammar_backend="llguidance").grammar_backend == "llguidance"
    with pytest.raises(ValueError, match="outlines"):
        ServerArgs(model_path="m", grammar_backend="outlines")
