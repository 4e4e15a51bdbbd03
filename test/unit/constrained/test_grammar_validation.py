"""The tokenizer manager's grammar check: compiles (off the event loop) or answers 400 naming the
problem, within a time limit; --grammar-backend none refuses every constraint naming the flag."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from sglang.srt.constrained.validation import GrammarValidator
from sglang.srt.managers.errors import GenerateError

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
