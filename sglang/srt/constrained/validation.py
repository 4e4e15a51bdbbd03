"""The tokenizer manager's grammar check: a request's grammar is compiled here, in a compile thread and
within SGLANG_GRAMMAR_COMPILE_TIMEOUT_S of its own start (`compile_threads`), before the request is
sent, so an invalid schema, regex or grammar, one whose language is empty, or one that compiles too
slowly is a 400 naming the problem before any KV is taken. Verdicts are kept in a bounded LRU by
(kind, SHA-256 of the text): a repeated grammar is checked once, and the cache holds no grammar text.
The compiled grammar itself is dropped here (each scheduler rank compiles its own; see
`scheduler_grammar`)."""

from __future__ import annotations

import asyncio
import json

from sglang.srt.constrained.grammar_cache import GrammarCache
from sglang.srt.constrained.backends import make_grammar_backend
from sglang.srt.constrained.xgrammar_backend import GrammarCompileError, JsonOptions
from sglang.srt.environ import envs
from sglang.srt.errors import GenerateError

VALIDATION_CACHE_ENTRIES = 1024
CHECK_PLACES = 4  # compiles at a time; one past its time limit gives its place back
EMPTY_LANGUAGE = "admits no output at all (a schema that only refers to itself, such as {\"$ref\": \"#\"}, matches nothing)"


class GrammarValidator:
    def __init__(self, server_args, tokenizer, vocab_size: int, backend=None,
                 timeout_s: float | None = None):
        self.backend_name = server_args.grammar_backend
        self.timeout_s = envs.SGLANG_GRAMMAR_COMPILE_TIMEOUT_S.get() if timeout_s is None else timeout_s
        self.cache = None
        if self.backend_name != "none":
            # the tokenizer manager's own tokenizer (or a path): xgrammar's vocabulary view is built from it
            self.backend = backend or make_grammar_backend(self.backend_name, tokenizer, vocab_size,
                                                           json_options=JsonOptions.from_server_args(server_args))
            self.cache = GrammarCache(self._verdict, VALIDATION_CACHE_ENTRIES, threads=CHECK_PLACES,
                                      name="sglang-grammar-check", timeout_s=self.timeout_s,
                                      prepare=getattr(self.backend, "prepare", None))

    def _verdict(self, key: tuple[str, str]) -> bool:
        compiled = self.backend.compile(key)  # raises GrammarCompileError naming the problem
        if not hasattr(self.backend, "admits_no_output"):
            return True
        kind, text = key
        # an empty language would sample from an all-masked row: refused here, not failed mid-decode
        if self.backend.admits_no_output(compiled):
            raise GrammarCompileError(f"invalid {kind}: it {EMPTY_LANGUAGE}")
        if kind == "structural_tag":
            for where, schema in _json_nodes(json.loads(text)):
                if self.backend.admits_no_output(self.backend.compile(("json_schema", json.dumps(schema)))):
                    raise GrammarCompileError(f"invalid {kind}: the JSON schema at {where} {EMPTY_LANGUAGE}")
        return True

    async def check(self, key: tuple[str, str] | None) -> None:
        """Returns when `key` compiles; GenerateError (400) otherwise. None: nothing to check."""
        if key is None:
            return
        kind = key[0]
        if self.cache is None:
            raise GenerateError(f"{kind} is not supported: this server runs with --grammar-backend none "
                                "(start it with --grammar-backend xgrammar for constrained output)")
        try:
            await asyncio.shield(asyncio.wrap_future(self.cache.get(key)))
        except GrammarCompileError as e:  # a time-limit overrun included (GrammarCompileTimeout)
            raise GenerateError(str(e)) from None

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()


def _json_nodes(tag) -> list[tuple[str, object]]:
    """(path, schema) of every json_schema node of a structural tag (tool calls' parameters included)."""
    found, stack = [], [(tag, "$")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "json_schema" and "json_schema" in node:
                found.append((path, node["json_schema"]))
            stack.extend((v, f"{path}.{k}") for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(node))
    return found
