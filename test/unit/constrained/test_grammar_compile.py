"""Request fields -> grammar keys, the compile cache, and xgrammar compiling against the tiny model's
tokenizer: what is refused (with the problem named) and what is accepted."""

from __future__ import annotations

import json
import threading

import pytest

from sglang.srt.constrained.grammar_cache import GrammarCache
from sglang.srt.constrained.request_fields import (
    JSON_OBJECT_SCHEMA,
    ConstraintError,
    choice_regex,
    constraint_params,
)
from sglang.srt.constrained.xgrammar_backend import GrammarCompileError, JsonOptions, XGrammarBackend
from sglang.srt.sampling.sampling_params import SamplingParams, SamplingParamsError


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    path = str(tiny_model_dir("qwen3-vl-tiny"))
    cfg = json.load(open(f"{path}/config.json"))
    return XGrammarBackend(path, cfg["text_config"]["vocab_size"])


# ----------------------------------------------------------------------------- request fields
def test_response_format_kinds():
    assert constraint_params({"response_format": {"type": "text"}}) == {}
    assert constraint_params({"response_format": {"type": "json_object"}}) == {"json_schema": JSON_OBJECT_SCHEMA}
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
    got = constraint_params({"response_format": {"type": "json_schema",
                                                 "json_schema": {"name": "x", "schema": schema, "strict": True}}})
    assert json.loads(got["json_schema"]) == schema
    assert list(json.loads(got["json_schema"])["properties"]) == ["b", "a"]  # generation order kept
    assert constraint_params({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}) == \
        {"json_schema": "{}"}
    with pytest.raises(ConstraintError, match="'yaml' is not supported"):
        constraint_params({"response_format": {"type": "yaml"}})
    with pytest.raises(ConstraintError, match='needs a "json_schema" object'):
        constraint_params({"response_format": {"type": "json_schema"}})


def test_aliases_and_one_constraint_per_request():
    assert constraint_params({"guided_regex": "[a-z]+"}) == {"regex": "[a-z]+"}
    assert constraint_params({"guided_grammar": 'root ::= "x"'}) == {"ebnf": 'root ::= "x"'}
    assert constraint_params({"guided_json": {"type": "integer"}}) == {"json_schema": '{"type": "integer"}'}
    assert constraint_params({"json_schema": '{"type": "string"}'}) == {"json_schema": '{"type": "string"}'}
    with pytest.raises(ConstraintError, match="got regex and ebnf"):
        constraint_params({"regex": "a", "ebnf": 'root ::= "a"'})
    with pytest.raises(ConstraintError, match="got response_format json_object and guided_choice"):
        constraint_params({"response_format": {"type": "json_object"}, "guided_choice": ["a"]})
    with pytest.raises(ConstraintError, match="json_schema is not valid JSON"):
        constraint_params({"json_schema": "{nope"})
    with pytest.raises(ConstraintError, match="guided_choice must be a non-empty list"):
        constraint_params({"guided_choice": []})


def test_sampling_params_carry_one_constraint():
    sp = SamplingParams(json_schema={"type": "integer"})
    sp.verify()
    assert sp.grammar_key() == ("json_schema", '{"type": "integer"}')
    assert SamplingParams().grammar_key() is None
    with pytest.raises(SamplingParamsError, match="got json_schema and regex"):
        SamplingParams(json_schema="{}", regex="a").verify()
    with pytest.raises(SamplingParamsError, match="regex must be a non-empty string"):
        SamplingParams(regex=3).verify()


# ----------------------------------------------------------------------------- xgrammar
@pytest.mark.parametrize("key, problem", [
    (("regex", "a(b"), "parenthesis is not closed"),
    (("json_schema", '{"type": "nope"}'), 'Unsupported type "nope"'),
    (("ebnf", "root ::= foo"), 'Rule "foo" is not defined'),
])
def test_invalid_grammars_name_the_problem(backend, key, problem):
    with pytest.raises(GrammarCompileError) as e:
        backend.compile(key)
    assert f"invalid {key[0]}" in str(e.value) and problem in str(e.value)
    assert ".cc:" not in str(e.value)  # xgrammar's source location is not the client's business


def test_choice_regex_matches_exactly_the_choices(backend):
    choices = ["a.b", "c|d", "(x)", "yes no"]
    m = backend.matcher(backend.compile(("regex", choice_regex(choices))))
    for text in choices:
        m.reset()
        assert m.accept_string(text) and m.is_completed(), text
    m.reset()
    assert not m.accept_string("axb")


def test_compact_json_option(tiny_model_dir):
    path = str(tiny_model_dir("qwen3-vl-tiny"))
    compact = XGrammarBackend(path, 151936, json_options=JsonOptions(disable_any_whitespace=True))
    m = compact.matcher(compact.compile(("json_schema", '{"type": "object", "properties": {"a": {"type": "integer"}}, '
                                                        '"required": ["a"]}')))
    assert not m.accept_string('{ "a"')  # free whitespace refused
    m.reset()
    assert m.accept_string('{"a"')


# ----------------------------------------------------------------------------- cache
def test_cache_compiles_a_key_once_and_stays_bounded():
    calls, gate = [], threading.Event()

    def compile_fn(key):
        gate.wait(5)
        calls.append(key)
        if key[1] == "bad":
            raise GrammarCompileError("invalid regex: bad")
        return key[1].upper()

    cache = GrammarCache(compile_fn, max_entries=2)
    try:
        f1, f2 = cache.get(("regex", "a")), cache.get(("regex", "a"))
        assert f1 is f2  # concurrent requests share one compile
        gate.set()
        assert f1.result(5) == "A"
        bad = cache.get(("regex", "bad"))
        with pytest.raises(GrammarCompileError):
            bad.result(5)
        assert cache.get(("regex", "bad")) is bad  # the verdict is kept: not compiled again
        cache.get(("regex", "c")).result(5)
        assert len(cache) == 2 and ("regex", "a") not in cache  # least recently used went
        assert calls.count(("regex", "a")) == 1 and calls.count(("regex", "bad")) == 1
        assert cache.hits == 2 and cache.misses == 3
    finally:
        cache.close()


def test_cache_is_bounded_by_the_compiled_grammars_bytes():
    """Eight distinct large grammars no longer stay: the cache keeps what fits its byte budget (the
    scheduler's weighs xgrammar's memory_size_bytes), least recently used first, and one larger than
    the whole budget is not kept at all (its caller still gets it)."""
    sizes = {f"g{i}": 100_000 for i in range(8)} | {"huge": 10_000_000}
    cache = GrammarCache(lambda key: sizes[key[1]], max_entries=64, max_bytes=350_000, size_of=lambda s: s)
    try:
        for i in range(8):
            assert cache.get(("regex", f"g{i}")).result(5) == 100_000
        assert len(cache) == 3 and cache.bytes <= 350_000  # 3 x (100_000 + key) fit
        assert all(("regex", f"g{i}") in cache for i in (5, 6, 7))
        assert cache.get(("regex", "huge")).result(5) == 10_000_000
        assert ("regex", "huge") not in cache and len(cache) == 3
        assert cache.stats()["bytes"] == cache.bytes <= 350_000
    finally:
        cache.close()


def test_compiled_grammar_reports_its_memory(backend):
    """The figure the scheduler's cache weighs by: xgrammar's own, growing with the grammar."""
    small = backend.compile(("regex", "[0-9]{4}")).memory_size_bytes
    large = backend.compile(("regex", "[a-z]" * 2000)).memory_size_bytes
    assert 0 < small < large
