"""benchmark/performance/step_counter.py: the bytecode counter is exact (the same work gives the same count,
more work a larger one, in proportion), leaves excluded code and everything it calls out, and refuses to
clobber another tracer; the perf_event_open counter refuses in one line naming the errno where the event
cannot be opened, and its ctypes plumbing counts (checked on a software event, present without a PMU)."""

from __future__ import annotations

import errno
import importlib.util
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def sc():
    spec = importlib.util.spec_from_file_location("step_counter", REPO / "benchmark/performance/step_counter.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _loop(n: int) -> int:
    s = 0
    for i in range(n):
        s += i
    return s


def _calls_loop(n: int) -> int:
    return _loop(n) + 1


def _raises() -> None:
    _loop(10)
    raise ValueError("out of an excluded frame by an exception")


def _count(sc, fn, *args, **kw) -> int:
    c = sc.BytecodeCounter(**kw)
    c.start()
    try:
        fn(*args)
    finally:
        c.stop()
    return c.count


def test_bytecode_count_is_exact_and_grows_with_work(sc):
    counts = [_count(sc, _loop, n) for n in (100, 200, 300)]
    assert counts == [_count(sc, _loop, n) for n in (100, 200, 300)]  # repeatable to the instruction
    assert 0 < counts[0] < counts[1] < counts[2]
    assert counts[1] - counts[0] == counts[2] - counts[1] > 100  # the same per iteration: linear in n


def test_an_empty_span_counts_nothing_and_the_caller_is_not_traced(sc):
    c = sc.BytecodeCounter()
    c.start()
    c.stop()
    assert c.count == 0
    c.start()
    x = sum(range(10))  # runs in this (untraced) frame: a span measures the calls made inside it
    c.stop()
    assert x == 45 and c.count == 0


def test_excluded_code_and_what_it_calls_add_nothing(sc):
    whole = _count(sc, _calls_loop, 1000)
    without_loop = _count(sc, _calls_loop, 1000, exclude=[_loop.__code__])
    assert without_loop == _count(sc, _calls_loop, 1, exclude=[_loop.__code__])  # independent of the loop's work
    assert 0 < without_loop < 20 < whole
    assert _count(sc, _calls_loop, 1000, exclude=[_calls_loop.__code__]) == 0  # the callee inside it too


def test_counting_resumes_after_an_excluded_frame_ends_by_an_exception(sc):
    def body():
        try:
            _raises()
        except ValueError:
            pass
        return _loop(50)

    assert _count(sc, body, exclude=[_raises.__code__]) > _count(sc, _loop, 50)


def test_the_breakdown_by_code_object_adds_up(sc):
    c = sc.BytecodeCounter(by_code=True)
    c.start()
    _calls_loop(100)
    c.stop()
    top = c.top(5)
    assert sum(k for _, k in top) == c.count
    assert top[0][0].endswith("_loop") and top[0][1] > top[1][1]


def test_it_refuses_to_replace_another_tracer(sc):
    def other(frame, event, arg):
        return None

    previous = sys.gettrace()
    sys.settrace(other)
    try:
        with pytest.raises(sc.CounterUnavailable, match="another trace function"):
            sc.BytecodeCounter().start()
        assert sys.gettrace() is other
    finally:
        sys.settrace(previous)


@pytest.mark.parametrize("err, words", [(errno.ENOENT, "no hardware PMU"), (errno.EACCES, "perf_event_paranoid"),
                                        (errno.ENOSYS, "no perf_event_open")])
def test_the_instruction_counter_refuses_in_one_line_naming_the_errno(sc, err, words):
    with pytest.raises(sc.CounterUnavailable) as e:
        sc.PerfCounter(syscall=lambda nr, attr: (-1, err))
    msg = str(e.value)
    assert "\n" not in msg and errno.errorcode[err] in msg and words in msg and "--counter bytecodes" in msg


def test_the_attr_asks_for_user_space_of_this_thread_only(sc):
    seen = {}

    def fake(nr, attr):
        seen.update(type=attr.type, config=attr.config, flags=attr.flags, size=attr.size)
        return -1, errno.ENOENT

    with pytest.raises(sc.CounterUnavailable):
        sc.PerfCounter(syscall=fake)  # the defaults: the instruction counter
    assert seen["type"] == 0 and seen["config"] == 1 and seen["size"] == 112
    assert seen["flags"] == (1 << 5) | (1 << 6)  # exclude_kernel, exclude_hv; not disabled, not inherited


def test_the_hardware_counter_here_counts_or_refuses_cleanly(sc):
    """This machine either has a PMU (the count grows with work) or refuses in one line (a VM without one)."""
    try:
        c = sc.instruction_counter()
    except sc.CounterUnavailable as e:
        assert "\n" not in str(e) and "perf_event_open" in str(e)
        return
    try:
        a = c.read()
        _loop(1000)
        small = c.read() - a
        a = c.read()
        _loop(100_000)
        assert c.read() - a > 10 * small > 0
    finally:
        c.close()


def test_the_perf_plumbing_counts_a_software_event(sc):
    try:
        c = sc.PerfCounter(sc.PERF_TYPE_SOFTWARE, sc.PERF_COUNT_SW_TASK_CLOCK, "task-clock")
    except sc.CounterUnavailable as e:
        pytest.skip(str(e))
    try:
        a = c.read()
        _loop(200_000)
        assert c.read() - a > 0  # nanoseconds this thread ran
        assert c.thread_id == threading.get_ident()
    finally:
        c.close()
    assert c.fd == -1
