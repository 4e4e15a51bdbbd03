"""The tokenizer manager's grammar check: a request's grammar is compiled here, in a compile thread and
within SGLANG_GRAMMAR_COMPILE_TIMEOUT_S of its own start (`compile_threads`), before the request is
sent, so an invalid schema, regex or grammar, or one that compiles too
slowly is a 400 naming the problem before any KV is taken. Verdicts are kept in a bounded LRU by
(kind, SHA-256 of the text): a repeated grammar is checked once, and the cache holds no grammar text.
The compiled grammar itself is dropped here (each scheduler rank compiles its own; see
`scheduler_grammar`)."""

from __future__ import annotations

import asyncio

from sglang.srt.constrained.grammar_cache import GrammarCache
from sglang.srt.constrained.xgrammar_backend import GrammarCompileError, JsonOptions, XGrammarBackend
from sglang.srt.environ import envs
from sglang.srt.managers.errors import GenerateError

VALIDATION_CACHE_ENTRIES = 1024
CHECK_PLACES = 4  # compiles at a time; one past its time limit gives its place back


class GrammarValidator:
    def __init__(self, server_args, tokenizer_path: str, vocab_size: int, backend=None,
                 timeout_s: float | None = None):
        self.backend_name = server_args.grammar_backend
        self.timeout_s = envs.SGLANG_GRAMMAR_COMPILE_TIMEOUT_S.get() if timeout_s is None else timeout_s
        self.cache = None
        if self.backend_name != "none":
            self.backend = backend or XGrammarBackend(tokenizer_path, vocab_size,
                                                      json_options=JsonOptions.from_server_args(server_args))
            self.cache = GrammarCache(self._verdict, VALIDATION_CACHE_ENTRIES, threads=CHECK_PLACES,
                                      name="sglang-grammar-check", timeout_s=self.timeout_s,
                                      prepare=getattr(self.backend, "prepare", None))

    def _verdict(self, key: tuple[str, str]) -> bool:
        self.backend.compile(key)  # raises GrammarCompileError naming the problem
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

