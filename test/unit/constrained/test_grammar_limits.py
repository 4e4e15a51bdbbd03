"""What a grammar's text may be before anything compiles it: at most SGLANG_GRAMMAR_MAX_BYTES (a 400
naming the limit, through SamplingParams.verify), and no multi-schema allOf, which xgrammar 0.2.8
compiled as anyOf (grammar_limits.py says why; no test here asserts what a library gets wrong, so a
release that fixes it cannot turn the suite red)."""

from __future__ import annotations

import json

import pytest

from sglang.srt.constrained.grammar_limits import GrammarLimitError, check_grammar_text
from sglang.srt.constrained.request_fields import structural_tag_text
from sglang.srt.sampling.sampling_params import SamplingParams, SamplingParamsError

STRING_AND_INTEGER = {"allOf": [{"type": "string"}, {"type": "integer"}]}


def test_a_grammar_larger_than_the_limit_is_refused_naming_it(monkeypatch):
    big = "a" * (1536 * 1024)
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(regex=big).verify()
    assert str(e.value) == ("regex is 1572864 bytes, more than the 65536-byte limit (SGLANG_GRAMMAR_MAX_BYTES)")
    SamplingParams(regex="a" * 65536).verify()  # at the limit: accepted
    with pytest.raises(SamplingParamsError, match="json_schema is 65541 bytes"):  # UTF-8 bytes, not characters
        SamplingParams(json_schema=json.dumps({"const": "é" * 32764}, ensure_ascii=False)).verify()
    monkeypatch.setenv("SGLANG_GRAMMAR_MAX_BYTES", str(4 << 20))
    SamplingParams(regex=big).verify()  # the variable raises the limit
    monkeypatch.setenv("SGLANG_GRAMMAR_MAX_BYTES", "16")
    with pytest.raises(SamplingParamsError, match="more than the 16-byte limit"):
        SamplingParams(ebnf='root ::= "a" | "bcdefghijklmnop"').verify()


@pytest.mark.parametrize("schema, path", [
    (STRING_AND_INTEGER, "$"),
    ({"type": "object", "properties": {"x": {"allOf": [{"minimum": 0}, {"maximum": 5}]}}}, "$.properties.x"),
    ({"$defs": {"A": {"allOf": [{"type": "object"}, {"required": ["a"]}]}}, "$ref": "#/$defs/A"}, "$.$defs.A"),
])
def test_multi_schema_all_of_is_refused_with_its_place(schema, path):
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(json_schema=schema).verify()
    assert f"allOf with 2 schemas (at {path}) is not supported" in str(e.value)
    tag = {"type": "structural_tag", "format": {"type": "tag", "begin": "<a>", "end": "</a>",
                                                "content": {"type": "json_schema", "json_schema": schema}}}
    with pytest.raises(GrammarLimitError, match="structural_tag: allOf with 2 schemas"):
        check_grammar_text("structural_tag", structural_tag_text(tag, "structural_tag"))


def test_what_stays_accepted():
    for schema in ({"allOf": [{"type": "string"}]},  # one schema: xgrammar enforces it
                   {"type": "object", "properties": {"allOf": {"type": "array"}}},  # a property named allOf
                   {"enum": [{"allOf": [1, 2]}]}):  # data, not a keyword
        SamplingParams(json_schema=schema).verify()
    deep = "[" * 20000 + "]" * 20000  # nesting deeper than Python's recursion limit: no RecursionError
    check_grammar_text("json_schema", deep)
    for field in ("json_schema", "structural_tag"):  # a 400 naming it, not a RecursionError (500)
        with pytest.raises(SamplingParamsError, match=f"{field} nests too deeply"):
            SamplingParams(**{field: '{"a":' * 10000 + "1" + "}" * 10000}).verify()
