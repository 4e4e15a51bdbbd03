"""Grammar-constrained decoding (JSON schema, regex, EBNF) with xgrammar.

- `request_fields`: the request fields that carry a constraint (OpenAI `response_format`, SGLang's
  `json_schema` / `regex` / `ebnf`, vLLM's `guided_*`) -> one grammar key `(kind, text)`.
- `xgrammar_backend`: the tokenizer's vocabulary as xgrammar sees it and the compiler (one per process).
- `grammar_limits`: what a grammar's text may be before anything compiles it (size, multi-schema allOf).
- `compile_threads`: where compiles run, each within a time limit from its own start; an overrun gives
  its place back.
- `grammar_cache`: compiled grammars (and failures) by kind and digest, LRU bounded by count and bytes.
- `scheduler_grammar`: the scheduler's queue of requests whose grammar is still compiling, and the compile
  that is also the grammar's check (within the limit, non-empty language): the only compile, once per rank.
- `matcher`: a request's grammar state while it decodes, and the bitmask applied to a batch's logits.
"""
