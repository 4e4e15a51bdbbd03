"""`--tool-call-parser`: the tool-call formats by name, the pick from a chat template, and
`FunctionCallParser`, one request's parser (one-shot, or fed the output piece by piece)."""

from __future__ import annotations

from typing import Any

from sglang.srt.function_call.core_types import StreamingParseResult, ToolCallItem
from sglang.srt.function_call.qwen25_detector import Qwen25Detector
from sglang.srt.server_args_values import TOOL_CALL_PARSER_CHOICES

# each format the flag names (server_args_values.TOOL_CALL_PARSER_CHOICES, less `auto`) -> its detector
TOOL_CALL_PARSERS: dict[str, type] = {"qwen25": Qwen25Detector, "qwen": Qwen25Detector}
if set(TOOL_CALL_PARSERS) != set(TOOL_CALL_PARSER_CHOICES) - {"auto"}:
    raise ImportError("every --tool-call-parser choice needs a detector, and every detector a choice")


def resolve_tool_call_parser(flag: str | None, chat_template: str | None) -> str | None:
    """The format the server parses tool calls with: the flag's, or (unset / `auto`) `qwen25` when the
    chat template teaches the `<tool_call>` block; None when neither says (tools are then refused)."""
    if flag not in (None, "auto"):
        if flag not in TOOL_CALL_PARSERS:
            raise ValueError(f"--tool-call-parser {flag}: choose one of {', '.join(TOOL_CALL_PARSER_CHOICES)}")
        return flag
    if isinstance(chat_template, str) and Qwen25Detector.start_token in chat_template:
        return "qwen25"
    return None


class FunctionCallParser:
    """One output's tool calls. `tools` are the request's OpenAI tool objects (None: any function name)."""

    def __init__(self, tools: list[dict[str, Any]] | None, tool_call_parser: str):
        detector = TOOL_CALL_PARSERS.get(tool_call_parser)
        if detector is None:
            raise ValueError(f"unknown tool_call_parser {tool_call_parser!r}: choose one of "
                             f"{', '.join(TOOL_CALL_PARSERS)}")
        self.detector = detector()
        self.tools = tools

    def has_tool_call(self, text: str) -> bool:
        return self.detector.has_tool_call(text)

    def parse_non_stream(self, text: str) -> tuple[str, list[ToolCallItem]]:
        res = self.detector.detect_and_parse(text, self.tools)
        return res.normal_text, res.calls

    def parse_stream_chunk(self, chunk: str) -> tuple[str, list[ToolCallItem]]:
        res: StreamingParseResult = self.detector.parse_streaming_increment(chunk, self.tools)
        return res.normal_text, res.calls

    def finish(self) -> tuple[str, list[ToolCallItem]]:
        res = self.detector.finish()
        return res.normal_text, res.calls
