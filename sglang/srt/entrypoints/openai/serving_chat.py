"""`/v1/chat/completions`: OpenAI request -> GenerateReqInput -> completion or SSE chunks.

The request flow (validation before streaming, client disconnects aborting) is `OpenAIServingBase`'s;
this module holds what is chat-specific: messages, the role chunk, content deltas.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from sglang.srt.entrypoints.openai.protocol import (
    AssistantMessage,
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    DeltaMessage,
)
from sglang.srt.entrypoints.openai.serving_base import (
    OpenAIServingBase,
    ResponseContext,
    finish_reason_str,
    sampling_from_request,
    usage_from_meta,
)
from sglang.srt.managers.io_struct import GenerateReqInput


class OpenAIServingChat(OpenAIServingBase):
    request_model = ChatCompletionRequest
    id_prefix = "chatcmpl"

    def _convert_to_internal_request(self, req: ChatCompletionRequest, created: float) -> GenerateReqInput:
        name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        return GenerateReqInput(
            messages=[m.model_dump(exclude_none=True) for m in req.messages],
            sampling_params=sampling_from_request(req, req.output_limit(), name),
            stream=req.stream,
            rid=req.rid,
            chat_template_kwargs=req.chat_template_kwargs,
            created_time=created,
        )

    def _build_response(self, req: ChatCompletionRequest, ctx: ResponseContext, out: dict[str, Any]) -> dict[str, Any]:
        meta = out["meta_info"]
        fr = meta["finish_reason"] or {}
        choice = ChatCompletionChoice(
            message=AssistantMessage(content=out["text"]),
            finish_reason=finish_reason_str(fr),
            matched_stop=fr.get("matched"),
        )
        resp = ChatCompletionResponse(id=ctx.id, model=ctx.model, created=ctx.created, choices=[choice],
                                      usage=usage_from_meta(meta))
        return resp.model_dump()

    async def _stream_events(
        self, req: ChatCompletionRequest, ctx: ResponseContext, outputs: AsyncIterator[dict]
    ) -> AsyncIterator[dict]:
        def chunk(delta: DeltaMessage, finish: str | None = None, matched: Any = None) -> dict:
            choice = ChatCompletionStreamChoice(delta=delta, finish_reason=finish, matched_stop=matched)
            body = ChatCompletionStreamResponse(id=ctx.id, created=ctx.created, model=ctx.model,
                                                choices=[choice]).model_dump()
            body["choices"][0]["delta"] = delta.model_dump(exclude_none=True)
            return body

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        yield chunk(DeltaMessage(role="assistant", content=""))
        sent = 0
        async for out in outputs:
            text = out["text"]
            if len(text) > sent:
                yield chunk(DeltaMessage(content=text[sent:]))
                sent = len(text)
            fr = out["meta_info"]["finish_reason"]
            if fr is not None:
                yield chunk(DeltaMessage(), finish_reason_str(fr), fr.get("matched"))
                if include_usage:
                    usage = usage_from_meta(out["meta_info"])
                    yield ChatCompletionStreamResponse(id=ctx.id, created=ctx.created, model=ctx.model, choices=[],
                                                       usage=usage).model_dump()
