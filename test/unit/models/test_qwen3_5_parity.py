"""Our Qwen3.5 against transformers on the same random weights (float32), through the standalone driver
(qwen3_5_driver.py: per-request DeltaNet states, a list KV cache for the full-attention layer): prompt
logits within 1e-4 relative error, decode-step logits and greedy tokens equal to transformers', for
text and for an image; a prefill cut into chunks (states carried) equal to one shot; a batch of two
equal to each request alone."""

from __future__ import annotations

import pytest
import torch

from qwen3_5_driver import Qwen3_5Driver, prompt as _prompt, ref_kwargs as _ref_kwargs, tiny_processor
from sglang.srt.model_loader.loader import get_model

transformers = pytest.importorskip("transformers")

TOL = 1e-4


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    path = str(tiny_model_dir("qwen3.5-tiny"))
    transformers.logging.set_verbosity_error()
    ref = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    ours = get_model(path, dtype="float32")
    return ref, ours, tiny_processor()  # Qwen3.5 places images as Qwen3-VL does; only the token ids differ


def _ref_logits(ref, ids, mm) -> torch.Tensor:
    with torch.no_grad():
        return ref(**_ref_kwargs(ids, mm)).logits[0]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("kind", ["text", "image"])
def test_prompt_logits_match_transformers(setup, kind):
    ref, ours, proc = setup
    ids, mm = _prompt(kind, proc)
    if mm is not None:  # the image's tokens sit at distinct (t, h, w): the M-RoPE rows differ
        pos = mm.mrope_positions[:, mm.mm_items[0].offsets[0][0]:mm.mm_items[0].offsets[0][1]]
        assert not torch.equal(pos[1], pos[2]) and not torch.equal(pos[0], pos[1])
    driver = Qwen3_5Driver(ours)
    driver.add("r", ids, mm)
    got = driver.prefill("r")
    want = _ref_logits(ref, ids, mm)
    assert got.shape == want.shape
    assert _rel(got, want) <= TOL


@pytest.mark.parametrize("kind", ["text", "image"])
def test_decode_steps_match_transformers(setup, kind):
    """Greedy tokens equal transformers' generate; each step's logits equal transformers' one-shot
    forward over the prompt and the tokens so far (so the carried states are right at every step)."""
    ref, ours, proc = setup
    ids, mm = _prompt(kind, proc, seed=3)
    driver = Qwen3_5Driver(ours)
    driver.add("r", ids, mm)
    tokens, step_logits = driver.greedy("r", 6)
    kw = _ref_kwargs(ids, mm)
    with torch.no_grad():
        out = ref.generate(**kw, attention_mask=torch.ones_like(kw["input_ids"]), max_new_tokens=6, min_new_tokens=6,
                           do_sample=False)
    assert tokens == out[0, len(ids):].tolist()
    want = _ref_logits(ref, out[0, :-1].tolist(), mm)[len(ids) - 1:]
    for step, (got, row) in enumerate(zip(step_logits, want)):
        assert _rel(got, row) <= TOL, step


@pytest.mark.parametrize("kind,chunks", [("text", 37), ("text", [1, 1, 2, 1, 50]), ("image", 7)])
def test_chunked_prefill_equals_one_shot(setup, kind, chunks):
    """37: the DeltaNet's own 64-token chunks fall elsewhere; one-token chunks take the recurrent path
    mid-prompt; 7 cuts the image."""
    ref, ours, proc = setup
    ids, mm = _prompt(kind, proc, seed=5)
    driver = Qwen3_5Driver(ours)
    driver.add("one", ids, mm)
    driver.add("cut", ids, mm)
    whole, cut = driver.prefill("one"), driver.prefill("cut", chunks)
    assert _rel(cut, whole) <= TOL
    assert _rel(cut, _ref_logits(ref, ids, mm)) <= TOL
    one, split = driver.state("one"), driver.state("cut")
    # the carried states too (deeper layers' inputs carry the rounding of the ones before)
    assert torch.allclose(split.recurrent, one.recurrent, rtol=1e-4, atol=1e-4)
    assert torch.allclose(split.conv, one.conv, rtol=1e-4, atol=1e-4)


def test_batch_of_two_equals_each_alone(setup):
    ref, ours, proc = setup
    a, b = _prompt("text", proc, seed=7), _prompt("image", proc, seed=8)
    driver = Qwen3_5Driver(ours)
    driver.add("a", *a)
    driver.add("b", *b)
    rows = driver.extend({"a": len(a[0]), "b": len(b[0])}).full_logits
    assert _rel(rows[:len(a[0])], _ref_logits(ref, *a)) <= TOL
    assert _rel(rows[len(a[0]):], _ref_logits(ref, *b)) <= TOL
    nxt = {"a": int(rows[len(a[0]) - 1].argmax()), "b": int(rows[-1].argmax())}
    step = driver.decode(nxt)  # one decode batch over both requests' states
    for i, (rid, (ids, mm)) in enumerate(zip("ab", (a, b))):
        assert _rel(step[i], _ref_logits(ref, ids + [nxt[rid]], mm)[-1]) <= TOL


def test_transformers_save_layout_loads_to_the_same_logits(setup, tmp_path):
    """A transformers 5 save (no MTP head) loads as the released layout does."""
    ref, ours, proc = setup
    ref.save_pretrained(tmp_path)
    ids, mm = _prompt("text", proc, seed=9)
    logits = []
    for model in (ours, get_model(str(tmp_path), dtype="float32")):
        driver = Qwen3_5Driver(model)
        driver.add("r", ids, mm)
        logits.append(driver.prefill("r"))
    assert torch.equal(logits[0], logits[1])
