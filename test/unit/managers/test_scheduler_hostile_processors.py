"""Hostile custom logit processors through the scheduler: SystemExit, KeyboardInterrupt and GeneratorExit
raised from `__call__` or `__init__` end only their own requests (400 naming them) while the requests beside
them in the batch finish as they would alone, and a `__call__` that never returns ends its request at the
per-step limit, is not called for it again, and the batch goes on. (They had ended the scheduler, and with
it the server, or stalled it for as long as the call ran.)"""

from __future__ import annotations

import itertools
import sys
import threading
from types import SimpleNamespace

import pytest

import sglang.srt.sampling.custom_logit_processor as clp
from scheduler_utils import InProcessScheduler
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor
from sglang.srt.sampling.sampling_params import SamplingParams

EXCEPTIONS = ("SystemExit", "KeyboardInterrupt", "GeneratorExit")
_GATE = "scheduler_hostile_processors_gate"

_FORCE = """
class ForceToken(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list):
        for i, params in enumerate(custom_param_list):
            logits[i, :] = -float("inf")
            logits[i, params["token_id"]] = 0.0
        return logits
"""
_RAISE = """
class Raise{exc}In{where}(CustomLogitProcessor):
    def {method}(self, *args):
        raise {exc}("from {method}")
"""
_HANG = """
class HangInCall(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list):
        import sys
        gate = sys.modules["{gate}"]
        gate.calls.append(len(custom_param_list))
        gate.release.wait()
        return logits
"""
_ids = itertools.count()
PROMPT = list(range(20, 44))


def _processor(source: str, **fmt) -> str:
    ns = {"__name__": "__main__", "CustomLogitProcessor": CustomLogitProcessor}
    exec(source.format(**fmt), ns)  # a client script's __main__ class: pickled by value
    return next(v for k, v in ns.items() if isinstance(v, type) and k != "CustomLogitProcessor").to_str()


@pytest.fixture(scope="module")
def path(tiny_model_dir):
    return str(tiny_model_dir("qwen3-vl-tiny"))


@pytest.fixture
def gate():
    g = SimpleNamespace(release=threading.Event(), calls=[])
    sys.modules[_GATE] = g
    yield g
    g.release.set()  # the hung call returns: no thread outlives the test
    sys.modules.pop(_GATE, None)


def _submit(s: InProcessScheduler, processor=None, **sp) -> str:
    rid = f"hostile{next(_ids)}"
    msg = TokenizedGenerateReqInput(rid, list(PROMPT), SamplingParams(max_new_tokens=6, ignore_eos=True,
                                                                      temperature=0.0, **sp),
                                    custom_logit_processor=processor)
    s.sched.process_input_requests([msg])
    s.outputs[rid] = []
    return rid


def _alone(path) -> list[int]:
    s = InProcessScheduler(path, enable_custom_logit_processor=True)
    rid = _submit(s)
    s.run_until_idle()
    return s.outputs[rid]


def test_base_exceptions_from_call_and_init_end_only_their_requests(path, gate):
    s = InProcessScheduler(path, enable_custom_logit_processor=True)
    plain = _submit(s)
    forced = _submit(s, _processor(_FORCE), custom_params={"token_id": 7})
    hostile = {(exc, where): _submit(s, _processor(_RAISE, exc=exc, where=where, method=method))
               for exc in EXCEPTIONS for where, method in (("Call", "__call__"), ("Init", "__init__"))}
    s.run_until_idle()  # returns: the scheduler is alive
    s.assert_no_leak()
    assert s.outputs[plain] == _alone(path) and s.finished[plain].type == "length"
    assert s.outputs[forced] == [7] * 6 and s.finished[forced].type == "length"
    for (exc, _), rid in hostile.items():
        reason = s.finished[rid]
        assert (reason.type, reason.status_code) == ("abort", 400), reason
        assert f"custom_logit_processor failed: {exc}" in reason.message
        assert s.outputs[rid] == []  # ended at its first step: no token from unprocessed logits
    after = _submit(s)
    s.run_until_idle()
    assert s.finished[after].type == "length"


def test_a_hung_call_ends_its_request_at_the_step_limit_and_the_batch_goes_on(path, gate, monkeypatch):
    monkeypatch.setattr(clp, "CALL_TIMEOUT_S", 0.2)
    hung = _processor(_HANG, gate=_GATE)
    s = InProcessScheduler(path, enable_custom_logit_processor=True)
    plain, stuck = _submit(s), _submit(s, hung)
    s.run_until_idle()
    s.assert_no_leak()
    assert s.outputs[plain] == _alone(path) and s.finished[plain].type == "length"
    reason = s.finished[stuck]
    assert (reason.type, reason.status_code) == ("abort", 400), reason
    assert "longer than 0.2 s, the limit for one decoding step" in reason.message
    assert s.outputs[stuck] == [] and gate.calls == [1]
    # the same processor again while that call still runs: refused at its first step, never called
    again = _submit(s, hung)
    s.run_until_idle()
    assert s.finished[again].status_code == 400 and "has not returned" in s.finished[again].message
    assert gate.calls == [1]
