"""Custom logit processors through the scheduler: in one batch, requests with a processor get the forced
token (greedy and sampled), a request without one gets what it gets alone, and a processor that raises
ends only its own request with the reason."""

from __future__ import annotations

import itertools

import pytest

from scheduler_utils import InProcessScheduler
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor
from sglang.srt.sampling.sampling_params import SamplingParams

_FORCE = """
class ForceToken(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list):
        for i, params in enumerate(custom_param_list):
            assert params["__req__"].origin_input_ids  # upstream's processors read the request
            logits[i, :] = -float("inf")
            logits[i, params["token_id"]] = 0.0
        return logits
"""

_BOOM = """
class Boom(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list):
        raise RuntimeError("boom")
"""

_ids = itertools.count()


def _processor(source: str) -> str:
    ns = {"__name__": "__main__", "CustomLogitProcessor": CustomLogitProcessor}
    exec(source, ns)  # a client script's __main__ class: pickled by value
    return next(v for k, v in ns.items() if isinstance(v, type) and k != "CustomLogitProcessor").to_str()


@pytest.fixture(scope="module")
def path(tiny_model_dir):
    return str(tiny_model_dir("qwen3-vl-tiny"))


def _submit(s: InProcessScheduler, prompt, processor=None, **sp) -> str:
    rid = f"clp{next(_ids)}"
    sp.setdefault("temperature", 0.0)
    msg = TokenizedGenerateReqInput(rid, list(prompt), SamplingParams(max_new_tokens=6, ignore_eos=True, **sp),
                                    custom_logit_processor=processor)
    s.sched.process_input_requests([msg])
    s.outputs[rid] = []
    return rid


def test_mixed_batch(path):
    prompt = list(range(20, 44))
    alone = InProcessScheduler(path, enable_custom_logit_processor=True)
    plain = _submit(alone, prompt)
    alone.run_until_idle()

    s = InProcessScheduler(path, enable_custom_logit_processor=True)
    force = _processor(_FORCE)
    rids = {
        "plain": _submit(s, prompt),
        "greedy": _submit(s, prompt, force, custom_params={"token_id": 7}),
        "sampled": _submit(s, prompt, force, temperature=1.0, seed=3, custom_params={"token_id": 9}),
        "other": _submit(s, prompt[:10], force, temperature=0.8, custom_params={"token_id": 11}),
        "boom": _submit(s, prompt, _processor(_BOOM)),
    }
    s.run_until_idle()
    s.assert_no_leak()
    out = {k: s.outputs[r] for k, r in rids.items()}
    assert out["plain"] == alone.outputs[plain]
    assert out["greedy"] == [7] * 6 and out["sampled"] == [9] * 6 and out["other"] == [11] * 6
    boom = s.finished[rids["boom"]]
    assert boom.type == "abort" and boom.status_code == 400
    assert "custom_logit_processor failed: RuntimeError: boom" in boom.message
    assert s.outputs[rids["boom"]] == []  # ended at its first step: no token sampled from unprocessed logits
    assert all(s.finished[rids[k]].type == "length" for k in ("plain", "greedy", "sampled", "other"))
