"""`/v1/chat/completions`: OpenAI request -> GenerateReqInput -> completion or SSE chunks.

The request flow (validation before streaming, client disconnects aborting) is `OpenAIServingBase`'s;
this module holds what is chat-specific: messages, the role chunk, content deltas.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from sglang.srt.entrypoints.field_policy import CHAT_REFUSED
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
    chat_logprobs,
    finish_reason_str,
    sampling_from_request,
    usage_of_choices,
)
from sglang.srt.managers.io_struct import GenerateReqInput


class OpenAIServingChat(OpenAIServingBase):
    request_model = ChatCompletionRequest
    id_prefix = "chatcmpl"
    refused_fields = CHAT_REFUSED

    def _convert_to_internal_request(self, req: ChatCompletionRequest, created: float) -> GenerateReqInput:
        name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        image_kwargs, image_kwargs_name = req.image_kwargs()
        return GenerateReqInput(
            messages=[m.model_dump(exclude_none=True) for m in req.messages],
            sampling_params=sampling_from_request(req, req.output_limit(), name),
            stream=req.stream,
            rid=req.rid,
            chat_template_kwargs=req.chat_template_kwargs,
            created_time=created,
            priority=req.priority,
            mm_processor_kwargs=image_kwargs,
            mm_kwargs_name=image_kwargs_name,
        )

    def _build_response(self, req: ChatCompletionRequest, ctx: ResponseContext, outs: list[dict[str, Any]]) -> dict[str, Any]:
        choices = []
        for i, out in enumerate(outs):
            meta = out["meta_info"]
            fr = meta["finish_reason"] or {}
            choices.append(ChatCompletionChoice(
                index=i, message=AssistantMessage(content=out["text"]), logprobs=chat_logprobs(ctx, meta),
                finish_reason=finish_reason_str(fr), matched_stop=fr.get("matched"),
            ))
        resp = ChatCompletionResponse(id=ctx.id, model=ctx.model, created=ctx.created, choices=choices,
                                      usage=usage_of_choices([o["meta_info"] for o in outs]))
        return resp.model_dump()

    async def _stream_events(
        self, req: ChatCompletionRequest, ctx: ResponseContext, outputs: AsyncIterator[tuple[int, dict]]
    ) -> AsyncIterator[dict]:
        def chunk(index: int, delta: DeltaMessage, finish: str | None = None, matched: Any = None,
                  logprobs: dict | None = None) -> dict:
            choice = ChatCompletionStreamChoice(index=index, delta=delta, finish_reason=finish, matched_stop=matched,
                                                logprobs=logprobs)
            body = ChatCompletionStreamResponse(id=ctx.id, created=ctx.created, model=ctx.model,
                                                choices=[choice]).model_dump()
            body["choices"][0]["delta"] = delta.model_dump(exclude_none=True)
            return body

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        n = max(1, req.n)
        for i in range(n):
            yield chunk(i, DeltaMessage(role="assistant", content=""))
        sent, sent_lp, finals = [0] * n, [0] * n, {}
        async for i, out in outputs:
            text, meta = out["text"], out["meta_info"]
            lps = chat_logprobs(ctx, meta, sent_lp[i])
            if len(text) > sent[i] or (lps and lps["content"]):
                yield chunk(i, DeltaMessage(content=text[sent[i]:]), logprobs=lps)
                sent[i] = max(sent[i], len(text))
                sent_lp[i] += len(lps["content"]) if lps else 0
            fr = meta["finish_reason"]
            if fr is not None:
                finals[i] = meta
                yield chunk(i, DeltaMessage(), finish_reason_str(fr), fr.get("matched"))
        if include_usage and len(finals) == n:
            usage = usage_of_choices([finals[i] for i in range(n)])
            yield ChatCompletionStreamResponse(id=ctx.id, created=ctx.created, model=ctx.model, choices=[],
                                               usage=usage).model_dump()
