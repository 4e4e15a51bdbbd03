"""SingleFlight: concurrent calls of one key run the computation once and share its result or its
exception; finished keys are forgotten (a failure is not replayed); other keys and key None never share.
Threads synchronise on the flight's own join count and on events, never on sleeps."""

from __future__ import annotations

import threading

import pytest

from sglang.srt.utils.single_flight import SingleFlight

TIMEOUT = 60  # generous: the machine is shared and slow; a hang fails the test instead of blocking


def _run_in_threads(flight: SingleFlight, key, fn, n: int, **run_kwargs) -> list:
    """n calls of flight.run(key, fn, **run_kwargs) in threads, the first one started (and inside fn) before
    the others begin; returns each call's result or exception."""
    out: list = [None] * n
    entered = threading.Event()

    def call(i: int, f):
        try:
            out[i] = flight.run(key, f, **run_kwargs)
        except BaseException as e:  # noqa: BLE001  collected for the assertions
            out[i] = e

    def leader_fn():
        entered.set()
        return fn()

    threads = [threading.Thread(target=call, args=(0, leader_fn))]
    threads[0].start()
    assert entered.wait(TIMEOUT)
    threads += [threading.Thread(target=call, args=(i, fn)) for i in range(1, n)]
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive()
    return out


def test_concurrent_calls_share_one_computation():
    flight, calls = SingleFlight(), []

    def work():
        calls.append(1)
        assert flight.wait_joined(3, TIMEOUT)  # held until the three others have joined it
        return object()

    out = _run_in_threads(flight, "k", work, 4)
    assert len(calls) == 1 and all(o is out[0] for o in out)
    assert (flight.leaders, flight.joined, flight.in_flight()) == (1, 3, 0)


def test_a_failure_fails_every_caller_with_the_same_error():
    flight, calls = SingleFlight(), []

    def work():
        calls.append(1)
        assert flight.wait_joined(2, TIMEOUT)
        raise ValueError("image 404")

    out = _run_in_threads(flight, "k", work, 3)
    assert len(calls) == 1
    assert all(isinstance(o, ValueError) and str(o) == "image 404" for o in out)
    assert flight.in_flight() == 0
    # forgotten once done: the next call tries again (and may succeed) instead of replaying the failure
    assert flight.run("k", lambda: "ok") == "ok" and flight.leaders == 2


def test_other_keys_and_no_key_never_share():
    flight = SingleFlight()
    b_started = threading.Event()
    results = {}

    def a():  # runs only while b runs too: b must not have waited on a
        assert b_started.wait(TIMEOUT)
        return "a"

    def b():
        b_started.set()
        return "b"

    ta = threading.Thread(target=lambda: results.setdefault("a", flight.run("a", a)))
    ta.start()
    results["b"] = flight.run("b", b)
    ta.join(TIMEOUT)
    assert results == {"a": "a", "b": "b"} and flight.joined == 0
    assert [flight.run(None, lambda: i) for i in range(3)] == [0, 1, 2] and flight.leaders == 5


def test_wait_joined_times_out_when_nobody_joins():
    assert SingleFlight().wait_joined(1, timeout=0.01) is False


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_base_exceptions_release_the_key(exc):
    flight = SingleFlight()

    def boom():
        raise exc()

    with pytest.raises(exc):
        flight.run("k", boom)
    assert flight.in_flight() == 0 and flight.run("k", lambda: 1) == 1


def test_split_gives_every_caller_a_part_of_its_own():
    """A result with one owner per part (a segment name): split once, for every caller of the flight."""
    flight, splits = SingleFlight(), []

    def work():
        assert flight.wait_joined(3, TIMEOUT)
        return "seg"

    def split(result, n):
        splits.append(n)
        return [f"{result}-{i}" for i in range(n)]

    out = _run_in_threads(flight, "k", work, 4, split=split)
    assert splits == [4] and out[0] == "seg-0" and sorted(out) == ["seg-0", "seg-1", "seg-2", "seg-3"]
    assert flight.run("k", lambda: "alone", split=split) == "alone-0" and splits == [4, 1]


def test_a_failed_split_fails_every_caller():
    flight = SingleFlight()

    def work():
        assert flight.wait_joined(2, TIMEOUT)
        return "seg"

    def split(result, n):
        raise OSError("cannot link")

    out = _run_in_threads(flight, "k", work, 3, split=split)
    assert all(isinstance(o, OSError) and str(o) == "cannot link" for o in out) and flight.in_flight() == 0
