"""Custom logit processors cannot take the server down: the event-loop check runs none of the client's
code; unpickling and `__init__` at admission, and `__init__` and `__call__` at each step, run in bounded
threads, so SystemExit, KeyboardInterrupt and GeneratorExit end only their own requests (400 naming them),
a processor past its time limit is a 400 naming the limit, the same processor again is refused at once
while its earlier call still runs, and with every thread held by such calls the answer is a 503.

Hung processors wait on an event of the test (`gate`), set when the test ends, so no thread outlives it;
the limits are lowered for the tests, and a hung call is past any limit whatever the machine's load."""

from __future__ import annotations

import sys
import threading
import time
from types import SimpleNamespace

import pytest
import torch

import sglang.srt.sampling.custom_logit_processor as clp
from sglang.srt.errors import GenerateError
from sglang.srt.managers import request_validation as rv
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor, apply_custom_logit_processors
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

EXCEPTIONS = ("SystemExit", "KeyboardInterrupt", "GeneratorExit")
_GATE = "clp_bounds_test_gate"  # what the processors below import to find the test's events

_FORCE = """
class Force{tag}(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list):
        logits[:, :] = -float("inf")
        logits[:, 3] = 0.0
        return logits
"""
_RAISE_IN_CALL = """
class RaiseInCall{tag}(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list):
        raise {exc}("from __call__")
"""
_RAISE_IN_INIT = """
class RaiseInInit{tag}(CustomLogitProcessor):
    def __init__(self):
        raise {exc}("from __init__")

    def __call__(self, logits, custom_param_list):
        return logits
"""
_RAISE_IN_UNPICKLE = """
def _explode():
    raise {exc}("from unpickling")


class _Trap:
    def __reduce__(self):
        return (_explode, ())


class RaiseInUnpickle{tag}(CustomLogitProcessor):
    trap = _Trap()

    def __call__(self, logits, custom_param_list):
        return logits
"""
_HANG_IN = """
class Hang{tag}(CustomLogitProcessor):
    def {method}(self, *args):
        import sys
        gate = sys.modules["{gate}"]
        gate.calls.append("{tag}")
        gate.entered.set()
        gate.release.wait()
        return args[0] if args else None
"""
_SLOW_CALL = """
class SlowCall{tag}(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list):
        import time
        time.sleep({seconds})
        return logits
"""


def _processor(source: str, **fmt) -> str:
    """The processor string a client script's `__main__` class makes (dill pickles it by value)."""
    ns = {"__name__": "__main__", "CustomLogitProcessor": CustomLogitProcessor}
    exec(source.format(tag=fmt.pop("tag", ""), gate=_GATE, **fmt), ns)
    cls = next(v for k, v in ns.items() if isinstance(v, type) and issubclass(v, CustomLogitProcessor)
               and v is not CustomLogitProcessor)
    return cls.to_str()


def _hang(method: str, tag: str) -> str:
    return _processor(_HANG_IN, method=method, tag=tag)


def _threads(name: str, size: int):
    from sglang.srt.sampling.client_threads import ClientThreads

    return ClientThreads(name, size)


@pytest.fixture
def gate(monkeypatch):
    """Fresh threads (so one test's hung calls hold none of another's) and the hung processors' events."""
    monkeypatch.setattr(clp, "_LOADS", _threads("test loads", 2))
    monkeypatch.setattr(clp, "_CALLS", _threads("test calls", 2))
    g = SimpleNamespace(release=threading.Event(), entered=threading.Event(), calls=[])
    sys.modules[_GATE] = g
    yield g
    g.release.set()
    sys.modules.pop(_GATE, None)


def _wait_for(pred, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)  # polling rate; the loop ends on the condition


def _req(processor):
    return SimpleNamespace(custom_logit_processor=processor, sampling_params=SamplingParams(), output_ids=[3])


# ----------------------------------------------------------------------------- admission
def test_the_event_loop_check_runs_none_of_the_clients_code(gate):
    on = ServerArgs(enable_custom_logit_processor=True)
    trap = _processor(_RAISE_IN_UNPICKLE, exc="SystemExit", tag="Loop")
    hung = _hang("__init__", "Loop")
    assert rv.check_custom_logit_processor(trap, on) == trap  # would have raised SystemExit if it unpickled
    assert rv.check_custom_logit_processor(hung, on) == hung
    assert gate.calls == []


@pytest.mark.parametrize("where", ["unpickle", "init"])
@pytest.mark.parametrize("exc", EXCEPTIONS)
def test_base_exceptions_at_admission_are_a_400_naming_them(gate, exc, where):
    source = _RAISE_IN_UNPICKLE if where == "unpickle" else _RAISE_IN_INIT
    text = _processor(source, exc=exc, tag=f"{exc}{where}")
    with pytest.raises(GenerateError) as e:
        rv.check_in_worker(SamplingParams(), text)
    assert e.value.status_code == 400
    assert "invalid custom_logit_processor" in e.value.message and exc in e.value.message


