"""`tool_choice` `required` or a named function as a grammar: an xgrammar structural tag whose tags are
the chat template's own call blocks,

    <tool_call>\\n{"name": "NAME", "arguments": <the function's parameters schema>}\\n</tool_call>

so the output is one or more calls (exactly one for a named function or `parallel_tool_calls: false`)
that the qwen25 parser reads back and whose arguments validate against the schema. `none` constrains
nothing; `auto` neither, unless a function is `strict` (OpenAI's flag): then the text is free until a
`<tool_call>` begins, and every call that begins is one of these blocks."""

from __future__ import annotations

import json
from typing import Any

from sglang.srt.function_call.qwen25_detector import END, START

# a function without `parameters` takes none (OpenAI's rule): its arguments are an empty object
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


class ToolChoiceError(ValueError):
    pass


def function_of(tool: Any, where: str) -> dict[str, Any]:
    """The `function` object of an OpenAI tool, checked: a name, parameters an object schema if given."""
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise ToolChoiceError(f"{where}: only tools of type 'function' are supported")
    fn = tool.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ToolChoiceError(f"{where}.function needs a non-empty string 'name'")
    params = fn.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise ToolChoiceError(f"{where}.function.parameters must be a JSON schema object")
    bad = _unknown_type(params) if params is not None else None
    if bad is not None:  # upstream's wording; the grammar compiler would name its own internals
        raise ToolChoiceError(f"invalid 'parameters' schema of function {fn['name']!r}: unknown type {bad[1]!r:.100} "
                              f"at {bad[0]}")
    return fn


_JSON_TYPES = frozenset(("string", "number", "integer", "boolean", "object", "array", "null"))


def _unknown_type(schema: Any, where: str = "$", depth: int = 0) -> tuple[str, Any] | None:
    """(where, value) of the first `type` that is no JSON Schema type, in a schema or any schema it nests
    (properties, items, ...); a property *named* "type" is data, not a keyword. Depth-bounded."""
    if depth > 64 or not isinstance(schema, dict):
        return None
    t = schema.get("type")
    if t is not None and not (t in _JSON_TYPES if isinstance(t, str) else
                              isinstance(t, list) and all(isinstance(x, str) and x in _JSON_TYPES for x in t)):
        return where, t
    for key, sub in schema.items():
        if key in ("properties", "patternProperties", "$defs", "definitions") and isinstance(sub, dict):
            found = next((f for name, s in sub.items() if (f := _unknown_type(s, f"{where}.{key}.{name}", depth + 1))), None)
        elif key in ("items", "additionalProperties", "not", "contains", "if", "then", "else") and isinstance(sub, dict):
            found = _unknown_type(sub, f"{where}.{key}", depth + 1)
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems") and isinstance(sub, list):
            found = next((f for i, s in enumerate(sub) if (f := _unknown_type(s, f"{where}.{key}[{i}]", depth + 1))), None)
        else:
            continue
        if found:
            return found
    return None


def chosen_functions(tools: list[Any], tool_choice: Any) -> list[dict[str, Any]] | None:
    """The functions a call must be made to (`required`: any offered one; named: that one), or None
    when the model chooses (`auto`, `none`, unset)."""
    fns = [function_of(t, f"tools[{i}]") for i, t in enumerate(tools or [])]
    if tool_choice in (None, "auto", "none"):
        return None
    if tool_choice == "required":
        if not fns:
            raise ToolChoiceError("tool_choice 'required' needs tools")
        return fns
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        match = [fn for fn in fns if fn["name"] == name]
        if not match:
            raise ToolChoiceError(f"Tool {name!r} not found in tools list")  # upstream's wording
        return match[:1]
    raise ToolChoiceError(f"tool_choice must be 'none', 'auto', 'required' or "
                          f'{{"type": "function", "function": {{"name": ...}}}}, got {tool_choice!r:.200}')


def _call_tags(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{
        "type": "tag",
        "begin": START + "\n" + '{"name": ' + json.dumps(fn["name"], ensure_ascii=False) + ', "arguments": ',
        "content": {"type": "json_schema", "json_schema": fn.get("parameters") or NO_PARAMETERS},
        "end": "}\n" + END,
    } for fn in functions]


def tool_call_structural_tag(functions: list[dict[str, Any]], one_call: bool) -> str:
    """The structural tag (JSON text) of one or more calls to `functions` (exactly one if `one_call`)."""
    fmt = {"type": "tags_with_separator", "tags": _call_tags(functions), "separator": "\n", "at_least_one": True,
           "stop_after_first": one_call}
    return json.dumps({"type": "structural_tag", "format": fmt}, ensure_ascii=False)


def strict_auto_structural_tag(tools: list[Any], one_call: bool) -> str | None:
    """tool_choice auto with a `strict` function: free text, and every call block that begins is a call
    to an offered function whose arguments follow its schema (JSON text); None when no function is strict."""
    fns = [function_of(t, f"tools[{i}]") for i, t in enumerate(tools or [])]
    if not any(fn.get("strict") for fn in fns):
        return None
    fmt = {"type": "triggered_tags", "triggers": [START], "tags": _call_tags(fns), "at_least_one": False,
           "stop_after_first": one_call}
    return json.dumps({"type": "structural_tag", "format": fmt}, ensure_ascii=False)
