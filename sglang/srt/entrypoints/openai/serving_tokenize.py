"""`/tokenize`, `/detokenize` (also under `/v1/`): upstream SGLang's request and response shapes.

Tokenize: `{"prompt": str | [str], "add_special_tokens": true}` -> `{"tokens", "count", "max_model_len"}`
(a list of prompts gives lists). Detokenize: `{"tokens": [int] | [[int]], "skip_special_tokens": true}`
-> `{"text"}`. Both run with the server's tokenizer in the tokenizer manager's worker threads; `model`
and unknown fields are accepted and ignored, as upstream's request models do. `max_model_len` is the
served context length."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, StrictInt, ValidationError

from sglang.srt.entrypoints.openai.serving_base import format_validation_error, parse_json_body
from sglang.srt.errors import GenerateError
from sglang.srt.managers.tokenizer_lanes import check_id_count
from sglang.srt.managers.tokenizer_manager import TokenizerManager


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: str | list[str]
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    tokens: list[StrictInt] | list[list[StrictInt]]
    skip_special_tokens: bool = True


def _parse(model: type[BaseModel], body: bytes | dict[str, Any]) -> Any:
    try:
        return model.model_validate(parse_json_body(body) if isinstance(body, bytes) else body)
    except ValidationError as e:
        raise GenerateError(format_validation_error(e)) from None


async def tokenize(tm: TokenizerManager, body: bytes) -> dict[str, Any]:
    req = _parse(TokenizeRequest, body)
    batch = isinstance(req.prompt, list)
    ids = await tm.tokenize(req.prompt if batch else [req.prompt], req.add_special_tokens)
    if batch:
        return {"tokens": ids, "count": [len(x) for x in ids], "max_model_len": tm.context_length}
    return {"tokens": ids[0], "count": len(ids[0]), "max_model_len": tm.context_length}


async def detokenize(tm: TokenizerManager, body: bytes) -> dict[str, Any]:
    data = parse_json_body(body)
    tokens = data.get("tokens")
    if isinstance(tokens, list):  # lengths first: validating millions of ids held the event loop for seconds
        for seq in tokens if tokens and isinstance(tokens[0], list) else [tokens]:
            check_id_count(len(seq) if isinstance(seq, list) else 0, tm.context_length)
    req = _parse(DetokenizeRequest, data)
    batch = bool(req.tokens) and isinstance(req.tokens[0], list)
    texts = await tm.detokenize(req.tokens if batch else [req.tokens], req.skip_special_tokens)
    return {"text": texts if batch else texts[0]}
