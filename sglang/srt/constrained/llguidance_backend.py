"""llguidance as the grammar backend (`--grammar-backend llguidance`): the same request fields and the
same interface as `xgrammar_backend.XGrammarBackend` (compile a key, a fresh matcher per request, the
empty-language check), so the caches, the rank protocol and `matcher.RequestGrammar` serve both.

Keys map to llguidance grammars: `json_schema` through its JSON compiler (the server's whitespace
options as overrides), `regex` directly, `ebnf` (GBNF, as xgrammar reads it) converted to Lark, and
`structural_tag` in the structures-and-triggers form ({"structures": [{"begin", "schema", "end"}],
"triggers": [...]}) as llguidance structural tags. xgrammar's newer tag formats are refused by name.
A "compiled" grammar is llguidance's validated grammar text: llguidance builds its parser per matcher,
lazily, so there is nothing heavier to cache."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

from sglang.srt.constrained.xgrammar_backend import GrammarCompileError, JsonOptions, load_hf_tokenizer


@dataclass(frozen=True)
class LLGuidanceGrammar:
    text: str  # llguidance's grammar (JSON form), validated against the tokenizer

    @property
    def memory_size_bytes(self) -> int:
        return len(self.text)


class LLGuidanceMatcher:
    """An llguidance matcher behind the calls `RequestGrammar` makes of xgrammar's, with xgrammar's
    meaning: a rejected token leaves the state as it was (llguidance itself would enter a permanent error
    state), and the grammar is terminated once a stop token is accepted (llguidance reports "stopped" as
    soon as nothing but a stop token can follow, one token earlier)."""

    def __init__(self, matcher, stop_token_ids: frozenset[int]):
        self._m = matcher
        self._stops = stop_token_ids
        self._ended = False  # a stop token was accepted; it is kept here, never consumed by llguidance

    def accept_token(self, token: int) -> bool:
        token = int(token)
        if self._ended:
            return False
        if token in self._stops:
            self._ended = self._m.is_accepting() or self._m.is_stopped()
            return self._ended
        if self._m.validate_tokens([token]) < 1:
            return False
        return bool(self._m.consume_token(token)) and not self._m.is_error()

    def is_terminated(self) -> bool:
        return self._ended

    def rollback(self, num_tokens: int) -> None:
        if self._ended and num_tokens > 0:
            self._ended, num_tokens = False, num_tokens - 1
        if num_tokens:
            self._m.rollback(num_tokens)

    def reset(self) -> None:
        self._m.reset()
        self._ended = False

    def fill_next_token_bitmask(self, bitmask, index: int = 0) -> None:
        from llguidance.torch import fill_next_token_bitmask

        fill_next_token_bitmask(self._m, bitmask, index)


class LLGuidanceBackend:
    """`tokenizer`: a loaded HF tokenizer, a callable returning the process's own, or a path; `vocab_size`
    the model's logits width; `stop_token_ids` end a completed grammar."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int] | None = None,
                 json_options: JsonOptions = JsonOptions(), max_threads: int = 2):
        self._tokenizer = tokenizer
        self.vocab_size = int(vocab_size)
        self.stop_token_ids = sorted(stop_token_ids) if stop_token_ids else None
        self.json_options = json_options
        self._ll_tokenizer = None
        self._lock = threading.Lock()

    def _ensure(self):
        with self._lock:
            if self._ll_tokenizer is None:
                import llguidance.hf

                tok = load_hf_tokenizer(self._tokenizer)
                self._ll_tokenizer = llguidance.hf.from_tokenizer(tok, n_vocab=self.vocab_size,
                                                                  eos_token=self.stop_token_ids)
            return self._ll_tokenizer

    def prepare(self) -> None:
        self._ensure()

    def compile(self, key: tuple[str, str]) -> LLGuidanceGrammar:
        from llguidance import LLMatcher

        tok = self._ensure()
        kind, text = key
        try:
            grammar = self._grammar(kind, text)
        except (ValueError, TypeError, KeyError) as e:
            raise GrammarCompileError(f"invalid {kind}: {e}") from None
        is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, tok)
        if is_error:
            raise GrammarCompileError(f"invalid {kind}: {messages[0] if messages else 'rejected by llguidance'}")
        return LLGuidanceGrammar(grammar)

    def _grammar(self, kind: str, text: str) -> str:
        from llguidance import LLMatcher, StructTag
        from llguidance.gbnf_to_lark import gbnf_to_lark

        if kind == "json_schema":
            return LLMatcher.grammar_from_json_schema(text, overrides=self._json_overrides() or None)
        if kind == "regex":
            return LLMatcher.grammar_from_regex(text)
        if kind == "ebnf":
            try:
                lark = gbnf_to_lark(text)
            except Exception as e:  # the converter raises bare Exceptions ("Rule 'x' not found")
                raise ValueError(str(e)) from None
            return LLMatcher.grammar_from_lark(lark)
        if kind == "structural_tag":
            tag = json.loads(text)
            if not isinstance(tag, dict) or "structures" not in tag or "triggers" not in tag:
                raise ValueError("the llguidance backend takes structural tags of the form "
                                 '{"structures": [{"begin", "schema", "end"}], "triggers": [...]} only')
            tags = []
            for s in tag["structures"]:
                trigger = next((t for t in tag["triggers"] if s["begin"].startswith(t)), None)
                if trigger is None:
                    raise ValueError(f"no trigger starts the structure begin {s['begin']!r}")
                tags.append(StructTag(trigger=trigger, begin=s["begin"], grammar=s["schema"], end=s["end"]))
            return LLMatcher.grammar_from_lark(StructTag.to_grammar(tags))
        raise ValueError(f"unknown grammar kind {kind!r}")

    def _json_overrides(self) -> dict:
        opts = self.json_options
        if opts.disable_any_whitespace:
            return {"whitespace_flexible": False}
        if opts.max_whitespace_cnt is not None:
            return {"whitespace_pattern": rf"[\x20\x0A\x0D\x09]{{0,{opts.max_whitespace_cnt}}}"}
        return {}

    def matcher(self, compiled: LLGuidanceGrammar) -> LLGuidanceMatcher:
        from llguidance import LLMatcher

        return LLGuidanceMatcher(LLMatcher(self._ensure(), compiled.text, log_level=0),
                                 frozenset(self.stop_token_ids or ()))

    def admits_no_output(self, compiled: LLGuidanceGrammar) -> bool:
        """No token allowed at the grammar's start and the grammar not complete there."""
        from sglang.srt.constrained.matcher import allocate_bitmask

        m = self.matcher(compiled)
        if m.is_terminated():
            return False
        bitmask = allocate_bitmask(1, self.vocab_size)
        m.fill_next_token_bitmask(bitmask, 0)
        return not bool(bitmask.any())
