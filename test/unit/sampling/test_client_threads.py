"""ClientThreads, where a client's code runs: whatever it raises (SystemExit, KeyboardInterrupt and
GeneratorExit included) comes back as a description, a call past its bound is given up on while it keeps
its thread, a key with such a call is refused at once, and with every thread held a new call is refused
instead of queued. Hung calls here wait on an event the test sets at the end, so no thread outlives it."""

from __future__ import annotations

import threading
import time

import pytest

from sglang.srt.sampling.client_threads import ClientThreads, ClientThreadsBusy, describe


@pytest.fixture
def gate():
    release = threading.Event()
    yield release
    release.set()  # every hung call returns before the next test


def _wait_for(pred, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)  # polling rate; the loop ends on the condition


def _hang(release: threading.Event, entered: threading.Event):
    def fn():
        entered.set()
        release.wait()
        return "late"
    return fn


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(), GeneratorExit(), RuntimeError("boom")])
def test_whatever_the_code_raises_comes_back_described_and_the_thread_serves_on(exc):
    threads = ClientThreads("test", 1)

    def fn():
        raise exc

    out = threads.run(fn, timeout_s=60)
    assert out.error.startswith(type(exc).__name__) and not out.timed_out
    assert threads.run(lambda: 7, timeout_s=60).value == 7  # the same (only) thread, still serving


def test_a_message_that_is_itself_hostile_is_described_without_running_it_on_the_caller():
    class Nasty(Exception):
        def __str__(self):
            raise SystemExit("from __str__")

    threads = ClientThreads("test", 1)

    def fn():
        raise Nasty()

    assert threads.run(fn, timeout_s=60).error == "Nasty: (its message could not be read)"
    assert describe(ValueError("x")) == "ValueError: x"


def test_a_call_past_its_bound_is_given_up_its_key_refused_and_its_thread_freed_when_it_returns(gate):
    threads = ClientThreads("test", 2)
    entered = threading.Event()
    out = threads.run(_hang(gate, entered), timeout_s=0.05, key="slow")
    assert out.timed_out and entered.wait(60)
    assert threads.run(lambda: 1, timeout_s=60, key="slow").overdue  # not run: its earlier call still runs
    assert threads.run(lambda: 2, timeout_s=60, key="other").value == 2  # the other thread
    assert threads.busy_threads() == 1
    gate.set()
    _wait_for(lambda: threads.busy_threads() == 0)  # the hung call returned: its key runs again
    assert threads.run(lambda: 3, timeout_s=60, key="slow").value == 3


def test_with_every_thread_held_a_new_call_is_refused_at_once(gate):
    threads = ClientThreads("test", 2)
    for key in ("a", "b"):
        entered = threading.Event()
        assert threads.run(_hang(gate, entered), timeout_s=0.05, key=key).timed_out
    with pytest.raises(ClientThreadsBusy, match="all 2 threads"):
        threads.run(lambda: 1, timeout_s=60, key="c")
