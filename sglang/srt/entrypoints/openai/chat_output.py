"""What one chat choice's output text becomes in the response: the reasoning split off first
(`--reasoning-parser`, `separate_reasoning`), then tool calls parsed from the rest (`tools` with a
tool-call format); whole for a response, piece by piece for a stream. Streamed tool calls follow
OpenAI's deltas: a call's first delta carries its index, id, type and name, the later ones pieces of
its arguments. `max_calls` (1 for `parallel_tool_calls: false`) keeps only the first calls: under
`tool_choice: auto` nothing constrains the output to one call, so the later ones are dropped here."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sglang.srt.entrypoints.openai.protocol import FunctionCallOut, ToolCallOut
from sglang.srt.function_call.core_types import ToolCallItem
from sglang.srt.function_call.function_call_parser import FunctionCallParser
from sglang.srt.parser.reasoning_parser import ReasoningParser


def tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ChatOutputOptions:
    reasoning_parser: str | None = None  # None: the text is not split
    in_reasoning: bool = False  # the output begins inside the reasoning (the prompt opened it)
    stream_reasoning: bool = True
    tool_parser: str | None = None  # None: no tool calls are parsed
    tools: list[dict[str, Any]] | None = None
    max_calls: int | None = None  # None: every call parsed


@dataclass
class ChatPiece:
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallOut] | None = None

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)


class ChatOutputProcessor:
    def __init__(self, opts: ChatOutputOptions):
        self.reasoning = (ReasoningParser(opts.reasoning_parser, opts.in_reasoning, opts.stream_reasoning)
                          if opts.reasoning_parser else None)
        self.tools = FunctionCallParser(opts.tools, opts.tool_parser) if opts.tool_parser else None
        self.made_calls = False  # a call was sent: the choice finishes with "tool_calls"
        self.options = opts

    def final(self, text: str) -> ChatPiece:
        """The whole output of a (non-streamed) choice."""
        if self.reasoning is None and self.tools is None:
            return ChatPiece(content=text)
        reasoning, content = (None, text) if self.reasoning is None else self.reasoning.parse_non_stream(text)
        calls = None
        if self.tools is not None and content:
            content, items = self.tools.parse_non_stream(content)
            items = self._kept(items)
            calls = [ToolCallOut(id=tool_call_id(), index=it.tool_index, type="function",
                                 function=FunctionCallOut(name=it.name, arguments=it.parameters)) for it in items]
            self.made_calls = bool(calls)
        return ChatPiece(content=content or None, reasoning=reasoning, tool_calls=calls or None)

    def delta(self, text: str, last: bool = False) -> ChatPiece:
        """What the new `text` of a streamed choice decides; `last`: the output ended (held text flushed)."""
        if self.reasoning is None:
            reasoning, content = None, text
        else:
            reasoning, content = self.reasoning.parse_stream_chunk(text)
            if last:
                more_r, more_c = self.reasoning.finish()
                reasoning, content = _join(reasoning, more_r), _join(content, more_c)
        calls = None
        if self.tools is not None:
            content, items = self.tools.parse_stream_chunk(content or "")
            if last:
                more, more_items = self.tools.finish()
                content, items = content + more, items + more_items
            calls = self._call_deltas(self._kept(items))
        return ChatPiece(content=content or None, reasoning=reasoning, tool_calls=calls)

    def _kept(self, items: list[ToolCallItem]) -> list[ToolCallItem]:
        limit = self.options.max_calls
        return items if limit is None else [it for it in items if it.tool_index < limit]

    def _call_deltas(self, items: list[ToolCallItem]) -> list[ToolCallOut] | None:
        """The items of one step merged per call: a call's first delta (index, id, type, name) and its
        argument pieces so far, then argument pieces only."""
        out: dict[int, ToolCallOut] = {}
        for it in items:
            delta = out.get(it.tool_index)
            if delta is None:
                if it.name is not None:
                    self.made_calls = True
                    delta = ToolCallOut(id=tool_call_id(), index=it.tool_index, type="function",
                                        function=FunctionCallOut(name=it.name, arguments=""))
                else:
                    delta = ToolCallOut(index=it.tool_index, function=FunctionCallOut(arguments=""))
                out[it.tool_index] = delta
            delta.function.arguments += it.parameters
        return list(out.values()) or None


def _join(a: str | None, b: str | None) -> str | None:
    return (a or "") + (b or "") or None
