"""The tokenizer manager's grammar check: compiles (off the event loop) or answers 400 naming the
problem, within a time limit; --grammar-backend none refuses every constraint naming the flag."""

from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace

import pytest

from sglang.srt.constrained.validation import GrammarValidator
from sglang.srt.errors import GenerateError

ARGS = SimpleNamespace(grammar_backend="xgrammar", constrained_json_disable_any_whitespace=False,
                       constrained_json_max_whitespace_cnt=None)


@pytest.fixture(scope="module")
def model_path(tiny_model_dir):
    return str(tiny_model_dir("qwen3-vl-tiny"))


def test_valid_passes_invalid_is_a_400_naming_the_problem(model_path):
    v = GrammarValidator(ARGS, model_path, 151936)
    try:
        asyncio.run(v.check(("json_schema", '{"type": "object", "properties": {"a": {"type": "integer"}}}')))
        asyncio.run(v.check(None))
        with pytest.raises(GenerateError) as e:
            asyncio.run(v.check(("regex", "[a-")))
        assert e.value.status_code == 400 and e.value.message.startswith("invalid regex:")
        assert v.cache.misses == 2
        with pytest.raises(GenerateError):
            asyncio.run(v.check(("regex", "[a-")))
        assert v.cache.misses == 2 and v.cache.hits == 1  # the verdict is reused
    finally:
        v.close()


class _StuckBackend:
    def __init__(self):
        self.release = threading.Event()

    def compile(self, key):
        self.release.wait(30)


def test_a_compile_over_the_time_limit_is_a_400():
    stuck = _StuckBackend()
    v = GrammarValidator(ARGS, "unused", 100, backend=stuck, timeout_s=0.05)

    async def main():
        beat = asyncio.Event()

        async def heartbeat():  # the event loop keeps running while the compile is stuck
            await asyncio.sleep(0)
            beat.set()

        task = asyncio.ensure_future(heartbeat())
        with pytest.raises(GenerateError) as e:
            await v.check(("regex", "x+"))
        await task
        return beat.is_set(), e.value

    try:
        beat, err = asyncio.run(main())
        assert beat and err.status_code == 400 and "did not compile within 0.05 s" in err.message
    finally:
        stuck.release.set()
        v.close()


def test_grammar_backend_none_names_the_flag():
    v = GrammarValidator(SimpleNamespace(grammar_backend="none"), "unused", 100)
    with pytest.raises(GenerateError) as e:
        asyncio.run(v.check(("ebnf", 'root ::= "a"')))
    assert e.value.status_code == 400 and "--grammar-backend none" in e.value.message
    asyncio.run(v.check(None))


class _SlowBackend:
    """Grammars named "slow..." compile until the gate opens; the others at once."""

    def __init__(self):
        self.gate, self.compiled = threading.Event(), []

    def compile(self, key):
        if key[1].startswith("slow"):
            self.gate.wait(60)
        self.compiled.append(key)
        return key


def test_slow_compiles_past_the_limit_do_not_hold_back_the_next_check():
    """Every compile place taken by a grammar that overruns: each is a 400 naming the limit at its limit,
    and a small grammar checked next still compiles (it had waited for a place, then timed out, and the
    same slow grammar sent again compiled again)."""
    slow = _SlowBackend()
    v = GrammarValidator(ARGS, "unused", 100, backend=slow, timeout_s=1.0)

    async def main():
        hostile = [asyncio.ensure_future(v.check(("regex", f"slow{i}"))) for i in range(6)]
        errors = await asyncio.gather(*hostile, return_exceptions=True)
        await v.check(("regex", "[0-9]{4}"))  # the slow ones are still compiling (gate closed)
        with pytest.raises(GenerateError):
            await v.check(("regex", "slow0"))  # the verdict is kept: refused without compiling again
        return errors

    try:
        errors = asyncio.run(main())
        assert all(isinstance(e, GenerateError) and e.status_code == 400 for e in errors), errors
        assert errors[0].message == ("the regex did not compile within 1 s (SGLANG_GRAMMAR_COMPILE_TIMEOUT_S); "
                                     "simplify it")
        assert not slow.gate.is_set() and slow.compiled == [("regex", "[0-9]{4}")]
        assert v.cache.misses == 7 and v.cache.stats()["overruns"] == 6
    finally:
        slow.gate.set()
        v.close()


def test_the_check_cache_keeps_digests_not_texts(model_path):
    v = GrammarValidator(ARGS, model_path, 151936)
    big = "(" + "|".join(f"word{i}" for i in range(5000)) + ")"
    try:
        asyncio.run(v.check(("regex", big)))
        (kind, digest), = v.cache._entries
        assert kind == "regex" and isinstance(digest, bytes) and len(digest) == 32
        assert ("regex", big) in v.cache and v.cache.stats()["bytes"] < 1024
    finally:
        v.close()


@pytest.mark.parametrize("key, where", [
    (("json_schema", '{"$ref": "#"}'), "it admits no output"),
    (("json_schema", '{"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}'), "it admits no output"),
    (("structural_tag", json.dumps({"type": "structural_tag", "format": {
        "type": "tag", "begin": "<tool_call>\n", "content": {"type": "json_schema", "json_schema": {"$ref": "#"}},
        "end": "</tool_call>"}})), "the JSON schema at $.format.content admits no output"),
])
def test_a_grammar_that_admits_no_output_is_a_400(model_path, key, where):
    v = GrammarValidator(ARGS, model_path, 151936)
    try:
        with pytest.raises(GenerateError) as e:
            asyncio.run(v.check(key))
        assert e.value.status_code == 400 and e.value.message.startswith(f"invalid {key[0]}: {where} at all")
        recursive = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}
        asyncio.run(v.check(("json_schema", json.dumps(recursive))))  # recursion with a way out is fine
    finally:
        v.close()
