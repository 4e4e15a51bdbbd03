"""Custom logit processors: upstream's wire form round-trips (also into a process that never saw the
class), malformed strings are refused with the reason, processors run once per distinct string on their
own rows, and one that fails leaves its rows alone and is reported for its requests only."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.errors import GenerateError
from sglang.srt.managers.request_validation import check_custom_logit_processor
from sglang.srt.sampling.custom_logit_processor import (
    CustomLogitProcessor,
    CustomLogitProcessorError,
    apply_custom_logit_processors,
    checked_processor,
)
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs


_FORCE = """
class ForceToken(CustomLogitProcessor):
    calls = []

    def __call__(self, logits, custom_param_list):
        ForceToken.calls.append(len(custom_param_list))
        for i, params in enumerate(custom_param_list):
            logits[i, :] = -float("inf")
            logits[i, params["token_id"]] = 0.0
        return logits
"""

_BOOM = """
class Boom(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list):
        raise RuntimeError("boom")
"""


def _main_class(source: str) -> type:
    """The class as a client script's `__main__` defines it: dill pickles it (and its methods) by value."""
    ns = {"__name__": "__main__", "CustomLogitProcessor": CustomLogitProcessor}
    exec(source, ns)
    return next(v for k, v in ns.items() if isinstance(v, type) and k != "CustomLogitProcessor")


def _force_class():
    return _main_class(_FORCE)


def _raising_class():
    return _main_class(_BOOM)


def _req(processor, **custom):
    return SimpleNamespace(custom_logit_processor=processor,
                           sampling_params=SamplingParams(custom_params=custom or None), output_ids=[3])


def test_round_trip_in_a_fresh_process():
    text = _force_class().to_str()
    assert set(json.loads(text)) == {"callable"}  # upstream's form
    code = ("import sys, torch; from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor as C; "
            "p = C.from_str(sys.argv[1]); print(p(torch.zeros(1, 8), [{'token_id': 5}]).argmax().item())")
    out = subprocess.run([sys.executable, "-c", code, text], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "5"


@pytest.mark.parametrize("bad, reason", [
    ("not json", "not JSON"),
    (json.dumps({"fn": "00"}), '{"callable": "<hex>"}'),
    (json.dumps({"callable": "zz"}), "not a hex string"),
    (json.dumps({"callable": "8004deadbeef"}), "cannot unpickle"),
    (json.dumps({"callable": __import__("pickle").dumps(42).hex()}), "not a processor class"),
    (7, "got int"),
])
def test_malformed_strings_are_refused_with_the_reason(bad, reason):
    with pytest.raises(CustomLogitProcessorError, match=None) as e:
        checked_processor(bad)
    assert reason in str(e.value)


def test_request_check_names_the_flag_and_the_problem():
    text = _force_class().to_str()
    with pytest.raises(GenerateError, match="--enable-custom-logit-processor"):
        check_custom_logit_processor(text, ServerArgs())
    on = ServerArgs(enable_custom_logit_processor=True)
    assert check_custom_logit_processor(text, on) == text
    assert check_custom_logit_processor(None, ServerArgs()) is None
    with pytest.raises(GenerateError, match="invalid custom_logit_processor: not JSON"):
        check_custom_logit_processor("{", on)


def test_groups_run_once_on_their_rows_and_skip_dropped_rows():
    text = _force_class().to_str()
    other = _main_class(_FORCE.replace("ForceToken", "ForceOther")).to_str()  # another class: another group
    assert other != text
    reqs = [_req(text, token_id=1), _req(None), _req(text, token_id=2), _req(other, token_id=4), _req(text, token_id=6)]
    logits = torch.randn(5, 8)
    before = logits.clone()
    failed = apply_custom_logit_processors(logits, reqs, skip={4})
    assert failed == []
    assert logits.argmax(-1).tolist()[:4] == [1, before[1].argmax().item(), 2, 4]
    assert torch.equal(logits[1], before[1]) and torch.equal(logits[4], before[4])
    # rows 0 and 2 in one call (the class the server unpickled, cached by string); the other class separately
    assert type(CustomLogitProcessor.from_str(text)).calls == [2]


def test_a_failing_processor_ends_only_its_requests():
    boom, force = _raising_class().to_str(), _force_class().to_str()
    reqs = [_req(boom), _req(force, token_id=3), _req(boom)]
    logits = torch.randn(3, 8)
    before = logits.clone()
    failed = apply_custom_logit_processors(logits, reqs)
    assert [(row, status) for row, _, status in failed] == [(0, 400), (2, 400)]
    assert "custom_logit_processor failed: RuntimeError: boom" in failed[0][1]
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    assert logits[1].argmax().item() == 3


def test_custom_params_must_be_an_object():
    with pytest.raises(ValueError, match="custom_params must be an object"):
        SamplingParams(custom_params=[1]).verify()
