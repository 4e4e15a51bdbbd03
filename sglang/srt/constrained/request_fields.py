"""The request fields that constrain the output, turned into the engine's sampling parameters.

The engine's own names (upstream's `sampling_params`): `json_schema` (a JSON schema as a string),
`regex`, `ebnf`, `structural_tag` (xgrammar's structural tag, its JSON text). The OpenAI layer also takes `response_format` (`text`, `json_object`, `json_schema`),
the same three names at the top level of the body, and vLLM's `guided_json`, `guided_regex`,
`guided_choice` and `guided_grammar`. A request carries at most one constraint; two are refused naming
both. Every problem raises `ConstraintError` (a ValueError: the caller answers 400 with its message).
"""

from __future__ import annotations

import json
from typing import Any

from sglang.srt.constrained.grammar_limits import GrammarLimitError, check_grammar_text

# sampling parameter -> grammar kind
GRAMMAR_KINDS = ("json_schema", "regex", "ebnf", "structural_tag")
# what response_format {"type": "json_object"} compiles to: any JSON object, as OpenAI's JSON mode
JSON_OBJECT_SCHEMA = '{"type": "object"}'
# the schema of response_format {"type": "json_schema"} without a `schema`: any JSON value
ANY_JSON_SCHEMA = "{}"
# characters with a meaning in a regex: escaped in guided_choice alternatives
_REGEX_SPECIAL = set("\\.^$*+?()[]{}|/-")


class ConstraintError(ValueError):
    pass


def schema_text(value: Any, name: str) -> str:
    """A JSON schema given as an object or as a string holding one -> its JSON text (key order kept:
    it is the order the properties are generated in)."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as e:
            raise ConstraintError(f"{name} is not valid JSON: {e}") from None
        except RecursionError:  # a few KiB of brackets nest deeper than the parser's recursion
            raise ConstraintError(f"{name} nests too deeply") from None
        if not isinstance(parsed, (dict, bool)):
            raise ConstraintError(f"{name} must be a JSON schema object, got {type(parsed).__name__}")
        return value
    if isinstance(value, (dict, bool)):
        return json.dumps(value, ensure_ascii=False)
    raise ConstraintError(f"{name} must be a JSON schema (an object or a string), got {type(value).__name__}")


def _string(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConstraintError(f"{name} must be a non-empty string, got {value!r:.100}")
    return value


def choice_regex(choices: Any, name: str = "guided_choice") -> str:
    """A regex matching exactly one of the strings `choices`."""
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise ConstraintError(f"{name} must be a non-empty list of non-empty strings")
    return "(" + "|".join("".join("\\" + ch if ch in _REGEX_SPECIAL else ch for ch in c) for c in choices) + ")"


def response_format_constraint(fmt: Any) -> tuple[str, str] | None:
    """OpenAI's `response_format` -> (sampling parameter, value), or None for `text`."""
    if not isinstance(fmt, dict):
        raise ConstraintError(f"response_format must be an object, got {type(fmt).__name__}")
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return "json_schema", JSON_OBJECT_SCHEMA
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise ConstraintError('response_format {"type": "json_schema"} needs a "json_schema" object '
                                  '({"name": ..., "schema": {...}})')
        schema = spec.get("schema", spec.get("schema_"))
        if schema is None:
            return "json_schema", ANY_JSON_SCHEMA
        return "json_schema", schema_text(schema, "response_format.json_schema.schema")
    if kind == "structural_tag":
        return "structural_tag", structural_tag_text(fmt, "response_format")
    raise ConstraintError(f"response_format type {kind!r} is not supported: use text, json_object, json_schema "
                          "or structural_tag")


