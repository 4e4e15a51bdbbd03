"""`--reasoning-parser`: the model's reasoning (`<think>...</think>`) split from its answer.

- `qwen3`: the output reasons when it begins with `<think>` (after whitespace), or when the prompt
  left a `<think>` open (a template that opens it, a continued assistant message);
- `qwen3-thinking`: the template always opens `<think>`, so the output begins inside the reasoning.

The reasoning is the text up to `</think>` (its start tag dropped, also when the model repeats one the prompt opened; whitespace around it trimmed); the
content is what follows (leading whitespace trimmed). An output that never closes its reasoning (cut by
the length limit) is all reasoning. Empty parts are None. The one-shot split and the streaming one
(`parse_stream_chunk` per piece, then `finish`) agree for every split of the text: the stream holds
back what may be the start of a tag, and whitespace that may turn out to be trailing.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.server_args_values import REASONING_PARSER_CHOICES
from sglang.srt.utils.text import partial_match_len

THINK_START = "<think>"
THINK_END = "</think>"


@dataclass(frozen=True)
class ReasoningFormat:
    start: str
    end: str
    force: bool  # the output begins inside the reasoning


REASONING_PARSERS: dict[str, ReasoningFormat] = {
    "qwen3": ReasoningFormat(THINK_START, THINK_END, force=False),
    "qwen3-thinking": ReasoningFormat(THINK_START, THINK_END, force=True),
}
if tuple(REASONING_PARSERS) != REASONING_PARSER_CHOICES:
    raise ImportError("every --reasoning-parser choice needs a format, and every format a choice")


def reasoning_format(name: str) -> ReasoningFormat:
    fmt = REASONING_PARSERS.get(name)
    if fmt is None:
        raise ValueError(f"unknown reasoning parser {name!r}: choose one of {', '.join(REASONING_PARSERS)}")
    return fmt


def prompt_opens_reasoning(name: str, prompt: str | None) -> bool:
    """Whether the output of `prompt` begins inside the reasoning: the parser says so, or the prompt's
    last start tag is not closed after it."""
    fmt = reasoning_format(name)
    if fmt.force:
        return True
    if not prompt:
        return False
    return prompt.rfind(fmt.start) > prompt.rfind(fmt.end)



class ReasoningParser:
    """One output's split. `in_reasoning`: the output begins inside the reasoning (see
    `prompt_opens_reasoning`). `stream_reasoning` False: the stream sends the reasoning in one piece,
    when it ends."""

    def __init__(self, name: str, in_reasoning: bool = False, stream_reasoning: bool = True):
        self.fmt = reasoning_format(name)
        self.stream_reasoning = stream_reasoning
        # "undecided": whether the output opens with the start tag is not known yet; "reasoning";
        # "content": after the reasoning (or none at all)
        self._state = "reasoning" if in_reasoning or self.fmt.force else "undecided"
        self._repeat_tag = self._state == "reasoning"  # begun inside: a start tag the model repeats is dropped
        self._buf = ""  # text not yet sent
        self._began = False  # reasoning: non-space text seen (leading whitespace is dropped until then)
        self._held_ws = ""  # reasoning: whitespace that is sent once more reasoning follows
        self._trim_content = False  # content after reasoning: leading whitespace is dropped
        self._reasoning_total = ""  # stream_reasoning False: the reasoning kept until it ends

    def parse_non_stream(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning, content) of a whole output."""
        reasoning, content = self.parse_stream_chunk(text)
        more_r, more_c = self.finish()
        return _none_if_empty((reasoning or "") + (more_r or "")), _none_if_empty((content or "") + (more_c or ""))

    def parse_stream_chunk(self, chunk: str) -> tuple[str | None, str | None]:
        """(reasoning piece, content piece) that `chunk` decides; None for nothing."""
        self._buf += chunk
        reasoning, content = "", ""
        if self._state == "undecided":
            head = self._buf.lstrip()
            if head.startswith(self.fmt.start):
                self._state, self._buf = "reasoning", head[len(self.fmt.start):]
            elif not self.fmt.start.startswith(head):  # not reasoning: the text is content as it is
                self._state = "content"
            else:
                return None, None
        if self._state == "reasoning":
            reasoning = self._advance_reasoning()
        if self._state == "content":
            content, self._buf = self._buf, ""
            if self._trim_content:
                content = content.lstrip()
                self._trim_content = not content
        return self._reasoning_out(reasoning), _none_if_empty(content)

    def finish(self) -> tuple[str | None, str | None]:
        """What was held back, at the end of the output."""
        reasoning, content = "", ""
        if self._state == "undecided":
            content = self._buf  # whitespace, or a partial start tag: content
        elif self._state == "reasoning":  # never closed: the held-back partial end tag is reasoning too
            body = self._buf.rstrip()
            reasoning = (self._held_ws + body) if self._began and body else body.lstrip()
        self._buf, self._held_ws = "", ""
        out = self._reasoning_out(reasoning, final=True)
        return out, _none_if_empty(content)

    def _advance_reasoning(self) -> str:
        if self._repeat_tag:
            head = self._buf.lstrip()
            if head.startswith(self.fmt.start):
                self._buf, self._repeat_tag = head[len(self.fmt.start):], False
            elif self.fmt.start.startswith(head):
                return ""  # may still be the start tag
            else:
                self._repeat_tag = False
        i = self._buf.find(self.fmt.end)
        if i >= 0:
            text, rest = self._buf[:i], self._buf[i + len(self.fmt.end):]
            text = text.rstrip()
            piece = (self._held_ws + text) if self._began and text else text.lstrip()
            self._held_ws, self._buf = "", rest
            self._state, self._trim_content = "content", True
            return piece
        keep = partial_match_len(self._buf, (self.fmt.end,))
        text, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep:]
        if not self._began:
            text = text.lstrip()
            self._began = bool(text)
        body = text.rstrip()
        piece = self._held_ws + body if body else ""
        self._held_ws = text[len(body):] if body else self._held_ws + text
        return piece

    def _reasoning_out(self, piece: str, final: bool = False) -> str | None:
        if self.stream_reasoning:
            return _none_if_empty(piece)
        self._reasoning_total += piece
        if final or self._state == "content":  # the reasoning ended: all of it at once
            out, self._reasoning_total = self._reasoning_total, ""
            return _none_if_empty(out)
        return None


def _none_if_empty(text: str | None) -> str | None:
    return text if text else None
