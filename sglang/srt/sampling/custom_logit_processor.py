"""Custom logit processors (upstream's `custom_logit_processor` request field, behind
`--enable-custom-logit-processor`): a client-sent Python class run on its request's logits rows before
sampling.

The wire form is upstream's: `CustomLogitProcessor.to_str()` is the JSON text `{"callable": HEX}`, HEX
the dill pickle of the class. A subclass defined in the client's `__main__` (or inside a function) is
pickled by value; its base, `sglang.srt.sampling.custom_logit_processor.CustomLogitProcessor`, by
reference, so this module keeps upstream's path and name. Unpickling runs the client's code in the
server: the flag is off by default and docs/reliability.md says what turning it on means.

A processor is called as `processor(logits, custom_param_list)`: `logits` the (rows, vocab) logits of
the requests that sent this same processor string (grouped, as upstream does), after penalties, logit
bias, min-token bans and grammar masks; `custom_param_list` one dict per row, the request's
`sampling_params.custom_params` plus `"__req__"`, the scheduler's request (its `origin_input_ids` and
`output_ids` are what upstream's processors read). It returns the new rows (it may edit them in place).
Every TP rank runs it on the same all-gathered logits, so a deterministic processor keeps the ranks in
step; one that draws random numbers of its own may not.

dill is imported only when a processor is used, so a server without it still starts.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import torch

# a processor string longer than this is refused before it is unpickled (a class's pickle is a few KiB)
MAX_PROCESSOR_CHARS = 1 << 20
# distinct processor strings kept unpickled per process; a client sending endless new ones only churns this
_CACHE_SIZE = 64


class CustomLogitProcessorError(ValueError):
    """A processor string that cannot be turned into a processor: the client's 400."""


class CustomLogitProcessor:
    """Base class of client processors (upstream's name and methods). Subclasses define `__call__`."""

    def __call__(self, logits: torch.Tensor, custom_param_list: list[dict[str, Any]] | None = None) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def to_str(cls) -> str:
        """The class as the request field's JSON text: {"callable": hex of its dill pickle}."""
        import dill

        return json.dumps({"callable": dill.dumps(cls).hex()})

    @classmethod
    def from_str(cls, json_str: str) -> "CustomLogitProcessor":
        """A new instance of the class `json_str` carries (the unpickled class is cached by string)."""
        return _load_class(json_str)()


@lru_cache(maxsize=_CACHE_SIZE)
def _load_class(json_str: str) -> type:
    try:
        data = json.loads(json_str)
    except ValueError as e:
        raise CustomLogitProcessorError(f"not JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("callable"), str):
        raise CustomLogitProcessorError('expected the JSON object {"callable": "<hex>"} that '
                                        "CustomLogitProcessor.to_str() makes")
    try:
        raw = bytes.fromhex(data["callable"])
    except ValueError:
        raise CustomLogitProcessorError("'callable' is not a hex string") from None
    try:
        import dill
    except ImportError:
        raise CustomLogitProcessorError("the server cannot unpickle processors: the dill package is not "
                                        "installed") from None
    try:
        obj = dill.loads(raw)
    except Exception as e:  # any error of the client's pickle: a bad request, never a server fault
        raise CustomLogitProcessorError(f"cannot unpickle it ({type(e).__name__}: {e})") from None
    if not isinstance(obj, type) or not callable(getattr(obj, "__call__", None)):
        raise CustomLogitProcessorError(f"it holds {type(obj).__name__}, not a processor class")
    return obj


def checked_processor(value: Any) -> str:
    """The request's processor string, refused (CustomLogitProcessorError) unless it unpickles to a class
    that can be instantiated with no arguments. Run where the request enters, so a malformed one is a 400
    before any scheduler sees it."""
    if not isinstance(value, str):
        raise CustomLogitProcessorError(f"expected the string CustomLogitProcessor.to_str() makes, "
                                        f"got {type(value).__name__}")
    if len(value) > MAX_PROCESSOR_CHARS:
        raise CustomLogitProcessorError(f"{len(value)} characters, at most {MAX_PROCESSOR_CHARS}")
    cls = _load_class(value)
    try:
        cls()
    except Exception as e:
        raise CustomLogitProcessorError(f"{cls.__name__}() failed ({type(e).__name__}: {e})") from None
    return value


def apply_custom_logit_processors(logits: torch.Tensor, reqs: list, skip: set[int] | frozenset = frozenset()
                                  ) -> list[tuple[int, str]]:
    """Runs each processor of the batch, once per distinct processor string, on the rows of the requests
    that sent it (`reqs[i]` owns row i; rows in `skip` are left out: their token is dropped this step),
    writing the returned rows back into `logits` in place. A processor that raises or returns rows of
    another shape leaves its rows as they were; returns (row, message) for each of its requests, so the
    caller ends only those."""
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(reqs):
        if r.custom_logit_processor is not None and i not in skip:
            groups.setdefault(r.custom_logit_processor, []).append(i)
    failed: list[tuple[int, str]] = []
    for text, rows in groups.items():
        params = [dict(reqs[i].sampling_params.custom_params or {}, __req__=reqs[i]) for i in rows]
        idx = torch.tensor(rows, device=logits.device)
        try:
            out = CustomLogitProcessor.from_str(text)(logits.index_select(0, idx), params)
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != (len(rows), logits.shape[-1]):
                got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise CustomLogitProcessorError(f"returned {got}, expected a tensor of shape "
                                                f"{(len(rows), logits.shape[-1])}")
            logits.index_copy_(0, idx, out.to(logits.device, logits.dtype))
        except Exception as e:  # the client's code: its requests end, the batch goes on
            message = f"custom_logit_processor failed: {type(e).__name__}: {e}"
            failed += [(i, message) for i in rows]
    return failed
