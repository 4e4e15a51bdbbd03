"""Compile threads: a compile past the time limit fails at once and gives its place back while its thread
runs on; the limit counts from a compile's own start, so one queued behind slow compiles still gets its
full time; the overrun thread's late result is dropped."""

from __future__ import annotations

import threading

import pytest

from sglang.srt.constrained.compile_threads import CompileThreads, GrammarCompileTimeout


def test_an_overrun_gives_its_place_to_the_next_compile():
    gate = threading.Event()
    prepared = []
    threads = CompileThreads(1, timeout_s=1.0, prepare=lambda: prepared.append(1))

    def compile_fn(arg):
        if arg == "slow":
            gate.wait(60)
        return arg.upper()

    try:
        slow = threads.submit(compile_fn, "slow", what="regex")
        quick = threads.submit(compile_fn, "quick")  # queued: the only place is taken
        with pytest.raises(GrammarCompileTimeout) as e:
            slow.result(60)
        assert str(e.value) == "the regex did not compile within 1 s (SGLANG_GRAMMAR_COMPILE_TIMEOUT_S); simplify it"
        # the slow compile still runs (gate closed), yet the queued one got the place and its own full time
        assert quick.result(60) == "QUICK" and not gate.is_set()
        assert threads.stats() == {"compiling": 0, "queued": 0, "overrunning": 1, "overruns": 1}
        gate.set()
        again = threads.submit(compile_fn, "later")
        assert again.result(60) == "LATER"
        assert isinstance(slow.exception(), GrammarCompileTimeout)  # its late result was dropped
        assert len(prepared) == 3
    finally:
        gate.set()
        threads.close()


def test_errors_reach_the_future_and_close_cancels_the_queue():
    gate = threading.Event()
    threads = CompileThreads(1, timeout_s=60)

    def compile_fn(arg):
        gate.wait(60)
        raise OSError(arg)

    running = threads.submit(compile_fn, "a")
    queued = threads.submit(compile_fn, "b")
    threads.close()
    assert queued.cancelled()
    gate.set()
    with pytest.raises(OSError, match="a"):
        running.result(60)
    with pytest.raises(RuntimeError, match="closed"):
        threads.submit(compile_fn, "c")
