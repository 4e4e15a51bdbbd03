"""Grammar-constrained decoding (JSON schema, regex, EBNF) with xgrammar.

- `request_fields`: the request fields that carry a constraint (OpenAI `response_format`, SGLang's
  `json_schema` / `regex` / `ebnf`, vLLM's `guided_*`) -> one grammar key `(kind, text)`.
- `xgrammar_backend`: the tokenizer's vocabulary as xgrammar sees it and the compiler (one per process).
- `grammar_cache`: compiled grammars by key, bounded LRU, compiled in worker threads.
- `validation`: the tokenizer manager's check (compile, with a timeout) that makes a bad grammar a 400.
- `scheduler_grammar`: the scheduler's queue of requests whose grammar is still compiling.
- `matcher`: a request's grammar state while it decodes, and the bitmask applied to a batch's logits.
"""
