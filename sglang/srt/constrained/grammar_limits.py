"""What a grammar's text may be before anything compiles it (checked wherever SamplingParams are, so on
the tokenizer side before the request is built, and again by the scheduler's guard):

- its size: at most SGLANG_GRAMMAR_MAX_BYTES of UTF-8. xgrammar's compile time and the compiled
  grammar's memory grow with the text (about 20 us and 200 bytes per byte of regex on a 152k vocabulary;
  a 1.5 MB regex compiled for longer than the time limit and held some 300 MB), and a compile cannot
  be interrupted;
- JSON schemas (also those inside a structural tag): `allOf` with more than one schema is refused.
  xgrammar 0.2.8 compiles it as if it were `anyOf` (an output matching any one of them passes), so a
  constraint the client relies on would silently not hold.
"""

from __future__ import annotations

import json

from sglang.srt.environ import envs

# keys whose values are data, not subschemas: an "allOf" inside them is not a keyword
_DATA_KEYS = frozenset(("enum", "const", "default", "examples"))


class GrammarLimitError(ValueError):
    pass


def max_grammar_bytes() -> int:
    return envs.SGLANG_GRAMMAR_MAX_BYTES.get()


def check_grammar_text(kind: str, text: str) -> None:
    """GrammarLimitError naming the limit when `text` is larger than SGLANG_GRAMMAR_MAX_BYTES, or a
    JSON schema in it uses what xgrammar would not enforce."""
    limit = max_grammar_bytes()
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise GrammarLimitError(f"{kind} is {size} bytes, more than the {limit}-byte limit (SGLANG_GRAMMAR_MAX_BYTES)")
    if kind in ("json_schema", "structural_tag"):
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return  # the request fields already parsed it; xgrammar names any other problem
        _check_all_of(value, kind)


def _check_all_of(root, kind: str) -> None:
    stack = [(root, "$")]  # iterative: a 64 KiB text can nest thousands of levels
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            all_of = node.get("allOf")
            if isinstance(all_of, list) and len(all_of) > 1:
                raise GrammarLimitError(
                    f"{kind}: allOf with {len(all_of)} schemas (at {path}) is not supported: xgrammar would accept "
                    "output matching any one of them, not all; merge them into one schema")
            stack.extend((v, f"{path}.{k}") for k, v in node.items() if k not in _DATA_KEYS)
        elif isinstance(node, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(node))