def test_a_slow_init_is_a_400_at_the_limit_then_refused_at_once_and_a_503_when_every_thread_is_held(gate, monkeypatch):
    monkeypatch.setattr(clp, "LOAD_TIMEOUT_S", 0.2)
    monkeypatch.setattr(clp, "_LOADS", _threads("test loads", 1))
    hung = _hang("__init__", "Admission")
    with pytest.raises(GenerateError, match="took longer than 0.2 s") as e:
        rv.check_in_worker(SamplingParams(), hung)
    assert e.value.status_code == 400
    assert gate.entered.wait(60)
    with pytest.raises(GenerateError, match="still unpickling or in __init__") as e:  # not run again
        rv.check_in_worker(SamplingParams(), hung)
    assert e.value.status_code == 400 and gate.calls == ["Admission"]
    fine = _processor(_FORCE, tag="Admission")
    with pytest.raises(GenerateError, match="all 1 threads") as e:  # the only thread is held
        rv.check_in_worker(SamplingParams(), fine)
    assert e.value.status_code == 503
    gate.release.set()
    _wait_for(lambda: clp._LOADS.busy_threads() == 0)
    rv.check_in_worker(SamplingParams(), fine)


# ----------------------------------------------------------------------------- the scheduler's step
@pytest.mark.parametrize("exc", EXCEPTIONS)
def test_base_exceptions_in_a_step_fail_only_their_rows(gate, exc):
    force = _processor(_FORCE, tag=f"Step{exc}")
    in_call = _processor(_RAISE_IN_CALL, exc=exc, tag=f"Step{exc}")
    in_init = _processor(_RAISE_IN_INIT, exc=exc, tag=f"Step{exc}")
    reqs = [_req(in_call), _req(force), _req(in_init), _req(None)]
    logits = torch.randn(4, 8)
    before = logits.clone()
    failed = apply_custom_logit_processors(logits, reqs)
    assert [(row, status) for row, _, status in failed] == [(0, 400), (2, 400)]
    assert f"{exc}: from __call__" in failed[0][1] and f"{exc}: from __init__" in failed[1][1]
    assert logits[1].argmax().item() == 3 and torch.equal(logits[3], before[3])


def test_a_hung_call_is_a_400_at_the_step_limit_and_is_not_called_again(gate, monkeypatch):
    monkeypatch.setattr(clp, "CALL_TIMEOUT_S", 0.2)
    hung, force = _hang("__call__", "Step"), _processor(_FORCE, tag="Hung")
    failed = apply_custom_logit_processors(torch.randn(2, 8), [_req(hung), _req(force)])
    assert [(row, status) for row, _, status in failed] == [(0, 400)]
    assert "ran longer than 0.2 s, the limit for one decoding step" in failed[0][1]
    assert gate.entered.wait(60)
    # the same processor in a later step, while that call still runs: refused without being called
    logits = torch.randn(2, 8)
    failed = apply_custom_logit_processors(logits, [_req(force), _req(hung)])
    assert [(row, status) for row, _, status in failed] == [(1, 400)]
    assert "has not returned" in failed[0][1] and gate.calls == ["Step"]
    assert logits[0].argmax().item() == 3


def test_a_call_that_returns_after_the_step_limit_is_a_400(gate, monkeypatch):
    monkeypatch.setattr(clp, "CALL_TIMEOUT_S", 0.2)
    slow = _processor(_SLOW_CALL, seconds=0.5, tag="Returns")  # returns, but stalled its batch past the limit
    failed = apply_custom_logit_processors(torch.randn(1, 8), [_req(slow)])
    assert [(row, status) for row, _, status in failed] == [(0, 400)]
    assert "longer than 0.2 s, the limit for one decoding step" in failed[0][1]


def test_with_every_call_thread_held_a_processor_request_is_a_503(gate, monkeypatch):
    monkeypatch.setattr(clp, "CALL_TIMEOUT_S", 0.2)
    monkeypatch.setattr(clp, "_CALLS", _threads("test calls", 1))
    hung, force = _hang("__call__", "Busy"), _processor(_FORCE, tag="Busy")
    assert apply_custom_logit_processors(torch.randn(1, 8), [_req(hung)])[0][2] == 400
    failed = apply_custom_logit_processors(torch.randn(2, 8), [_req(force), _req(None)])
    assert [(row, status) for row, _, status in failed] == [(0, 503)]
    assert "all 1 threads" in failed[0][1]
    gate.release.set()
    _wait_for(lambda: clp._CALLS.busy_threads() == 0)
    assert apply_custom_logit_processors(torch.randn(1, 8), [_req(force)]) == []
