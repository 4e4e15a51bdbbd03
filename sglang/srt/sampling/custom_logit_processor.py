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

The client's code never runs on the caller's thread: unpickling and `__init__` at admission run in
`LOAD_THREADS` threads of their own (bounded by `LOAD_TIMEOUT_S`, off the HTTP event loop), and each step's
unpickle, `__init__` and `__call__` in the scheduler run in `CALL_THREADS` threads (bounded by
`CALL_TIMEOUT_S` per step), both through `client_threads.ClientThreads`: whatever they raise (SystemExit
and KeyboardInterrupt included) or however long they take, only their own requests end.

dill is imported only when a processor is used, so a server without it still starts.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.sampling.client_threads import ClientThreads, ClientThreadsBusy, describe

# a processor string longer than this is refused before it is unpickled (a class's pickle is a few KiB)
MAX_PROCESSOR_CHARS = 1 << 20
# distinct processor strings kept unpickled per process; a client sending endless new ones only churns this
_CACHE_SIZE = 64
# Admission (tokenizer process): unpickling plus one `__init__` may take this long, in at most this many
# threads at once; past it the request is a 400, and with every thread held by such calls, a 503.
LOAD_TIMEOUT_S = 5.0
LOAD_THREADS = 4
# Scheduler, per decoding step and processor: `__init__` plus `__call__` may take this long (the step that
# first unpickles the string in this process waits up to LOAD_TIMEOUT_S for that first). Past it the
# processor's requests end with a 400 and it is not called for them again. Calls that never return hold their thread
# (Python cannot stop one); with every thread held, processor requests end with a 503.
CALL_TIMEOUT_S = 1.0
CALL_THREADS = 4

_LOADS = ClientThreads("custom logit processor loads", LOAD_THREADS)
_CALLS = ClientThreads("custom logit processor calls", CALL_THREADS)


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
        """A new instance of the class `json_str` carries (upstream's API; the unpickled class is cached by
        string). Runs the client's code on the calling thread: the server itself never calls this."""
        return _load_class(json_str)()


