"""xgrammar as the grammar backend: the tokenizer's vocabulary as xgrammar sees it (built once per
process, it walks the whole vocabulary) and one compiler over it.

A grammar key is `(kind, text)`: kind is the sampling parameter that carried it (`json_schema`,
`regex`, `ebnf`, `structural_tag`). Compiling is pure C++ that releases the GIL: callers run it in worker threads
(`grammar_cache.GrammarCache`). Compiled grammars do not pickle (xgrammar's JSON serialization of one
is megabytes at a 152k vocabulary), so each process compiles from the key it received.
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass



class GrammarCompileError(ValueError):
    """The grammar is invalid (or uses what xgrammar does not support); the message names the problem."""


def load_hf_tokenizer(tok):
    """A backend's `tokenizer` argument as the HF tokenizer: itself, what a callable returns (the
    process's own, loaded once), or loaded from a path (in the calling thread)."""
    if callable(tok) and not hasattr(tok, "get_vocab"):
        tok = tok()
    if isinstance(tok, (str, os.PathLike)):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(tok))
    return tok


@dataclass(frozen=True)
class JsonOptions:
    """--constrained-json-disable-any-whitespace, --constrained-json-max-whitespace-cnt."""

    disable_any_whitespace: bool = False
    max_whitespace_cnt: int | None = None

    @classmethod
    def from_server_args(cls, args) -> "JsonOptions":
        return cls(bool(args.constrained_json_disable_any_whitespace), args.constrained_json_max_whitespace_cnt)


class XGrammarBackend:
    """Compiles grammar keys against one tokenizer. `tokenizer` is a loaded HF tokenizer, a callable
    returning the process's own (so one process loads one tokenizer, not one per user of it), or a
    path (loaded on first use, in the compiling thread). `vocab_size` is the model's (its logits' width);
    `stop_token_ids` end a completed grammar (the model's EOS ids)."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int] | None = None,
                 json_options: JsonOptions = JsonOptions(), max_threads: int = 2):
        self._tokenizer = tokenizer
        self.vocab_size = int(vocab_size)
        self.stop_token_ids = sorted(stop_token_ids) if stop_token_ids else None
        self.json_options = json_options
        self._max_threads = max_threads
        self._compiler = None
        self._info = None
        self._lock = threading.Lock()

    @property
    def tokenizer_info(self):
        self._ensure()
        return self._info

    def _ensure(self) -> None:
        with self._lock:
            if self._compiler is not None:
                return
            import xgrammar as xg

            tok = load_hf_tokenizer(self._tokenizer)
            self._info = xg.TokenizerInfo.from_huggingface(tok, vocab_size=self.vocab_size,
                                                           stop_token_ids=self.stop_token_ids)
            # our own LRU (grammar_cache) bounds what is kept: xgrammar's cache stays off
            self._compiler = xg.GrammarCompiler(self._info, max_threads=self._max_threads, cache_enabled=False)

    def prepare(self) -> None:
        """Builds the vocabulary view and the compiler (once; a compile does it on first use)."""
        self._ensure()

    def compile(self, key: tuple[str, str]):
        """The CompiledGrammar of `key`; GrammarCompileError naming the problem if it does not compile."""
        self._ensure()
        kind, text = key
        opts = self.json_options
        try:
            if kind == "json_schema":
                return self._compiler.compile_grammar(strict_json_ebnf(text, opts))
            if kind == "regex":
                return self._compiler.compile_regex(text)
            if kind == "ebnf":
                return self._compiler.compile_grammar(text)
            if kind == "structural_tag":
                return self._compiler.compile_structural_tag(self._with_json_options(text))
        except (RuntimeError, ValueError, TypeError) as e:
            raise GrammarCompileError(f"invalid {kind}: {_clean(str(e))}") from None
        raise GrammarCompileError(f"unknown grammar kind {kind!r}")

    def _with_json_options(self, text: str) -> str:
        """The structural tag with the server's JSON whitespace options on every JSON schema inside it
        that sets none of its own (compile_structural_tag takes no options). A tag's json_schema node has
        no `any_whitespace`, and xgrammar refuses `max_whitespace_cnt: 0`: under
        --constrained-json-disable-any-whitespace a plain JSON node becomes the grammar node of the
        same schema compiled compact (what compile_json_schema(any_whitespace=False) accepts)."""
        opts = self.json_options
        if not opts.disable_any_whitespace and opts.max_whitespace_cnt is None:
            return text
        try:
            tag = json.loads(text)
        except json.JSONDecodeError:
            return text  # xgrammar names the problem

        def visit(node):
            if isinstance(node, dict):
                if node.get("type") == "json_schema" and "json_schema" in node:
                    _apply_json_options(node, opts)
                for value in node.values():
                    visit(value)
            elif isinstance(node, list):
                for value in node:
                    visit(value)

        visit(tag)
        return json.dumps(tag, ensure_ascii=False)

    def admits_no_output(self, compiled) -> bool:
        """True when the grammar allows no token at its start and is not complete there: no output can
        match it (e.g. the schema {"$ref": "#"}, whose only rule is itself)."""
        import xgrammar as xg

        m = self.matcher(compiled)
        if m.is_terminated():
            return False
        bitmask = xg.allocate_token_bitmask(1, self.vocab_size)
        m.fill_next_token_bitmask(bitmask)
        return not bool(bitmask.any())

    def matcher(self, compiled):
        """A fresh matcher at the grammar's start (rollback kept for as many tokens as asked)."""
        import xgrammar as xg

        return xg.GrammarMatcher(compiled, override_stop_tokens=self.stop_token_ids)


