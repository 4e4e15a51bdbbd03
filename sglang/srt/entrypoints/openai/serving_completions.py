"""`/v1/completions`: OpenAI completion request (one prompt: text or token ids, no chat template) ->
GenerateReqInput -> `text_completion` response or SSE chunks.

The request flow is `OpenAIServingBase`'s; parameters that are accepted but not implemented are
refused (400, naming them) by `CompletionRequest.unsupported()`.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from sglang.srt.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
)
from sglang.srt.entrypoints.openai.serving_base import (
    OpenAIServingBase,
    ResponseContext,
    finish_reason_str,
    sampling_from_request,
    usage_from_meta,
)
from sglang.srt.managers.io_struct import GenerateReqInput


class OpenAIServingCompletion(OpenAIServingBase):
    request_model = CompletionRequest
    id_prefix = "cmpl"

    def _convert_to_internal_request(self, req: CompletionRequest, created: float) -> GenerateReqInput:
        text = req.prompt if isinstance(req.prompt, str) else None
        return GenerateReqInput(
            text=text,
            input_ids=None if text is not None else list(req.prompt),
            sampling_params=sampling_from_request(req, req.max_tokens),
            stream=req.stream,
            rid=req.rid,
            created_time=created,
        )

    def _build_response(self, req: CompletionRequest, ctx: ResponseContext, out: dict[str, Any]) -> dict[str, Any]:
        meta = out["meta_info"]
        fr = meta["finish_reason"] or {}
        choice = CompletionChoice(text=out["text"], finish_reason=finish_reason_str(fr), matched_stop=fr.get("matched"))
        resp = CompletionResponse(id=ctx.id, created=ctx.created, model=ctx.model, choices=[choice],
                                  usage=usage_from_meta(meta))
        return resp.model_dump()

    async def _stream_events(
        self, req: CompletionRequest, ctx: ResponseContext, outputs: AsyncIterator[dict]
    ) -> AsyncIterator[dict]:
        """One chunk per new piece of text; the last one carries the finish reason (and its text may be
        empty), then, with `stream_options.include_usage`, a chunk with the usage and no choices."""
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        sent = 0
        async for out in outputs:
            text, fr = out["text"], out["meta_info"]["finish_reason"]
            if len(text) <= sent and fr is None:
                continue
            choice = CompletionChoice(text=text[sent:], finish_reason=finish_reason_str(fr),
                                      matched_stop=(fr or {}).get("matched"))
            sent = max(sent, len(text))
            yield CompletionStreamResponse(id=ctx.id, created=ctx.created, model=ctx.model, choices=[choice]).model_dump()
            if fr is not None and include_usage:
                yield CompletionStreamResponse(id=ctx.id, created=ctx.created, model=ctx.model, choices=[],
                                               usage=usage_from_meta(out["meta_info"])).model_dump()