def structural_tag_text(value: Any, name: str) -> str:
    """A structural tag (an object or its JSON text) -> xgrammar's JSON text: `{"type": "structural_tag",
    "format": {...}}` as is, or upstream's older `{"structures": [{"begin", "schema", "end"}], "triggers":
    [...]}` as the equivalent triggered tags."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ConstraintError(f"{name} is not valid JSON: {e}") from None
        except RecursionError:  # a few KiB of brackets nest deeper than the parser's recursion
            raise ConstraintError(f"{name} nests too deeply") from None
    if not isinstance(value, dict):
        raise ConstraintError(f"{name} must be a structural tag object, got {type(value).__name__}")
    if "format" in value:
        return json.dumps({"type": "structural_tag", "format": value["format"]}, ensure_ascii=False)
    structures, triggers = value.get("structures"), value.get("triggers")
    if not isinstance(structures, list) or not structures or not isinstance(triggers, list) or not triggers:
        raise ConstraintError(f'{name}: a structural tag needs "format", or "structures" and "triggers"')
    tags = []
    for i, st in enumerate(structures):
        if not isinstance(st, dict) or not all(isinstance(st.get(k), str) for k in ("begin", "end")):
            raise ConstraintError(f'{name}.structures[{i}] needs string "begin" and "end" and a "schema"')
        schema = st.get("schema", st.get("schema_", {}))
        schema = json.loads(schema_text(schema, f"{name}.structures[{i}].schema"))
        tags.append({"type": "tag", "begin": st["begin"], "content": {"type": "json_schema", "json_schema": schema},
                     "end": st["end"]})
    fmt = {"type": "triggered_tags", "triggers": triggers, "tags": tags}
    return json.dumps({"type": "structural_tag", "format": fmt}, ensure_ascii=False)


# request field -> (sampling parameter, converter of the field's value)
_FIELDS = {
    "json_schema": ("json_schema", lambda v: schema_text(v, "json_schema")),
    "regex": ("regex", lambda v: _string(v, "regex")),
    "ebnf": ("ebnf", lambda v: _string(v, "ebnf")),
    "guided_json": ("json_schema", lambda v: schema_text(v, "guided_json")),
    "guided_regex": ("regex", lambda v: _string(v, "guided_regex")),
    "guided_choice": ("regex", choice_regex),
    "guided_grammar": ("ebnf", lambda v: _string(v, "guided_grammar")),
}


# the OpenAI body's top-level fields that carry a constraint
CONSTRAINT_FIELDS = ("response_format", *_FIELDS)


def constraint_params(fields: dict[str, Any]) -> dict[str, str]:
    """The OpenAI body's constraint fields (`fields`: name -> value, None for absent) -> at most one of
    {"json_schema" | "regex" | "ebnf": text}."""
    found: list[tuple[str, str, str]] = []  # (request field, sampling parameter, value)
    fmt = fields.get("response_format")
    if fmt is not None:
        got = response_format_constraint(fmt)
        if got is not None:
            found.append((f"response_format {fmt.get('type')}", *got))
    for name, (param, convert) in _FIELDS.items():
        value = fields.get(name)
        if value is not None:
            found.append((name, param, convert(value)))
    if len(found) > 1:
        raise ConstraintError(f"at most one output constraint per request: got {found[0][0]} and {found[1][0]}")
    return {found[0][1]: found[0][2]} if found else {}


def openai_constraint_fields(req: Any) -> dict[str, Any]:
    """The constraint fields of a pydantic OpenAI request, declared or extra."""
    extra = getattr(req, "model_extra", None) or {}
    return {n: getattr(req, n, None) if getattr(req, n, None) is not None else extra.get(n) for n in CONSTRAINT_FIELDS}


def checked_sampling_constraint(params: Any) -> tuple[str, str] | None:
    """SamplingParams' json_schema / regex / ebnf checked (strings; a schema object becomes its text) and
    normalised in place; the grammar key (kind, text), or None without a constraint."""
    given = [k for k in GRAMMAR_KINDS if getattr(params, k) is not None]
    if len(given) > 1:
        raise ConstraintError(f"at most one output constraint per request: got {given[0]} and {given[1]}")
    if not given:
        return None
    kind = given[0]
    value = getattr(params, kind)
    if kind == "json_schema":
        value = schema_text(value, kind)
    elif kind == "structural_tag":
        value = structural_tag_text(value, kind)
    else:
        value = _string(value, kind)
    try:
        check_grammar_text(kind, value)  # size and unsupported schema keywords, before anything compiles it
    except GrammarLimitError as e:
        raise ConstraintError(str(e)) from None
    setattr(params, kind, value)
    return kind, value
