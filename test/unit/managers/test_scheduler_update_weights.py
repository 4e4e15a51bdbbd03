"""Weight updates through the scheduler: after load + commit, greedy outputs equal a scheduler started on
the new weights (the prefix cache of the old ones is gone); a missing path, a checkpoint missing tensors,
or another rank's failure leaves the old weights bit for bit; rollback undoes a load that succeeded."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler_utils import InProcessScheduler, model_weights as _weights, same_weights as _same, update_phase as _phase
from sglang.testing.make_model import make_model
from sglang.testing.presets import get_preset

PROMPT = list(range(30, 70))


@pytest.fixture(scope="module")
def paths(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("update_weights")
    p = get_preset("qwen3-vl-tiny")
    wider = replace(p, name="qwen3-vl-tiny-wide", text=replace(p.text, intermediate_size=p.text.intermediate_size * 2))
    return {"old": str(tiny_model_dir("qwen3-vl-tiny")),
            "new": str(make_model("qwen3-vl-tiny", root / "seed1", seed=1, progress=False)),
            "wide": str(make_model(wider, root / "wide", seed=0, progress=False))}


def _greedy(s: InProcessScheduler) -> list[int]:
    rid = s.submit(PROMPT, max_new_tokens=8, ignore_eos=True)
    s.run_until_idle()
    return s.outputs[rid]


def test_update_matches_a_fresh_scheduler_and_failures_keep_the_old_weights(paths, monkeypatch):
    s = InProcessScheduler(paths["old"])
    old_out, old_w = _greedy(s), _weights(s)
    assert s.sched.tree.total_size() > 0  # the prompt's KV is cached

    for bad in ("/nonexistent/model", paths["wide"]):  # no such path; every MLP of another shape
        reply = _phase(s, "load", bad)
        assert not reply.success and reply.message.startswith("Failed to update weights: "), reply.message
        assert _same(_weights(s), old_w)
    assert "/nonexistent/model" in _phase(s, "load", "/nonexistent/model").message

    # this rank loads, another rank of the replica fails: this one goes back too
    monkeypatch.setattr(s.sched, "_gather_errors", lambda e: [e, "OSError: disk gone"])
    reply = _phase(s, "load", paths["new"])
    assert not reply.success and "OSError: disk gone" in reply.message
    assert _same(_weights(s), old_w)
    monkeypatch.undo()

    # every replica loaded, another failed: rollback
    assert _phase(s, "load", paths["new"]).success
    assert not _same(_weights(s), old_w)
    assert _phase(s, "rollback").success
    assert _same(_weights(s), old_w) and _greedy(s) == old_out

    reply = _phase(s, "load", paths["new"])
    assert reply.success and reply.message == f"Succeeded to update model weights from {paths['new']}."
    assert _phase(s, "commit").success
    assert s.sched.tree.total_size() == 0  # flushed: no KV of the old weights is reused
    new_out = _greedy(s)
    fresh = InProcessScheduler(paths["new"])
    assert new_out == _greedy(fresh) and new_out != old_out
    assert _same(_weights(s), _weights(fresh))
    s.assert_no_leak()


def test_a_running_request_whose_abort_arrived_first_does_not_block_the_load(paths):
    s = InProcessScheduler(paths["old"])
    rid = s.submit(PROMPT, max_new_tokens=50, ignore_eos=True)
    s.step()  # prefilled: running
    assert s.sched.running
    s.sched.handle_abort(rid, "aborted by client")  # the client left: the abort precedes the update
    assert _phase(s, "load", paths["new"]).success
    assert _phase(s, "commit").success
    s.run_until_idle()
    assert s.finished[rid].type == "abort"
    s.assert_no_leak()
