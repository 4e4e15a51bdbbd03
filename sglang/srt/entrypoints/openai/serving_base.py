"""What every HTTP handler shares: JSON and error bodies, SSE framing, and
`OpenAIServingBase`, the request flow of the OpenAI endpoints (chat and completions); the stream helpers
are `streams.py`.

The flow: parse and validate the body, build a `GenerateReqInput`, tokenize; any problem so far is
answered with its 4xx before a byte is streamed (a stream also waits for its first output, so that what
the scheduler decides before running it, a grammar or a full queue, is the status: `hold_for_first_output`). Then either stream SSE chunks (ending with
`data: [DONE]`) or wait for the final output while watching for the client going away; a client
that leaves has its request aborted in the scheduler either way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, TypeVar

import orjson
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from sglang.srt.constrained.request_fields import (
    CONSTRAINT_FIELDS,
    ConstraintError,
    constraint_params,
    openai_constraint_fields,
)
from sglang.srt.managers.field_policy import Refusal, check_fields
from sglang.srt.entrypoints.openai.protocol import PromptTokensDetails, UsageInfo
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.entrypoints.openai.streams import (
    ClientGone,
    collect_until_disconnect,
    gather_finals,
    hold_for_first_output,
    merge_streams,
)
from sglang.srt.errors import GenerateError
from sglang.srt.managers.tokenizer_manager import TokenizerManager

SSE_DONE = b"data: [DONE]\n\n"
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away"; nobody reads it

T = TypeVar("T")


# ----------------------------------------------------------------------------- bodies
def json_response(obj: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status_code, media_type="application/json")


def error_body(err: GenerateError) -> dict[str, Any]:
    """The OpenAI-style error object: `{"error": {"message", "type", "code"}}` (code: the HTTP status)."""
    return {"error": {"message": err.message, "type": err.err_type, "code": err.status_code}}


def error_response(err: GenerateError) -> Response:
    return json_response(error_body(err), err.status_code)


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


def usage_from_meta(meta: dict[str, Any]) -> UsageInfo:
    prompt, completion = int(meta.get("prompt_tokens", 0)), int(meta.get("completion_tokens", 0))
    return UsageInfo(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=int(meta.get("cached_tokens", 0))),
    )


def finish_reason_str(fr: dict[str, Any] | None) -> str | None:
    """The engine's finish reason -> OpenAI's `finish_reason`: "stop", "length" or "abort" (an
    /abort_request); None while the request runs."""
    if fr is None:
        return None
    return fr.get("type") if fr.get("type") in ("length", "abort") else "stop"


# ----------------------------------------------------------------------------- SSE
def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def sse_stream(events: AsyncIterator[Any], outputs: AsyncIterator[Any] | None = None) -> AsyncIterator[bytes]:
    """`events` (JSON-able objects) as SSE, ending with `data: [DONE]`. A GenerateError raised while
    iterating becomes one error event. `events` and the generation they read (`outputs`, when it is
    another iterator) are closed however the stream ends, which aborts an unfinished request."""
    try:
        async for ev in events:
            yield sse(ev)
    except GenerateError as e:
        yield sse(error_body(e))
    finally:
        await events.aclose()
        if outputs is not None and outputs is not events:
            await outputs.aclose()
    yield SSE_DONE


async def held_streams(request: Request, streams: list) -> list | Response:
    """`hold_for_first_output`'s streams, or the response a stream gets instead: a failure before the
    request ran (grammar, full queue) as its status, 499 when the client left while held."""
    try:
        return await hold_for_first_output(request, streams)
    except GenerateError as e:
        return error_response(e)
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED_REQUEST)


# ----------------------------------------------------------------------------- OpenAI endpoints
@dataclass
class ResponseContext:
    """What every response of one request repeats."""

    id: str
    model: str
    created: int
    tokenizer: Any = None  # turns logprob token ids into text: TokenizerLanes (its output lane) or None
    prompts: list[Any] = field(default_factory=list)  # each choice's TokenizedGenerateReqInput, in order

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode_output([token_id]) if self.tokenizer is not None else str(token_id)


class OpenAIServingBase:
    """One OpenAI endpoint over the tokenizer manager. Subclasses name their pydantic request type
    and id prefix, and fill in the conversion and the two response shapes."""

    request_model: type[BaseModel]
    id_prefix: str
    route_name: str  # its path, for messages
    refused_fields: dict[str, Refusal]  # upstream's and OpenAI's fields this endpoint does not implement

    def __init__(self, tokenizer_manager: TokenizerManager, model_name: str):
        self.tokenizer_manager = tokenizer_manager
        self.model_name = model_name

    async def handle_request(self, request: Request) -> Response:
        """`n` choices are `n` requests (prefix shared through the cache), merged into one response:
        final outputs in choice order, or stream chunks tagged with their choice index."""
        created = time.time()
        tm = self.tokenizer_manager
        try:
            if getattr(getattr(tm, "server_args", None), "skip_tokenizer_init", False):
                raise GenerateError(f"{self.route_name} needs the tokenizer, which the server skips "
                                    "(--skip-tokenizer-init): use /generate with input_ids")
            req = self._parse(await request.body())
            try:
                groups = [obj.parallel_copies() for obj in self._convert_to_internal_requests(req, created)]
            except ValueError as e:
                raise GenerateError(str(e)) from None
            # each prompt built once (its other samples cloned from it), the prompts concurrently
            prepared = await tm.tokenize_requests(groups)
        except GenerateError as e:
            return error_response(e)
        streams = [tm.generate_tokenized(t, p) for t, p in prepared]
        ctx = ResponseContext(f"{self.id_prefix}-{prepared[0][0].rid}", req.model or self.model_name, int(created),
                              self._text_lane(), [t for t, _ in prepared])
        if req.stream:
            streams = await held_streams(request, streams)
            if isinstance(streams, Response):
                return streams
            tagged = merge_streams(streams)
            events = self._stream_events(req, ctx, tagged)
            return StreamingResponse(sse_stream(events, tagged), media_type="text/event-stream")
        try:
            outs = await collect_until_disconnect(request, gather_finals(streams))
        except GenerateError as e:
            return error_response(e)
        if outs is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        return json_response(self._build_response(req, ctx, outs))

    def _tokenizer(self):
        builder = getattr(self.tokenizer_manager, "builder", None)
        return getattr(builder, "tokenizer", None)

    def _text_lane(self):
        """What responses decode logprob tokens and echoed prompts with (tokenizer_lanes.py's output lane)."""
        builder = getattr(self.tokenizer_manager, "builder", None)
        return getattr(builder, "lanes", None) if getattr(builder, "tokenizer", None) is not None else None

    def honoured_fields(self) -> set[str]:
        """The body's top-level keys this endpoint reads: its model's fields (and their aliases) and
        the output-constraint fields read from the extras."""
        fields = self.request_model.model_fields
        return {*fields, *(f.alias for f in fields.values() if f.alias), *CONSTRAINT_FIELDS}

    def _parse(self, body: bytes) -> Any:
        data = parse_json_body(body)
        problem = check_fields(data, self.honoured_fields(), self.refused_fields)
        if problem:
            raise GenerateError(problem)
        try:
            req = self.request_model.model_validate(data)
        except ValidationError as e:
            raise GenerateError(format_validation_error(e)) from None
        problem = req.unsupported()
        if problem:
            raise GenerateError(problem)
        return req

    # ------------------------------------------------------------------ for subclasses
    def _convert_to_internal_request(self, req: Any, created: float) -> GenerateReqInput:
        raise NotImplementedError

    def _convert_to_internal_requests(self, req: Any, created: float) -> list[GenerateReqInput]:
        """One internal request per prompt (choices are prompt-major: prompt p's n samples together)."""
        return [self._convert_to_internal_request(req, created)]

    def _build_response(self, req: Any, ctx: ResponseContext, outs: list[dict[str, Any]]) -> dict[str, Any]:
        """`outs`: one final output per choice, in choice order."""
        raise NotImplementedError

    def _stream_events(self, req: Any, ctx: ResponseContext, outputs: AsyncIterator[dict]) -> AsyncIterator[dict]:
        raise NotImplementedError


def sampling_from_request(req: Any, max_new_tokens: int | None, limit_name: str = "max_tokens") -> dict[str, Any]:
    """The sampling parameters chat and completion requests share, by their engine names."""
    if max_new_tokens is not None and max_new_tokens < 0:  # 0: score the prompt, generate nothing
        raise GenerateError(f"{limit_name} must be at least 0, got {max_new_tokens}")
    try:  # response_format, json_schema / regex / ebnf, vLLM's guided_*: at most one
        constraint = constraint_params(openai_constraint_fields(req))
    except ConstraintError as e:
        raise GenerateError(str(e)) from None
    return {
        "max_new_tokens": max_new_tokens,  # None: up to the context length
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "seed": req.seed,
        "stop": req.stop,
        "stop_token_ids": req.stop_token_ids,
        "stop_regex": req.stop_regex,
        "no_stop_trim": req.no_stop_trim,
        "ignore_eos": req.ignore_eos,
        "skip_special_tokens": req.skip_special_tokens,
        "frequency_penalty": req.frequency_penalty,
        "presence_penalty": req.presence_penalty,
        "repetition_penalty": req.repetition_penalty,
        "logit_bias": req.logit_bias or None,
        "custom_params": req.custom_params,
        "min_new_tokens": req.min_tokens,
        "n": req.n,
        **req.logprob_params(),
        **constraint,
    }


def usage_of_choices(metas: list[dict[str, Any]], per_prompt: int | None = None) -> UsageInfo:
    """Each prompt counted once, completions summed. All choices share one prompt, or (a list of
    prompts) every `per_prompt` consecutive choices share one."""
    usage = usage_from_meta(metas[0])
    if per_prompt is not None:
        usage.prompt_tokens = sum(m.get("prompt_tokens", 0) for m in metas[:: max(1, per_prompt)])
    usage.completion_tokens = sum(m.get("completion_tokens", 0) for m in metas)
    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
    return usage


def logprob_entries(meta: dict[str, Any], start: int = 0) -> tuple[list, list]:
    """(token logprobs, top alternatives) from position `start` on: upstream's meta_info layout."""
    return meta.get("output_token_logprobs", [])[start:], meta.get("output_top_logprobs", [])[start:]


def chat_logprobs(ctx: ResponseContext, meta: dict[str, Any], start: int = 0) -> dict[str, Any] | None:
    """OpenAI chat `logprobs.content` for the output positions from `start` on."""
    if "output_token_logprobs" not in meta:
        return None
    tokens, tops = logprob_entries(meta, start)

    def entry(lp: float, tok: int) -> dict[str, Any]:
        text = ctx.token_text(tok)
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    content = []
    for (lp, tok, _), alts in zip(tokens, tops):
        content.append({**entry(lp, tok), "top_logprobs": [entry(alp, atok) for alp, atok, _ in alts]})
    return {"content": content}


def legacy_logprobs(ctx: ResponseContext, entries: list, tops: list, offset: int = 0) -> dict[str, Any]:
    """OpenAI completions' legacy `logprobs` object over `[logprob, token id, _]` entries and their
    alternatives (None where a position has none: the first prompt token); `offset` is the character
    offset of the first token in the choice's text."""
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for (lp, tok, _), alts in zip(entries, tops):
        text = ctx.token_text(tok)
        out["tokens"].append(text)
        out["token_logprobs"].append(lp)
        out["top_logprobs"].append(None if alts is None else {ctx.token_text(atok): alp for alp, atok, _ in alts})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def prompt_logprobs(ctx: ResponseContext, meta: dict[str, Any]) -> dict[str, Any] | None:
    """The legacy `logprobs` object over the prompt (echo): the first token has no logprob (null), as
    in OpenAI's responses. None when the prompt was not scored."""
    if "input_token_logprobs" not in meta:
        return None
    entries = meta["input_token_logprobs"]
    return legacy_logprobs(ctx, entries, meta.get("input_top_logprobs") or [None] * len(entries))


def completion_logprobs(ctx: ResponseContext, meta: dict[str, Any], start: int = 0, offset: int = 0) -> dict[str, Any] | None:
    """The legacy `logprobs` object for the output positions from `start` on; `offset` is the character
    offset of the first token in the choice's text."""
    if "output_token_logprobs" not in meta:
        return None
    tokens, tops = logprob_entries(meta, start)
    return legacy_logprobs(ctx, tokens, tops, offset)
