"""Parsers of model output that are not tool calls: `reasoning_parser` (the Qwen3 `<think>` split)."""
