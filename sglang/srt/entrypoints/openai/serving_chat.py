"""`/v1/chat/completions`: OpenAI request -> GenerateReqInput -> completion or SSE chunks.

The request flow (validation before streaming, client disconnects aborting) is `OpenAIServingBase`'s;
this module holds what is chat-specific: messages and tools for the template, the tool-choice grammar,
the role chunk, and each choice's output split into reasoning, content and tool calls (`chat_output`).
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from sglang.srt.constrained.request_fields import GRAMMAR_KINDS
from sglang.srt.managers.field_policy import CHAT_REFUSED
from sglang.srt.entrypoints.openai.chat_output import ChatOutputOptions, ChatOutputProcessor, ChatPiece
from sglang.srt.entrypoints.openai.protocol import (
    AssistantMessage,
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    DeltaMessage,
    UsageInfo,
)
from sglang.srt.entrypoints.openai.serving_base import (
    OpenAIServingBase,
    ResponseContext,
    chat_logprobs,
    finish_reason_str,
    sampling_from_request,
    usage_from_meta,
    usage_of_choices,
)
from sglang.srt.function_call.function_call_parser import resolve_tool_call_parser
from sglang.srt.function_call.tool_constraint import (
    ToolChoiceError,
    chosen_functions,
    strict_auto_structural_tag,
    tool_call_structural_tag,
)
from sglang.srt.errors import GenerateError
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.parser.reasoning_parser import prompt_opens_reasoning


class OpenAIServingChat(OpenAIServingBase):
    request_model = ChatCompletionRequest
    id_prefix = "chatcmpl"
    route_name = "/v1/chat/completions"
    refused_fields = CHAT_REFUSED

    # ------------------------------------------------------------------ server settings
    def _server_arg(self, name: str) -> Any:
        return getattr(getattr(self.tokenizer_manager, "server_args", None), name, None)

    def _tool_call_parser(self) -> str | None:
        """--tool-call-parser, or the format the chat template teaches (None: no tool calls here)."""
        template = getattr(self._tokenizer(), "chat_template", None)
        return resolve_tool_call_parser(self._server_arg("tool_call_parser"), template)

    def _tools_enabled(self, req: ChatCompletionRequest) -> bool:
        return bool(req.tools) and req.tool_choice != "none"

    # ------------------------------------------------------------------ request
    def _convert_to_internal_request(self, req: ChatCompletionRequest, created: float) -> GenerateReqInput:
        name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        media_kwargs, media_kwargs_name = req.media_kwargs()
        sampling = sampling_from_request(req, req.output_limit(), name)
        tools = self._tools_and_constraint(req, sampling)
        return GenerateReqInput(
            messages=[m.model_dump(exclude_none=True) for m in req.messages],
            sampling_params=sampling,
            stream=req.stream,
            rid=req.rid,
            chat_template_kwargs=req.chat_template_kwargs,
            created_time=created,
            priority=req.priority,
            routed_dp_rank=req.dp_rank(),
            custom_logit_processor=req.custom_logit_processor,
            mm_processor_kwargs=media_kwargs,
            mm_kwargs_name=media_kwargs_name,
            tools=tools,
            continue_final_message=req.continue_final_message,
        )

    def _tools_and_constraint(self, req: ChatCompletionRequest, sampling: dict[str, Any]) -> list[dict] | None:
        """The tools the template renders (none for tool_choice "none"); `required` and a named function
        add the grammar of their calls to `sampling`. Anything that cannot be honoured: 400 naming it."""
        try:
            functions = chosen_functions(req.tools or [], req.tool_choice)
        except ToolChoiceError as e:
            raise GenerateError(str(e)) from None
        if not self._tools_enabled(req):
            return None
        if self._tool_call_parser() is None:
            raise GenerateError("tools are not supported with this model's chat template (it has no <tool_call> "
                                "format): start the server with --tool-call-parser qwen25 or a Qwen chat template")
        if functions is not None:
            tag = tool_call_structural_tag(functions, not req.parallel_tool_calls or req.tool_choice != "required")
            what = f"tool_choice {req.tool_choice!r:.100} constrains the output to tool calls"
        else:
            tag = strict_auto_structural_tag(req.tools, not req.parallel_tool_calls)
            what = "a strict function constrains its calls"
        if tag is not None:
            given = [k for k in GRAMMAR_KINDS if sampling.get(k) is not None]
            if given:
                raise GenerateError(f"{what}; it cannot be combined with another output constraint ({given[0]})")
            sampling["structural_tag"] = tag
        return [t if isinstance(t, dict) else dict(t) for t in req.tools]

    def _output_processor(self, req: ChatCompletionRequest, ctx: ResponseContext, i: int) -> ChatOutputProcessor:
        parser = self._server_arg("reasoning_parser") if req.separate_reasoning else None
        prompt = ctx.prompts[i].input_text if i < len(ctx.prompts) else None
        return ChatOutputProcessor(ChatOutputOptions(
            reasoning_parser=parser,
            in_reasoning=bool(parser) and prompt_opens_reasoning(parser, prompt),
            stream_reasoning=req.stream_reasoning,
            tool_parser=self._tool_call_parser() if self._tools_enabled(req) else None,
            tools=req.tools,
            max_calls=None if req.parallel_tool_calls else 1,
        ))

    # ------------------------------------------------------------------ response
    def _build_response(self, req: ChatCompletionRequest, ctx: ResponseContext, outs: list[dict[str, Any]]) -> dict[str, Any]:
        choices = []
        for i, out in enumerate(outs):
            meta = out["meta_info"]
            fr = meta["finish_reason"] or {}
            proc = self._output_processor(req, ctx, i)
            piece = proc.final(out["text"])
            message = AssistantMessage(content=piece.content, reasoning_content=piece.reasoning,
                                       tool_calls=piece.tool_calls)
            choices.append(ChatCompletionChoice(
                index=i, message=message, logprobs=chat_logprobs(ctx, meta),
                finish_reason=_finish(fr, proc), matched_stop=fr.get("matched"),
            ))
        resp = ChatCompletionResponse(id=ctx.id, model=ctx.model, created=ctx.created, choices=choices,
                                      usage=usage_of_choices([o["meta_info"] for o in outs]))
        return resp.model_dump()

    async def _stream_events(
        self, req: ChatCompletionRequest, ctx: ResponseContext, outputs: AsyncIterator[tuple[int, dict]]
    ) -> AsyncIterator[dict]:
        opts = req.stream_options
        include_usage = bool(opts and opts.include_usage)
        continuous = bool(opts and opts.continuous_usage_stats)
        n = max(1, req.n)
        procs = [self._output_processor(req, ctx, i) for i in range(n)]
        prompt_tokens = [len(ctx.prompts[i].input_ids) if i < len(ctx.prompts) else 0 for i in range(n)]
        metas: dict[int, dict] = {}

        def chunk(index: int, delta: DeltaMessage, finish: str | None = None, matched: Any = None,
                  logprobs: dict | None = None) -> dict:
            choice = ChatCompletionStreamChoice(index=index, delta=delta, finish_reason=finish, matched_stop=matched,
                                                logprobs=logprobs)
            usage = None
            if continuous:  # the usage so far of this chunk's choice
                meta = metas.get(index)
                usage = usage_from_meta(meta) if meta else UsageInfo(prompt_tokens=prompt_tokens[index],
                                                                     total_tokens=prompt_tokens[index])
            body = ChatCompletionStreamResponse(id=ctx.id, created=ctx.created, model=ctx.model, choices=[choice],
                                                usage=usage).model_dump()
            # every delta carries content, reasoning_content and tool_calls (null when empty); a tool
            # call delta only the keys it sets
            body["choices"][0]["delta"]["tool_calls"] = (
                [c.model_dump(exclude_none=True) for c in delta.tool_calls] if delta.tool_calls else None)
            return body

        def piece_delta(piece: ChatPiece) -> DeltaMessage:
            return DeltaMessage(content=piece.content, reasoning_content=piece.reasoning, tool_calls=piece.tool_calls)

        for i in range(n):
            yield chunk(i, DeltaMessage(role="assistant", content=""))
        sent, sent_lp, finals = [0] * n, [0] * n, {}
        async for i, out in outputs:
            text, meta = out["text"], out["meta_info"]
            metas[i] = meta
            fr = meta["finish_reason"]
            lps = chat_logprobs(ctx, meta, sent_lp[i])
            piece = procs[i].delta(text[sent[i]:], last=fr is not None)
            sent[i] = max(sent[i], len(text))
            if piece or (lps and lps["content"]):
                yield chunk(i, piece_delta(piece), logprobs=lps)
                sent_lp[i] += len(lps["content"]) if lps else 0
            if fr is not None:
                finals[i] = meta
                yield chunk(i, DeltaMessage(), _finish(fr, procs[i]), fr.get("matched"))
        if include_usage and len(finals) == n:
            usage = usage_of_choices([finals[i] for i in range(n)])
            yield ChatCompletionStreamResponse(id=ctx.id, created=ctx.created, model=ctx.model, choices=[],
                                               usage=usage).model_dump()


def _finish(fr: dict[str, Any] | None, proc: ChatOutputProcessor) -> str | None:
    """OpenAI's finish_reason; a choice that stopped after tool calls finishes with "tool_calls"."""
    reason = finish_reason_str(fr)
    return "tool_calls" if reason == "stop" and proc.made_calls else reason
