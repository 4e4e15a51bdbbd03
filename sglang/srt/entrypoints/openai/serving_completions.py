"""`/v1/completions`: OpenAI completion request (a prompt or a list of them: text or token ids, no
chat template) -> one GenerateReqInput per prompt and sample -> `text_completion` response or SSE
chunks; choice index = prompt index * n + sample, as OpenAI numbers them.

The request flow is `OpenAIServingBase`'s; parameters that are accepted but not implemented are
refused (400, naming them) by `CompletionRequest.unsupported()`. `echo` puts the prompt before each
choice's text and, with `logprobs`, the prompt's token logprobs before the completion's (the first
token's null): the loglikelihood request of evaluation harnesses.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from sglang.srt.managers.field_policy import COMPLETION_REFUSED
from sglang.srt.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
)
from sglang.srt.entrypoints.openai.serving_base import (
    OpenAIServingBase,
    ResponseContext,
    completion_logprobs,
    finish_reason_str,
    prompt_logprobs,
    sampling_from_request,
    usage_of_choices,
)
from sglang.srt.managers.io_struct import GenerateReqInput


class OpenAIServingCompletion(OpenAIServingBase):
    request_model = CompletionRequest
    id_prefix = "cmpl"
    route_name = "/v1/completions"
    refused_fields = COMPLETION_REFUSED

    def _convert_to_internal_requests(self, req: CompletionRequest, created: float) -> list[GenerateReqInput]:
        prompts = req.prompts()
        params = sampling_from_request(req, req.max_tokens)
        return [
            GenerateReqInput(
                text=prompt if isinstance(prompt, str) else None,
                input_ids=None if isinstance(prompt, str) else list(prompt),
                sampling_params=dict(params),
                stream=req.stream,
                rid=req.rid if req.rid is None or len(prompts) == 1 else f"{req.rid}-p{p}",
                created_time=created,
                priority=req.priority,
                routed_dp_rank=req.dp_rank(),
                custom_logit_processor=req.custom_logit_processor,
            )
            for p, prompt in enumerate(prompts)
        ]

    def _prompt_text(self, req: CompletionRequest, ctx: ResponseContext, choice: int) -> str:
        prompt = req.prompts()[choice // max(1, req.n)]
        if isinstance(prompt, str):
            return prompt
        return ctx.tokenizer.decode_output(list(prompt)) if ctx.tokenizer is not None else ""

    def _echoed(self, req: CompletionRequest, ctx: ResponseContext, meta: dict[str, Any], choice: int) -> tuple[str, dict | None]:
        """(prompt text, prompt logprobs or None) to put first in a choice; ("", None) without echo."""
        if not req.echo:
            return "", None
        return self._prompt_text(req, ctx, choice), prompt_logprobs(ctx, meta) if req.logprobs is not None else None

    def _build_response(self, req: CompletionRequest, ctx: ResponseContext, outs: list[dict[str, Any]]) -> dict[str, Any]:
        choices = []
        for i, out in enumerate(outs):
            meta = out["meta_info"]
            fr = meta["finish_reason"] or {}
            prefix, prefix_lp = self._echoed(req, ctx, meta, i)
            lps = completion_logprobs(ctx, meta, offset=len(prefix))
            choices.append(CompletionChoice(index=i, text=prefix + out["text"], logprobs=_joined(prefix_lp, lps),
                                            finish_reason=finish_reason_str(fr), matched_stop=fr.get("matched")))
        resp = CompletionResponse(id=ctx.id, created=ctx.created, model=ctx.model, choices=choices,
                                  usage=usage_of_choices([o["meta_info"] for o in outs], req.n))
        return resp.model_dump()

    async def _stream_events(
        self, req: CompletionRequest, ctx: ResponseContext, outputs: AsyncIterator[tuple[int, dict]]
    ) -> AsyncIterator[dict]:
        """One chunk per new piece of text (per choice index); a choice's last chunk carries its finish
        reason (its text may be empty); with `stream_options.include_usage`, a final chunk with the
        usage of all choices and no choices."""
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        n = max(1, req.n) * len(req.prompts())  # choices
        sent, sent_lp, finals = [0] * n, [0] * n, {}
        echoed: dict[int, int] = {}  # choice index -> length of the prompt text echoed in its first chunk
        async for i, out in outputs:
            text, meta = out["text"], out["meta_info"]
            fr = meta["finish_reason"]
            prefix, prefix_lp = ("", None) if i in echoed else self._echoed(req, ctx, meta, i)
            lps = completion_logprobs(ctx, meta, sent_lp[i], sent[i] + echoed.get(i, len(prefix)))
            if len(text) <= sent[i] and fr is None and not (lps and lps["tokens"]) and not prefix:
                continue
            echoed.setdefault(i, len(prefix))
            choice = CompletionChoice(index=i, text=prefix + text[sent[i]:], logprobs=_joined(prefix_lp, lps),
                                      finish_reason=finish_reason_str(fr), matched_stop=(fr or {}).get("matched"))
            sent[i] = max(sent[i], len(text))
            sent_lp[i] += len(lps["tokens"]) if lps else 0
            yield CompletionStreamResponse(id=ctx.id, created=ctx.created, model=ctx.model, choices=[choice]).model_dump()
            if fr is not None:
                finals[i] = meta
        if include_usage and len(finals) == n:
            yield CompletionStreamResponse(id=ctx.id, created=ctx.created, model=ctx.model, choices=[],
                                           usage=usage_of_choices([finals[i] for i in range(n)], req.n)).model_dump()


def _joined(first: dict | None, then: dict | None) -> dict | None:
    """Two legacy logprobs objects one after the other (prompt, then completion)."""
    if first is None or then is None:
        return then if first is None else first
    return {k: first[k] + then[k] for k in first}
