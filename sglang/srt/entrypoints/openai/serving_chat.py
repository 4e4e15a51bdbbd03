"""`/v1/chat/completions`: OpenAI request -> GenerateReqInput -> completion or SSE chunks.

Validation errors are answered before any byte of a stream is sent, so they keep their 4xx status; a
client that goes away (stream or not) has its request aborted in the scheduler.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

import orjson
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError

from sglang.srt.entrypoints.openai.protocol import (
    AssistantMessage,
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    DeltaMessage,
    PromptTokensDetails,
    UsageInfo,
)
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import GenerateError, TokenizerManager

SSE_DONE = b"data: [DONE]\n\n"


# ----------------------------------------------------------------------------- shared HTTP helpers
def json_response(obj: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status_code, media_type="application/json")


def error_response(err: GenerateError) -> Response:
    body = {"error": {"message": err.message, "type": err.err_type, "code": err.status_code}}
    return json_response(body, err.status_code)


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def parse_json_body(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise GenerateError(f"invalid JSON body: {e}") from None
    if not isinstance(data, dict):
        raise GenerateError(f"the request body must be a JSON object, got {type(data).__name__}")
    return data


def format_validation_error(e: ValidationError) -> str:
    parts = [f"{'.'.join(str(x) for x in err['loc']) or 'body'}: {err['msg']}" for err in e.errors()[:5]]
    return "invalid request: " + "; ".join(parts)


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def collect_until_disconnect(request: Request, outputs: AsyncIterator[dict]) -> dict | None:
    """The last output of `outputs`, or None if the client disconnected first (the generation task is
    cancelled, which aborts the request)."""

    async def consume() -> dict | None:
        last = None
        async for last in outputs:
            pass
        return last

    task = asyncio.ensure_future(consume())
    disconnect = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, disconnect}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        disconnect.cancel()
        if not task.done():
            task.cancel()
    if task.cancelled():
        return None
    return task.result()


def usage_from_meta(meta: dict[str, Any]) -> UsageInfo:
    prompt, completion = int(meta.get("prompt_tokens", 0)), int(meta.get("completion_tokens", 0))
    return UsageInfo(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=int(meta.get("cached_tokens", 0))),
    )


# ----------------------------------------------------------------------------- chat
class OpenAIServingChat:
    def __init__(self, tokenizer_manager: TokenizerManager, model_name: str):
        self.tokenizer_manager = tokenizer_manager
        self.model_name = model_name

    async def create_chat_completion(self, request: Request) -> Response:
        created = time.time()
        try:
            req = self._parse(await request.body())
            obj = self._to_generate_req(req, created)
            tokenized, payload = await self.tokenizer_manager.tokenize_request(obj)
        except GenerateError as e:
            return error_response(e)
        outputs = self.tokenizer_manager.generate_tokenized(tokenized, payload)
        model = req.model or self.model_name
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                self._stream(outputs, f"chatcmpl-{tokenized.rid}", model, int(created), include_usage),
                media_type="text/event-stream",
            )
        try:
            out = await collect_until_disconnect(request, outputs)
        except GenerateError as e:
            return error_response(e)
        if out is None:
            return Response(status_code=499)  # client closed the connection; nobody reads this
        meta = out["meta_info"]
        fr = meta["finish_reason"] or {}
        resp = ChatCompletionResponse(
            id=f"chatcmpl-{tokenized.rid}",
            model=model,
            created=int(created),
            choices=[
                ChatCompletionChoice(
                    message=AssistantMessage(content=out["text"]),
                    finish_reason=_finish_reason(fr),
                    matched_stop=fr.get("matched"),
                )
            ],
            usage=usage_from_meta(meta),
        )
        return json_response(resp.model_dump())

    @staticmethod
    def _parse(body: bytes) -> ChatCompletionRequest:
        data = parse_json_body(body)
        try:
            req = ChatCompletionRequest.model_validate(data)
        except ValidationError as e:
            raise GenerateError(format_validation_error(e)) from None
        problem = req.unsupported()
        if problem:
            raise GenerateError(problem)
        return req

    @staticmethod
    def _to_generate_req(req: ChatCompletionRequest, created: float) -> GenerateReqInput:
        limit = req.output_limit()
        if limit is not None and limit <= 0:
            name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
            raise GenerateError(f"{name} must be at least 1, got {limit}")
        sampling = {
            "max_new_tokens": limit,  # None: up to the context length
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "min_p": req.min_p,
            "seed": req.seed,
            "stop": req.stop,
            "stop_token_ids": req.stop_token_ids,
            "ignore_eos": req.ignore_eos,
            "skip_special_tokens": req.skip_special_tokens,
        }
        return GenerateReqInput(
            messages=[m.model_dump(exclude_none=True) for m in req.messages],
            sampling_params=sampling,
            stream=req.stream,
            rid=req.rid,
            chat_template_kwargs=req.chat_template_kwargs,
            created_time=created,
        )

    async def _stream(
        self, outputs: AsyncIterator[dict], cid: str, model: str, created: int, include_usage: bool
    ) -> AsyncIterator[bytes]:
        def chunk(delta: DeltaMessage, finish: str | None = None, matched: Any = None) -> bytes:
            choice = ChatCompletionStreamChoice(delta=delta, finish_reason=finish, matched_stop=matched)
            body = ChatCompletionStreamResponse(id=cid, created=created, model=model, choices=[choice]).model_dump()
            body["choices"][0]["delta"] = delta.model_dump(exclude_none=True)
            return sse(body)

        yield chunk(DeltaMessage(role="assistant", content=""))
        sent = 0
        try:
            async for out in outputs:
                text = out["text"]
                if len(text) > sent:
                    yield chunk(DeltaMessage(content=text[sent:]))
                    sent = len(text)
                fr = out["meta_info"]["finish_reason"]
                if fr is not None:
                    yield chunk(DeltaMessage(), _finish_reason(fr), fr.get("matched"))
                    if include_usage:
                        usage = usage_from_meta(out["meta_info"])
                        last = ChatCompletionStreamResponse(id=cid, created=created, model=model, choices=[], usage=usage)
                        yield sse(last.model_dump())
        except GenerateError as e:
            yield sse({"error": {"message": e.message, "type": e.err_type, "code": e.status_code}})
        finally:
            await outputs.aclose()  # aborts the request if we stop early
        yield SSE_DONE


def _finish_reason(fr: dict[str, Any]) -> str:
    return "length" if fr.get("type") == "length" else "stop"
