"""Chat messages (OpenAI style) -> messages the chat template renders, plus their images and videos in order.

Image parts become `{"type": "image"}` (the Qwen templates render each as
`<|vision_start|><|image_pad|><|vision_end|>`) and their sources are collected in prompt order, so the
i-th placeholder of the rendered prompt belongs to the i-th image; video parts (`video_url`, `video`)
likewise become `{"type": "video"}` (`<|video_pad|>`) with their own list.

An assistant message's `tool_calls` reach the template with their `function.arguments` as objects
(OpenAI sends JSON text; the Qwen templates write the object out with `tojson`); `tool` messages
(results, with their `tool_call_id`) pass as they are.
"""

from __future__ import annotations

import json
from typing import Any

_ROLES = ("system", "developer", "user", "assistant", "tool")


def split_chat_media(messages: Any) -> tuple[list[dict[str, Any]], list[Any], list[Any]]:
    """Returns `(template_messages, image_sources, video_sources)`. A source is None for a bare
    `{"type": "image"}` / `{"type": "video"}` part, whose media the caller supplies separately
    (`image_data` / `video_data`). Raises ValueError naming the problem."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    out: list[dict[str, Any]] = []
    images: list[Any] = []
    videos: list[Any] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content'")
        role = msg.get("role")
        if role not in _ROLES:
            raise ValueError(f"messages[{i}].role must be one of {', '.join(_ROLES)}, got {role!r}")
        content = msg.get("content")
        new = dict(msg)
        if isinstance(content, list):
            new["content"] = [_convert_part(part, i, j, images, videos) for j, part in enumerate(content)]
        elif content is not None and not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string or a list of content parts")
        if msg.get("tool_calls") is not None:
            if role != "assistant":
                raise ValueError(f"messages[{i}]: only assistant messages carry tool_calls")
            new["tool_calls"] = [_template_tool_call(call, f"messages[{i}].tool_calls[{j}]")
                                 for j, call in enumerate(_list(msg["tool_calls"], f"messages[{i}].tool_calls"))]
        out.append(new)
    return out, images, videos


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list")
    return value


def _template_tool_call(call: Any, where: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ValueError(f"{where} needs a function with a string name")
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}.function.arguments is not valid JSON: {e}") from None
    return {**call, "function": {**fn, "arguments": {} if args is None else args}}


def _convert_part(part: Any, i: int, j: int, images: list[Any], videos: list[Any]) -> dict[str, Any]:
    where = f"messages[{i}].content[{j}]"
    if not isinstance(part, dict):
        raise ValueError(f"{where} must be an object with a 'type'")
    ptype = part.get("type")
    if ptype == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise ValueError(f"{where}: a text part needs a string 'text'")
        return {"type": "text", "text": text}
    for modality, sink in (("image", images), ("video", videos)):
        if ptype == f"{modality}_url":  # OpenAI's shape: {"type": "image_url", "image_url": {"url": ...}}
            ref = part.get(ptype)
            url = ref.get("url") if isinstance(ref, dict) else ref
            if not isinstance(url, str) or not url:
                article = "an" if ptype[0] in "aeiou" else "a"
                raise ValueError(f"{where}: {article} {ptype} part needs {ptype}.url (a data URL, http(s) URL or file path)")
            sink.append(url)
            return {"type": modality}
        if ptype == modality:  # the template's own shape; its source may come separately (None)
            sink.append(part.get(modality))
            return {"type": modality}
    raise ValueError(f"{where}: unsupported content part type {ptype!r}; supported: text, image_url, image, "
                     "video_url, video")
