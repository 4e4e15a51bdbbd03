"""What tool-call parsing yields, whatever the format."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class ToolCallItem:
    """One call, or (streaming) one piece of a call. `tool_index` is the call's position in the output
    (0, 1, ...: OpenAI's `tool_calls[].index`). In one-shot parsing `name` and `parameters` are
    complete; in streaming a call's first piece carries its `name` (parameters "") and the later pieces
    carry only text to append to its arguments (`name` None)."""

    tool_index: int
    name: str | None = None
    parameters: str = ""  # the arguments as JSON text, exactly as the model wrote them

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class StreamingParseResult:
    normal_text: str = ""
    calls: list[ToolCallItem] = field(default_factory=list)
