"""Custom logit processors against the rest of the server (docs/reliability.md, "Client code: custom logit
processors"), with --enable-custom-logit-processor: SystemExit, KeyboardInterrupt and GeneratorExit raised
while unpickling, in `__init__` (at admission or in the scheduler) or in `__call__` end only their own
request with a 400 naming them while a request beside them finishes; a slow unpickle or `__init__` is a 400
at the load limit while /health answers; a `__call__` that never returns is a 400 at the step limit while
another request is served. (SystemExit in `__call__` had ended the scheduler and the server; a slow
`__init__` froze the event loop; a slow `__call__` stalled every request for as long as it ran.)"""

from __future__ import annotations

import json
import threading

import pytest
import requests

from conftest import wait_until
from hostile import HOSTILE_TIMEOUT_S, beside_ordinary, health_latency, running_requests
from sglang.srt.sampling.custom_logit_processor import CALL_TIMEOUT_S, LOAD_TIMEOUT_S, CustomLogitProcessor

EXCEPTIONS = ("SystemExit", "KeyboardInterrupt", "GeneratorExit")
_RAISE = {
    "call": """
class RaiseInCall{exc}(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list):
        raise {exc}("from __call__")
""",
    # passes the admission check, raises in the scheduler (whose processes are named sglang-sched<rank>)
    "scheduler_init": """
class RaiseInSchedulerInit{exc}(CustomLogitProcessor):
    def __init__(self):
        import multiprocessing
        if multiprocessing.current_process().name.startswith("sglang-sched"):
            raise {exc}("from __init__")

    def __call__(self, logits, custom_param_list):
        return logits
""",
    "init": """
class RaiseInInit{exc}(CustomLogitProcessor):
    def __init__(self):
        raise {exc}("from __init__")
""",
    "unpickle": """
def _explode():
    raise {exc}("from unpickling")


class _Trap:
    def __reduce__(self):
        return (_explode, ())


class RaiseInUnpickle{exc}(CustomLogitProcessor):
    trap = _Trap()
""",
}
# far past every limit: these never return while the test runs (their threads are daemons)
_SLOW = {
    "init": """
class SlowInit(CustomLogitProcessor):
    def __init__(self):
        import time
        time.sleep(600)
""",
    "unpickle": """
import time


class _Sleep:
    def __reduce__(self):
        return (time.sleep, (600,))


class SlowUnpickle(CustomLogitProcessor):
    nap = _Sleep()
""",
    "call": """
class HangInCall(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list):
        import time
        time.sleep(600)
        return logits
""",
}


def _processor(source: str, **fmt) -> str:
    ns = {"__name__": "__main__", "CustomLogitProcessor": CustomLogitProcessor}
    exec(source.format(**fmt), ns)  # a client script's __main__ class: dill pickles it by value
    return next(v for k, v in ns.items() if isinstance(v, type) and issubclass(v, CustomLogitProcessor)
                and v is not CustomLogitProcessor).to_str()


@pytest.fixture(scope="module")
def clp_server(launch_server):
    s = launch_server("--enable-custom-logit-processor")
    yield s
    s.close()


def _generate(url: str, processor: str | None = None, **sp) -> requests.Response:
    body = {"text": "Hello there", "sampling_params": {"max_new_tokens": 4, "temperature": 0, **sp}}
    if processor is not None:
        body["custom_logit_processor"] = processor
    return requests.post(url + "/generate", json=body, timeout=HOSTILE_TIMEOUT_S)


class _Neighbour:
    """A streamed request that runs while the hostile ones are sent; its last chunk once it ends."""

    def __init__(self, url: str, max_new_tokens: int):
        self.started, self.last, self.error = threading.Event(), None, None
        body = {"text": "Once upon a time", "stream": True,
                "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}}
        self._thread = threading.Thread(target=self._run, args=(url, body), daemon=True)
        self._thread.start()

    def _run(self, url: str, body: dict) -> None:
        try:
            with requests.post(url + "/generate", json=body, stream=True, timeout=HOSTILE_TIMEOUT_S) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if line.startswith(b"data: ") and line != b"data: [DONE]":
                        self.last = json.loads(line[6:])
                        self.started.set()
        except Exception as e:  # reported by finish()
            self.error = e
        finally:
            self.started.set()

    def finish(self) -> dict:
        self._thread.join(HOSTILE_TIMEOUT_S)
        assert not self._thread.is_alive() and self.error is None, self.error
        return self.last


def test_base_exceptions_end_only_their_request_and_the_server_serves_on(clp_server):
    url = clp_server.url
    neighbour = _Neighbour(url, 256)
    assert neighbour.started.wait(HOSTILE_TIMEOUT_S)  # its first chunk: it is running
    for where, source in _RAISE.items():
        for exc in EXCEPTIONS:
            r = _generate(url, _processor(source, exc=exc))
            assert r.status_code == 400, (where, exc, r.text)
            message = r.json()["error"]["message"]
            assert "custom_logit_processor" in message and exc in message, (where, message)
    last = neighbour.finish()
    assert last["meta_info"]["finish_reason"]["type"] == "length"
    assert last["meta_info"]["completion_tokens"] == 256
    assert clp_server.proc.poll() is None
    assert _generate(url).status_code == 200
    health_latency(url)


@pytest.mark.parametrize("where", ["init", "unpickle"])
def test_a_slow_load_is_a_400_at_the_limit_and_the_event_loop_answers_meanwhile(clp_server, where):
    processor = _processor(_SLOW[where])
    r, worst = beside_ordinary(clp_server.url, lambda: _generate(clp_server.url, processor))
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "invalid custom_logit_processor" in message and f"{LOAD_TIMEOUT_S:g} s" in message
    again = _generate(clp_server.url, processor)  # its first load still runs: refused without waiting again
    assert again.status_code == 400 and "still unpickling or in __init__" in again.json()["error"]["message"]


def test_a_call_that_never_returns_is_a_400_at_the_step_limit_and_others_are_served(clp_server):
    url = clp_server.url
    processor = _processor(_SLOW["call"])
    r, worst = beside_ordinary(url, lambda: _generate(url, processor), in_flight=lambda: running_requests(url) > 0)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert f"longer than {CALL_TIMEOUT_S:g} s, the limit for one decoding step" in message
    again = _generate(url, processor)  # the first call still runs: ended at its first step, never called
    assert again.status_code == 400 and "has not returned" in again.json()["error"]["message"]
    wait_until(lambda: running_requests(url) == 0, HOSTILE_TIMEOUT_S, what="the scheduler to be idle")
    assert _generate(url).status_code == 200
