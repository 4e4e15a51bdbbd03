"""`--grammar-backend`: which library compiles grammars and drives the per-request matchers."""

from __future__ import annotations

from sglang.srt.constrained.llguidance_backend import LLGuidanceBackend
from sglang.srt.constrained.xgrammar_backend import JsonOptions, XGrammarBackend

BACKENDS = {"xgrammar": XGrammarBackend, "llguidance": LLGuidanceBackend}


def make_grammar_backend(name: str, tokenizer, vocab_size: int, stop_token_ids: list[int] | None = None,
                         json_options: JsonOptions = JsonOptions()):
    """The backend `name` over `tokenizer` (loaded, a callable returning it, or a path); "none" has none."""
    if name not in BACKENDS:
        raise ValueError(f"grammar backend {name!r} has no compiler; choose one of {sorted(BACKENDS)}")
    return BACKENDS[name](tokenizer, vocab_size, stop_token_ids, json_options)
