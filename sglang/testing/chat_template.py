"""Qwen-VL style chat templates (Jinja) for the generated test models.

Written for this project.  The rendered layout follows the public Qwen-VL chat format:

    <|im_start|>system\\n...<|im_end|>\\n<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n

Message ``content`` may be a string or a list of parts.  Parts of type ``image`` /
``image_url`` (or dicts carrying an ``image`` / ``image_url`` key) become
``<|vision_start|><|image_pad|><|vision_end|>``, ``video`` / ``video_url`` parts become
``<|vision_start|><|video_pad|><|vision_end|>``, and ``text`` parts are emitted verbatim, all
in the order they appear.  ``add_vision_id=True`` prefixes "Picture N: " / "Video N: ".
Tools (``tools=[...]``), assistant ``tool_calls`` and ``tool`` role messages are supported in
a simple, Qwen-like way.

The Qwen2.5-VL flavour inserts a default system prompt when the conversation does not start
with one (as the real Qwen2.5-VL template does); the Qwen3-VL flavour does not. The Qwen3-VL flavour
reads ``enable_thinking`` as the hybrid Qwen3 templates do: ``false`` closes an empty
``<think>\n\n</think>\n\n`` after the generation prompt, so the answer follows directly.
"""

from __future__ import annotations

QWEN25_DEFAULT_SYSTEM = "You are a helpful assistant."

_BODY = r"""
{%- set image_count = namespace(value=0) -%}
{%- set video_count = namespace(value=0) -%}
{%- macro render_content(content) -%}
{%- if content is none -%}
{%- elif content is string -%}
{{- content -}}
{%- else -%}
{%- for part in content -%}
{%- if part is string -%}
{{- part -}}
{%- else -%}
{%- set ptype = part['type'] if part['type'] is defined else none -%}
{%- if ptype == 'image' or ptype == 'image_url' or (ptype is none and (part['image'] is defined or part['image_url'] is defined)) -%}
{%- set image_count.value = image_count.value + 1 -%}
{%- if add_vision_id -%}{{- 'Picture ' ~ image_count.value ~ ': ' -}}{%- endif -%}
{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
{%- elif ptype == 'video' or ptype == 'video_url' or (ptype is none and (part['video'] is defined or part['video_url'] is defined)) -%}
{%- set video_count.value = video_count.value + 1 -%}
{%- if add_vision_id -%}{{- 'Video ' ~ video_count.value ~ ': ' -}}{%- endif -%}
{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
{%- elif part['text'] is defined -%}
{{- part['text'] -}}
{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- set first_is_system = messages | length > 0 and messages[0]['role'] == 'system' -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if first_is_system -%}
{{- render_content(messages[0]['content']) -}}
{%- elif default_system -%}
{{- default_system -}}
{%- endif -%}
{{- '\n\n# Tools\n\nThe following functions are available, one JSON signature per line inside <tools></tools>:\n<tools>' -}}
{%- for tool in tools -%}
{{- '\n' -}}{{- tool | tojson -}}
{%- endfor -%}
{{- '\n</tools>\n\nTo call a function, answer with a JSON object holding "name" and "arguments" inside <tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif first_is_system -%}
{{- '<|im_start|>system\n' -}}{{- render_content(messages[0]['content']) -}}{{- '<|im_end|>\n' -}}
{%- elif default_system -%}
{{- '<|im_start|>system\n' ~ default_system ~ '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if loop.first and message['role'] == 'system' -%}
{%- elif message['role'] == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}
{{- '<|im_start|>user' -}}
{%- endif -%}
{{- '\n<tool_response>\n' -}}{{- render_content(message['content']) -}}{{- '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}
{{- '<|im_end|>\n' -}}
{%- endif -%}
{%- elif message['role'] == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}{{- render_content(message['content']) -}}
{%- if message['tool_calls'] is defined and message['tool_calls'] -%}
{%- for tool_call in message['tool_calls'] -%}
{%- set call = tool_call['function'] if tool_call['function'] is defined else tool_call -%}
{%- if (not loop.first) or message['content'] -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>\n{"name": "' ~ call['name'] ~ '", "arguments": ' -}}
{%- if call['arguments'] is string -%}{{- call['arguments'] -}}{%- else -%}{{- call['arguments'] | tojson -}}{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' ~ message['role'] ~ '\n' -}}{{- render_content(message['content']) -}}{{- '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- if thinking_switch and enable_thinking is defined and enable_thinking is false -%}
{{- '<think>\n\n</think>\n\n' -}}
{%- endif -%}
{%- endif -%}
"""


def chat_template(family: str) -> str:
    """Return the Jinja chat template for ``family`` ("qwen3_vl" or "qwen2_5_vl")."""
    if family == "qwen2_5_vl":
        header = "{%- set default_system = '" + QWEN25_DEFAULT_SYSTEM + "' -%}{%- set thinking_switch = false -%}"
    elif family == "qwen3_vl":
        header = "{%- set default_system = '' -%}{%- set thinking_switch = true -%}"
    else:
        raise ValueError(f"unknown model family {family!r}")
    return header + _BODY.strip() + "\n"


QWEN3_VL_CHAT_TEMPLATE = chat_template("qwen3_vl")
QWEN2_5_VL_CHAT_TEMPLATE = chat_template("qwen2_5_vl")
