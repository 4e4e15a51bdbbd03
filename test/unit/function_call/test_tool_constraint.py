"""tool_choice `required` / a named function as a structural tag: random walks through the grammar over
the tiny model's real vocabulary (every step a uniformly random allowed token, as a random-weight model
samples) always end in calls the qwen25 parser reads back, to offered functions, whose arguments
validate against their schema; one call for a named function or parallel_tool_calls false."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch

from sglang.srt.constrained.xgrammar_backend import JsonOptions, XGrammarBackend
from sglang.srt.function_call.function_call_parser import FunctionCallParser
from sglang.srt.function_call.tool_constraint import (
    ToolChoiceError,
    chosen_functions,
    strict_auto_structural_tag,
    tool_call_structural_tag,
)

# a test dependency (pyproject's test extra); the GPU image lacks it and its suite collects this module
jsonschema = pytest.importorskip("jsonschema")

VOCAB = 151936
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 8},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                        "b": {"type": "integer"}}, "required": ["a", "b"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": ADD}},
         {"type": "function", "function": {"name": "ping"}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD, "ping": {"type": "object", "maxProperties": 0}}


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    return XGrammarBackend(str(tiny_model_dir("qwen3-vl-tiny")), VOCAB, stop_token_ids=[151645],
                           json_options=JsonOptions(max_whitespace_cnt=2))


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir("qwen3-vl-tiny")))


def random_walk(backend, compiled, seed: int, max_steps: int = 400) -> list[int]:
    import xgrammar as xg

    m, rng, out = backend.matcher(compiled), random.Random(seed), []
    bitmask = xg.allocate_token_bitmask(1, VOCAB)
    shifts = torch.arange(32, dtype=torch.int32)
    while not m.is_terminated():
        assert len(out) < max_steps, "the grammar did not end"
        m.fill_next_token_bitmask(bitmask)
        allowed = ((bitmask[0].unsqueeze(-1) >> shifts) & 1).view(-1)[:VOCAB].nonzero().flatten().tolist()
        tok = rng.choice(allowed)
        assert m.accept_token(tok)
        out.append(tok)
    return out


@pytest.mark.parametrize("choice, one_call, names, seeds", [
    ("required", False, {"get_weather", "add", "ping"}, 1),  # several calls: long walks
    ("required", True, {"get_weather", "add", "ping"}, 3),
    ({"type": "function", "function": {"name": "add"}}, True, {"add"}, 2),
])
def test_walks_end_in_valid_calls(backend, tok, choice, one_call, names, seeds):
    compiled = backend.compile(("structural_tag", tool_call_structural_tag(chosen_functions(TOOLS, choice), one_call)))
    for seed in range(seeds):
        ids = random_walk(backend, compiled, seed)
        assert ids[-1] == 151645
        text = tok.decode(ids[:-1], skip_special_tokens=False)
        content, calls = FunctionCallParser(TOOLS, "qwen25").parse_non_stream(text)
        assert content == "" and calls, text
        if one_call:
            assert len(calls) == 1, text
        for call in calls:
            assert call.name in names
            jsonschema.validate(json.loads(call.parameters, strict=False), SCHEMAS[call.name])


def test_choices_that_constrain_nothing_or_are_refused():
    assert chosen_functions(TOOLS, "auto") is None and chosen_functions(TOOLS, "none") is None
    assert chosen_functions(TOOLS, None) is None
    with pytest.raises(ToolChoiceError, match="Tool 'nope' not found in tools list"):
        chosen_functions(TOOLS, {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(ToolChoiceError, match="needs tools"):
        chosen_functions([], "required")
    with pytest.raises(ToolChoiceError, match="tool_choice must be"):
        chosen_functions(TOOLS, "always")
    with pytest.raises(ToolChoiceError, match=r"tools\[0\]: only tools of type 'function'"):
        chosen_functions([{"type": "code_interpreter"}], "auto")
    with pytest.raises(ToolChoiceError, match=r"tools\[0\].function needs a non-empty string 'name'"):
        chosen_functions([{"type": "function", "function": {}}], "auto")


def test_strict_auto_constrains_only_the_calls_that_begin(backend):
    assert strict_auto_structural_tag(TOOLS, one_call=False) is None  # no strict function: nothing
    strict = [{**t, "function": {**t["function"], "strict": True}} if i == 1 else t for i, t in enumerate(TOOLS)]
    compiled = backend.compile(("structural_tag", strict_auto_structural_tag(strict, one_call=False)))
    good = 'Let me add. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert backend.matcher(compiled).accept_string(good)
    assert backend.matcher(compiled).accept_string("no call at all")
    assert not backend.matcher(compiled).accept_string('<tool_call>\n{"name": "add", "arguments": {"a": "x"')
    assert not backend.matcher(compiled).accept_string('<tool_call>\n{"name": "nope"')


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}, "strict"])
def test_compact_json_flag_compiles_every_tool_grammar(tiny_model_dir, tok, choice):
    """--constrained-json-disable-any-whitespace: the call grammars compile (xgrammar refuses a tag's
    max_whitespace_cnt 0) and their arguments are compact JSON, as compile_json_schema's. (Functions
    without length-bounded strings: xgrammar lets those hold raw control characters, see
    docs/structured-output.md, which the parser's strict JSON refuses.)"""
    tools = TOOLS[1:]
    compact = XGrammarBackend(str(tiny_model_dir("qwen3-vl-tiny")), VOCAB, stop_token_ids=[151645],
                              json_options=JsonOptions(disable_any_whitespace=True))
    if choice == "strict":
        strict = [{**t, "function": {**t["function"], "strict": True}} for t in tools]
        tag = strict_auto_structural_tag(strict, one_call=True)
    else:
        tag = tool_call_structural_tag(chosen_functions(tools, choice), one_call=True)
    compiled = compact.compile(("structural_tag", tag))
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert compact.matcher(compiled).accept_string(call)
    assert not compact.matcher(compiled).accept_string(call.replace('{"a": 1', '{ "a": 1'))  # free whitespace
    for seed in range(2 if choice != "strict" else 0):  # strict auto: free text first, walks need not end
        text = tok.decode(random_walk(compact, compiled, seed)[:-1], skip_special_tokens=False)
        _, calls = FunctionCallParser(tools, "qwen25").parse_non_stream(text)
        assert len(calls) == 1, text
        outside_strings = re.sub(r'"(?:\\.|[^"\\])*"', '""', calls[0].parameters)
        assert not re.search(r"\s", re.sub(r"[,:] ", "", outside_strings)), text  # only the separators' spaces
        jsonschema.validate(json.loads(calls[0].parameters, strict=False), SCHEMAS[calls[0].name])
