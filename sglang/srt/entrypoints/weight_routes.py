"""Upstream's weight routes:

- `POST /update_weights_from_disk` `{"model_path", "load_format"?, "abort_all_requests"?, "weight_version"?,
  "flush_cache"?, "abort_on_drain_timeout"?}` -> `{"success", "message", "num_paused_requests"}`, 200 on success,
  400 otherwise (the server keeps serving on the old weights); 409 when requests were still running at the
  `--weight-update-drain-timeout` bound (nothing loaded; `abort_on_drain_timeout: true` aborts them instead, as
  `abort_all_requests` does); 400 on a `--language-only` server. Upstream's other fields are accepted at their
  defaults; asking for what this server does not do (`is_async`, `keep_pause`, `torch_empty_cache`) is a 400
  naming it.
- `GET /get_weight_version` -> `{"weight_version"}`.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.errors import GenerateError
from sglang.srt.managers.field_policy import Refusal, check_fields

_HONOURED = ("model_path", "load_format", "abort_all_requests", "weight_version", "flush_cache",
             "abort_on_drain_timeout",  # ours: abort what still runs at --weight-update-drain-timeout, not 409
             # an in-place update keeps every parameter's storage: captured CUDA graphs stay valid either way
             # (with an FP8 KV cache the schedulers recapture them for its new scales, asked or not)
             "recapture_cuda_graph",
             "token_step")  # the trainer's step id: informational
_REFUSED = {
    "is_async": Refusal("is_async: asynchronous weight updates are not supported", (False, None)),
    "keep_pause": Refusal("keep_pause: the server does not pause generation (see /update_weights_from_disk)",
                          (False, None)),
    "torch_empty_cache": Refusal("torch_empty_cache is not supported", (False, None)),
}


def update_weights_request(data: Any) -> dict[str, Any]:
    """The body's fields as keyword arguments of `TokenizerManager.update_weights_from_disk`; a 400 naming
    any field that does not fit."""
    if not isinstance(data, dict):
        raise GenerateError("the body must be a JSON object")
    problem = check_fields(data, _HONOURED, _REFUSED)
    if problem:
        raise GenerateError(problem)
    path = data.get("model_path")
    if not isinstance(path, str) or not path:
        raise GenerateError("model_path must be a non-empty string")
    for name in ("load_format", "weight_version"):
        if data.get(name) is not None and not isinstance(data[name], str):
            raise GenerateError(f"{name} must be a string")
    for name in ("abort_all_requests", "flush_cache", "recapture_cuda_graph", "abort_on_drain_timeout"):
        if data.get(name) is not None and not isinstance(data[name], bool):
            raise GenerateError(f"{name} must be true or false")
    return {"model_path": path, "load_format": data.get("load_format"),
            "abort_all_requests": bool(data.get("abort_all_requests", False)),
            "weight_version": data.get("weight_version"),
            "flush_cache": data.get("flush_cache") is not False,
            "abort_on_drain_timeout": bool(data.get("abort_on_drain_timeout", False))}
