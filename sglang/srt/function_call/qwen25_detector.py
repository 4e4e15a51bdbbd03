"""The Qwen2.5 / Qwen3(-VL) tool-call format, as their chat templates teach it:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call, any number of blocks. A call's `parameters` are the arguments' JSON text exactly as
the model wrote it. The text outside the blocks is the message content; whitespace next to a block
(the newlines between blocks, before the first and after the last) is not content.

One-shot (`detect_and_parse`) and streaming (`parse_streaming_increment` per piece of text, then
`finish`) give the same calls and the same content for every split of a well-formed output: the
stream holds back what might be the start of `<tool_call>` and trailing whitespace until the next
text decides. A call naming a function that is not offered, or whose JSON does not parse, is dropped
(and logged). Streaming sends a call's name as soon as `"name": "...", "arguments":` is complete,
then its arguments in pieces as they arrive; the one-shot parse leaves a block the output never
closed (cut by the length limit) in the content, the stream cannot take back what it sent of it.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from sglang.srt.function_call.core_types import StreamingParseResult, ToolCallItem
from sglang.srt.utils.text import partial_match_len

logger = logging.getLogger(__name__)

START = "<tool_call>"
END = "</tool_call>"
# the head of a call, up to where its arguments' value begins
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:')
_DECODER = json.JSONDecoder()


def tool_names(tools: list[Any] | None) -> set[str] | None:
    """The function names `tools` (OpenAI tool objects) offer; None: any name is accepted."""
    if tools is None:
        return None
    names = set()
    for tool in tools:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.add(fn["name"])
    return names


def _skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i].isspace():
        i += 1
    return i


def _arguments_text(body: str) -> str | None:
    """The raw JSON text of the top-level "arguments" (or "parameters") value of the object `body`,
    None when it has neither; ValueError when `body` is not one JSON object."""
    i = _skip_ws(body, 0)
    if not body.startswith("{", i):
        raise ValueError("a tool call must be a JSON object")
    i = _skip_ws(body, i + 1)
    found = None
    while not body.startswith("}", i):
        key, i = _DECODER.raw_decode(body, i)
        i = _skip_ws(body, i)
        if not body.startswith(":", i):
            raise ValueError("expected ':'")
        start = _skip_ws(body, i + 1)
        value, i = _DECODER.raw_decode(body, start)
        if key in ("arguments", "parameters") and found is None:
            found = value if isinstance(value, str) else body[start:i]
        i = _skip_ws(body, i)
        if body.startswith(",", i):
            i = _skip_ws(body, i + 1)
        elif not body.startswith("}", i):
            raise ValueError("expected ',' or '}'")
    if _skip_ws(body, i + 1) != len(body):
        raise ValueError("text after the call's object")
    return found


def parse_call(body: str, names: set[str] | None) -> tuple[str, str] | None:
    """(name, arguments JSON text) of one call's body (the text between the tags), or None when it is
    not a call to an offered function."""
    try:
        obj = json.loads(body)
        args = _arguments_text(body) if isinstance(obj, dict) else None
    except ValueError as e:
        logger.warning("dropped a tool call whose JSON does not parse (%s): %.200r", e, body)
        return None
    name = obj.get("name") if isinstance(obj, dict) else None
    if not isinstance(name, str):
        logger.warning("dropped a tool call without a function name: %.200r", body)
        return None
    if names is not None and name not in names:
        logger.warning("dropped a call of %r, a function the request did not offer", name)
        return None
    return name, "{}" if args is None else args


def _trim(text: str, after_call: bool, before_call: bool) -> str:
    if after_call:
        text = text.lstrip()
    if before_call:
        text = text.rstrip()
    return text



class Qwen25Detector:
    start_token = START
    end_token = END

    def __init__(self):
        self._buf = ""  # text not yet decided (outside a call), or the open call's body so far
        self._in_call = False
        self._after_call = False  # the last thing was a call: the next text's leading whitespace is dropped
        self._held_ws = ""  # trailing whitespace of the content, sent once non-space text follows
        self._count = 0  # calls sent so far: the next call's index
        self._reset_call()

    def _reset_call(self) -> None:
        self._name_sent = False
        self._skip = False  # the open call names no offered function: dropped
        self._args_pos = -1  # where the arguments' value is scanned from (in the call body)
        self._args_sent = ""  # argument text sent so far
        self._args_done = False
        self._depth, self._in_str, self._esc, self._began = 0, False, False, False

    # ------------------------------------------------------------------ one shot
    def has_tool_call(self, text: str) -> bool:
        return START in text

    def detect_and_parse(self, text: str, tools: list[Any] | None) -> StreamingParseResult:
        names = tool_names(tools)
        parts, calls = [], []
        pos, after = 0, False
        while True:
            i = text.find(START, pos)
            j = text.find(END, i + len(START)) if i >= 0 else -1
            if j < 0:  # no more complete blocks; an unclosed one stays in the content
                break
            parts.append(_trim(text[pos:i], after, True))
            call = parse_call(text[i + len(START):j], names)
            if call is not None:
                calls.append(ToolCallItem(len(calls), call[0], call[1]))
            pos, after = j + len(END), True
        parts.append(_trim(text[pos:], after, False))
        return StreamingParseResult("".join(parts), calls)

    # ------------------------------------------------------------------ streaming
    def parse_streaming_increment(self, new_text: str, tools: list[Any] | None) -> StreamingParseResult:
        self._buf += new_text
        out = StreamingParseResult()
        names = tool_names(tools)
        while True:
            if self._in_call:
                if not self._advance_call(out, names):
                    break
            elif not self._advance_text(out):
                break
        return out

    def finish(self) -> StreamingParseResult:
        """The end of the output: what was held back is content (a partial `<tool_call>` included)."""
        out = StreamingParseResult()
        if not self._in_call:
            out.normal_text = _trim(self._held_ws + self._buf, self._after_call, False)
        self._buf, self._held_ws = "", ""
        return out

    def _advance_text(self, out: StreamingParseResult) -> bool:
        """Sends the content that is decided; True when a call starts (more to parse)."""
        i = self._buf.find(START)
        if i >= 0:  # whitespace before a call is not content
            out.normal_text += _trim(self._held_ws + self._buf[:i], self._after_call, True)
            self._held_ws, self._buf, self._in_call = "", self._buf[i + len(START):], True
            self._reset_call()
            return True
        keep = partial_match_len(self._buf, (START,))
        text = self._held_ws + self._buf[: len(self._buf) - keep]
        self._buf = self._buf[len(self._buf) - keep:]
        if self._after_call:
            text = text.lstrip()
            self._after_call = not text
        body = text.rstrip()
        self._held_ws = text[len(body):]
        out.normal_text += body
        return False

    def _advance_call(self, out: StreamingParseResult, names: set[str] | None) -> bool:
        """Sends what is decided of the open call; True when it closed (more to parse)."""
        j = self._buf.find(END)
        body = self._buf if j < 0 else self._buf[:j]
        if not self._name_sent and not self._skip:
            m = _HEAD.match(body)
            if m is not None:
                try:
                    name = json.loads(f'"{m.group(1)}"')
                except ValueError:
                    name = None
                if name is None or (names is not None and name not in names):
                    self._skip = True
                else:
                    out.calls.append(ToolCallItem(self._count, name, ""))
                    self._name_sent, self._args_pos = True, m.end()
        if self._name_sent and not self._args_done and self._args_pos >= 0:
            self._scan_arguments(body, out)
        if j < 0:
            return False
        self._close_call(body, out, names)
        self._buf, self._in_call, self._after_call = self._buf[j + len(END):], False, True
        return True

    def _scan_arguments(self, body: str, out: StreamingParseResult) -> None:
        """Sends the argument characters that arrived, up to the brace closing the arguments object;
        a value that is not an object or array waits for the end of the call."""
        piece = []
        i = self._args_pos
        while i < len(body) and not self._args_done:
            c = body[i]
            if not self._began:
                if c.isspace():
                    i += 1
                    continue
                if c not in "{[":
                    self._args_pos = -1  # sent whole when the call closes
                    return
                self._began = True
            piece.append(c)
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif c == "\\":
                    self._esc = True
                elif c == '"':
                    self._in_str = False
            elif c == '"':
                self._in_str = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                self._args_done = self._depth == 0
            i += 1
        self._args_pos = i
        if piece:
            text = "".join(piece)
            self._args_sent += text
            out.calls.append(ToolCallItem(self._count, None, text))

    def _close_call(self, body: str, out: StreamingParseResult, names: set[str] | None) -> None:
        call = None if self._skip else parse_call(body, names)
        if call is not None and not self._name_sent:
            out.calls.append(ToolCallItem(self._count, call[0], ""))
            self._name_sent = True
        if call is not None and call[1].startswith(self._args_sent) and len(call[1]) > len(self._args_sent):
            out.calls.append(ToolCallItem(self._count, None, call[1][len(self._args_sent):]))
        if self._name_sent:
            self._count += 1
        self._reset_call()