# ----------------------------------------------------------------------------- the string and its class
def check_processor_format(value: Any) -> bytes:
    """The pickle bytes of a processor string, refused (CustomLogitProcessorError) when it is not the
    JSON text CustomLogitProcessor.to_str() makes. Runs none of the client's code: cheap enough for the
    event loop."""
    if not isinstance(value, str):
        raise CustomLogitProcessorError(f"expected the string CustomLogitProcessor.to_str() makes, "
                                        f"got {type(value).__name__}")
    if len(value) > MAX_PROCESSOR_CHARS:
        raise CustomLogitProcessorError(f"{len(value)} characters, at most {MAX_PROCESSOR_CHARS}")
    try:
        data = json.loads(value)
    except ValueError as e:
        raise CustomLogitProcessorError(f"not JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("callable"), str):
        raise CustomLogitProcessorError('expected the JSON object {"callable": "<hex>"} that '
                                        "CustomLogitProcessor.to_str() makes")
    try:
        return bytes.fromhex(data["callable"])
    except ValueError:
        raise CustomLogitProcessorError("'callable' is not a hex string") from None


_classes: OrderedDict[str, type] = OrderedDict()  # processor string -> its class, least recently used first
_classes_lock = threading.Lock()


def _cached_class(text: str) -> type | None:
    with _classes_lock:
        cls = _classes.get(text)
        if cls is not None:
            _classes.move_to_end(text)
        return cls


def _load_class(text: str) -> type:
    """The class a processor string carries, unpickled once per process (up to _CACHE_SIZE strings).
    Runs the client's code (dill.loads): called only in a client thread, or by the client's own from_str."""
    cls = _cached_class(text)
    if cls is not None:
        return cls
    raw = check_processor_format(text)
    try:
        import dill
    except ImportError:
        raise CustomLogitProcessorError("the server cannot unpickle processors: the dill package is not "
                                        "installed") from None
    try:
        obj = dill.loads(raw)
    except BaseException as e:  # any error of the client's pickle, SystemExit too: a bad request
        raise CustomLogitProcessorError(f"cannot unpickle it ({describe(e)})") from None
    if not isinstance(obj, type) or not callable(getattr(obj, "__call__", None)):
        raise CustomLogitProcessorError(f"it holds {type(obj).__name__}, not a processor class")
    evicted = []
    with _classes_lock:
        _classes[text] = obj
        while len(_classes) > _CACHE_SIZE:
            evicted.append(_classes.popitem(last=False))
    del evicted  # dropped after the lock, in this (client) thread: a finalizer of theirs cannot hold the lock
    return obj


def _class_name(cls: type) -> str:
    """The class's name for messages (a metaclass may make even this client code: client threads only)."""
    name = getattr(cls, "__name__", None)
    return name if type(name) is str else "the processor"


def _load_and_init(text: str) -> str | None:
    """Admission's check, in a client thread: the problem with the string, or None when its class
    unpickles and instantiates with no arguments."""
    try:
        cls = _load_class(text)
        name = _class_name(cls)
    except CustomLogitProcessorError as e:
        return str(e)
    try:
        cls()
    except BaseException as e:
        return f"{name}() failed ({describe(e)})"
    return None


def checked_processor(value: Any) -> str:
    """The request's processor string, refused (CustomLogitProcessorError) unless it unpickles to a class
    that can be instantiated with no arguments within LOAD_TIMEOUT_S. The unpickling and `__init__` run in
    one of LOAD_THREADS threads while the caller waits; ClientThreadsBusy when all are held by calls that
    ran past the limit. Run where the request enters, off the event loop, so that a malformed or hostile
    one is a 400 before any scheduler sees it."""
    check_processor_format(value)
    outcome = _LOADS.run(lambda: _load_and_init(value), LOAD_TIMEOUT_S, key=value)
    if outcome.overdue:
        raise CustomLogitProcessorError(f"an earlier request's copy of it is still unpickling or in __init__ "
                                        f"after the {LOAD_TIMEOUT_S:g} s limit")
    if outcome.timed_out:
        raise CustomLogitProcessorError(f"unpickling it and calling its __init__ took longer than "
                                        f"{LOAD_TIMEOUT_S:g} s, the limit for loading a processor")
    message = outcome.error or outcome.value  # .error: the thread's own safety net
    if message is not None:
        raise CustomLogitProcessorError(message)
    return value


# ----------------------------------------------------------------------------- the scheduler's step
@dataclass(frozen=True)
class _Ran:
    out: torch.Tensor | None  # the processed rows (a plain tensor on the logits' device and dtype)
    error: str | None
    name: str = "the processor"
    call_s: float = 0.0  # `__init__` plus `__call__`


def _load_for_step(text: str) -> str | None:
    """The step's first use of a processor string in this process, in a client thread: the problem with
    unpickling it, or None once its class is cached."""
    try:
        _load_class(text)
    except CustomLogitProcessorError as e:
        return f"custom_logit_processor failed: {e}"
    return None


def _run_group(text: str, rows: torch.Tensor, params: list[dict], stream) -> _Ran:
    """One processor on its rows, in a client thread. Everything that touches the client's objects (their
    return value included) happens here; the scheduler gets back a plain tensor or a message."""
    t0 = time.monotonic()
    try:
        cls = _load_class(text)  # cached by _load_for_step (unless evicted since: then it counts as the call)
        name = _class_name(cls)
    except CustomLogitProcessorError as e:
        return _Ran(None, f"custom_logit_processor failed: {e}")
    # the scheduler's thread-local state, which a new thread lacks: no autograd, the logits' stream
    with torch.inference_mode(), _cuda_context(rows.device, stream):
        try:
            out = cls()(rows, params)
        except BaseException as e:
            return _Ran(None, f"custom_logit_processor failed: {describe(e)}", name)
        call_s = time.monotonic() - t0
        expected = tuple(rows.shape)
        if type(out) is not torch.Tensor or tuple(out.shape) != expected:  # exactly a tensor: no client methods
            got = tuple(out.shape) if type(out) is torch.Tensor else type(out).__name__
            return _Ran(None, f"custom_logit_processor failed: {name} returned {got}, expected a tensor of shape "
                              f"{expected}", name)
        out = out.to(rows.device, rows.dtype)
    return _Ran(out, None, name, call_s)


def _cuda_context(device: torch.device, stream):
    """The scheduler's device and stream on a client thread (both are per thread), so the processor's kernels
    queue behind the ones that made the logits."""
    if stream is None:
        return nullcontext()
    stack = ExitStack()
    stack.enter_context(torch.cuda.device(device))
    stack.enter_context(torch.cuda.stream(stream))
    return stack


def _too_slow(name: str | None) -> str:
    who = f"custom_logit_processor {name}" if name else "custom_logit_processor"
    return (f"{who} ran longer than {CALL_TIMEOUT_S:g} s, the limit for one decoding step; the request ends "
            "and its processor is not called for it again")


def _refusal(outcome, what: str) -> str | None:
    """The message for an outcome that never reached the client's result (None when it did)."""
    if outcome.overdue:
        return ("custom_logit_processor not run: an earlier call of it ran past its time limit and has not "
                "returned")
    if outcome.timed_out:
        return what
    if outcome.error is not None:  # the client thread's own safety net
        return f"custom_logit_processor failed: {outcome.error}"
    return None


def _call_group(text: str, rows: torch.Tensor, params: list[dict], stream) -> tuple[int, str, torch.Tensor | None]:
    """(HTTP status, message, None) for a processor that failed; (0, "", processed rows) otherwise. Two
    bounded waits: unpickling (LOAD_TIMEOUT_S, only a string this process has not cached), then `__init__`
    plus `__call__` (CALL_TIMEOUT_S), so the step limit is the call's alone."""
    try:
        if _cached_class(text) is None:
            loaded = _CALLS.run(lambda: _load_for_step(text), LOAD_TIMEOUT_S, key=text)
            message = _refusal(loaded, f"custom_logit_processor: unpickling it took longer than "
                                       f"{LOAD_TIMEOUT_S:g} s, the limit for loading a processor") or loaded.value
            if message is not None:
                return 400, message, None
        outcome = _CALLS.run(lambda: _run_group(text, rows, params, stream), CALL_TIMEOUT_S, key=text)
    except ClientThreadsBusy as e:
        return 503, f"custom_logit_processor not run: {e}", None
    message = _refusal(outcome, _too_slow(None))
    if message is not None:
        return 400, message, None
    ran: _Ran = outcome.value
    if ran.error is not None:
        return 400, ran.error, None
    if ran.call_s > CALL_TIMEOUT_S:  # returned just as the wait ended: it stalled the batch that long all the same
        return 400, _too_slow(ran.name), None
    return 0, "", ran.out


def apply_custom_logit_processors(logits: torch.Tensor, reqs: list, skip: set[int] | frozenset = frozenset(),
                                  tp: TPInfo = SINGLE_RANK) -> list[tuple[int, str, int]]:
    """Runs each processor of the batch, once per distinct processor string, on the rows of the requests
    that sent it (`reqs[i]` owns row i; rows in `skip` are left out: their token is dropped this step),
    writing the returned rows back into `logits` in place. A processor that raises, returns rows of another
    shape, or runs past CALL_TIMEOUT_S leaves its rows as they were; returns (row, message, HTTP status) for
    each of its requests, so the caller ends only those. With TP > 1 the ranks agree on that list (a
    processor that failed or ran out of time on one rank fails on all), so they keep the same batches."""
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(reqs):
        if r.custom_logit_processor is not None and i not in skip:
            groups.setdefault(r.custom_logit_processor, []).append(i)
    if not groups:  # alike on every rank: they hold the same batch
        return []
    stream = torch.cuda.current_stream(logits.device) if logits.is_cuda else None
    failed: dict[int, tuple[int, str]] = {}
    for text, rows in groups.items():
        params = [dict(reqs[i].sampling_params.custom_params or {}, __req__=reqs[i]) for i in rows]
        idx = torch.tensor(rows, device=logits.device)
        status, message, out = _call_group(text, logits.index_select(0, idx), params, stream)
        if out is not None:
            logits.index_copy_(0, idx, out)
        else:
            failed.update((i, (status, message)) for i in rows)
    return _agreed(failed, len(reqs), logits.device, tp)


def _agreed(failed: dict[int, tuple[int, str]], n: int, device: torch.device, tp: TPInfo) -> list[tuple[int, str, int]]:
    """The failed rows every rank agrees on: failed on any rank fails on all (the highest status wins).
    One all-reduce on the TP group, from the thread that runs the model's collectives, so it keeps their
    order; a rank whose own call succeeded names the other rank in its message."""
    if tp.size > 1:
        import torch.distributed as dist

        codes = torch.zeros(n, dtype=torch.int64)
        for row, (status, _) in failed.items():
            codes[row] = status
        codes = codes.to(device)
        dist.all_reduce(codes, op=dist.ReduceOp.MAX, group=tp.group)
        agreed = {row: status for row, status in enumerate(codes.tolist()) if status}
    else:
        agreed = {row: status for row, (status, _) in failed.items()}
    out = []
    for row, status in sorted(agreed.items()):
        mine = failed.get(row)
        message = mine[1] if mine is not None and mine[0] == status else (
            "custom_logit_processor failed or ran out of time on another tensor-parallel rank")
        out.append((row, message, status))
    return out