# a negated character class of the EBNF text xgrammar prints, escapes included
_NEGATED_CLASS = re.compile(r"\[\^((?:\\.|[^\]\\])*)\]")
_CONTROL = "\\0-\\x1f"


def strict_json_ebnf(schema: str, opts: JsonOptions) -> str:
    """The EBNF of `schema` with every JSON string body refusing raw control characters (U+0000-U+001F),
    as RFC 8259 requires: xgrammar 0.2.9 lets them into length-bounded strings (`{"maxLength": 20}`), so
    an answer could fail json.loads. A string body is a negated class that excludes the quote."""
    import xgrammar as xg

    ebnf = str(xg.Grammar.from_json_schema(schema, any_whitespace=not opts.disable_any_whitespace,
                                           max_whitespace_cnt=opts.max_whitespace_cnt))

    def strict(m: re.Match) -> str:
        body = m.group(1)
        if '\\"' not in body or body.startswith(_CONTROL):
            return m.group(0)
        return f"[^{_CONTROL}{body}]"

    return _NEGATED_CLASS.sub(strict, ebnf)


# json_schema node fields that a grammar node cannot carry: a node using one keeps its json_schema form
_JSON_NODE_ONLY = ("any_order", "excludes", "max_whitespace_cnt")


def _apply_json_options(node: dict, opts: JsonOptions) -> None:
    """One structural-tag json_schema node under the server's whitespace options, in place."""
    if "max_whitespace_cnt" in node:
        return  # the tag's own limit wins
    if not opts.disable_any_whitespace:
        node["max_whitespace_cnt"] = opts.max_whitespace_cnt
        return
    if node.get("style", "json") != "json" or any(k in node for k in _JSON_NODE_ONLY):
        return  # XML styles have no JSON separators; these options exist only on the json_schema node
    import xgrammar as xg

    schema = node["json_schema"]
    ebnf = str(xg.Grammar.from_json_schema(schema if isinstance(schema, str) else json.dumps(schema),
                                           any_whitespace=False, strict_mode=True))
    node.clear()
    node.update(type="grammar", grammar=ebnf)


def _clean(message: str) -> str:
    """xgrammar's error text without its `[time] /path/file.cc:line:` prefix and the schema echo."""
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    text = " ".join(lines) if lines else message
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
        head, sep, rest = text.partition(": ")
        if sep and ".cc:" in head:
            text = rest
    text = text.split(" The JSON string is:", 1)[0]
    return text[:500]
