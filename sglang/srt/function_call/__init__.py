"""Tool calls in model output, by format (OpenAI `tools`).

- `core_types`: a parsed call (`ToolCallItem`) and what one parsing step yields (`StreamingParseResult`).
- `qwen25_detector`: the `<tool_call>{"name": ..., "arguments": ...}</tool_call>` format of the Qwen2.5 /
  Qwen3(-VL) chat templates: one-shot and incremental (streaming) parsing.
- `function_call_parser`: the registry of formats (`--tool-call-parser`), the pick from a chat template,
  and `FunctionCallParser`, what the chat endpoint drives.
- `tool_constraint`: `tool_choice` `required` / a named function as an xgrammar structural tag over the
  functions' parameter schemas, so the call always parses and its arguments validate.
"""
