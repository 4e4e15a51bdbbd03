"""bench_serving's random, random-ids, generated-shared-prefix, sharegpt and mmmu datasets: SGLang's length rule
(property-tested, r = 0 and r = 1 included), upstream's sharegpt filtering, the local mmmu format, and the
one-line errors for a missing --dataset-path."""

from __future__ import annotations

import argparse
import base64
import io
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from sglang import bench_serving
from sglang.benchmark import datasets as ds


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    from sglang.testing.tokenizer_builder import write_tokenizer_files

    out = tmp_path_factory.mktemp("tok")
    write_tokenizer_files(out)
    return AutoTokenizer.from_pretrained(str(out))


def _ntok(tok, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 5000), m=st.integers(0, 5000),
       r=st.one_of(st.just(0.0), st.just(1.0), st.floats(0.0, 1.0)), seed=st.integers(0, 2**32 - 1))
def test_sglang_length_rule(n, m, r, seed):
    ins, outs = ds.TextLenConfig(n, m, 0, r, "sglang").sample(np.random.default_rng(seed), 50)
    for lens, x in ((ins, n), (outs, m)):
        lo, hi = max(int(max(x, 1) * r), 1), max(x, 1)
        assert ds.sglang_len_range(x, r) == (lo, hi)
        assert all(lo <= v <= hi for v in lens)
        if r == 1.0:
            assert set(lens) == {max(x, 1)}


def test_sglang_rule_spans_the_range_and_rejects_bad_ratios():
    ins, _ = ds.TextLenConfig(10, 10, 0, 0.0, "sglang").sample(np.random.default_rng(0), 2000)
    assert set(ins) == set(range(1, 11))  # r = 0: anything from 1 to n
    ins, _ = ds.TextLenConfig(100, 10, 0, 0.5, "sglang").sample(np.random.default_rng(0), 4000)
    assert (min(ins), max(ins)) == (50, 100)
    for bad in (-0.1, 1.5):
        with pytest.raises(ds.DatasetError, match="--random-range-ratio"):
            ds.TextLenConfig(10, 10, 0, bad, "sglang").sample(np.random.default_rng(0), 1)


def test_random_has_exact_lengths_and_prefix(tok):
    reqs = ds.sample_random(tok, 20, ds.TextLenConfig(30, 7, 4, 0.5, "sglang"), seed=2)
    assert len(reqs) == 20
    for r in reqs:
        assert r.prompt_len == _ntok(tok, r.prompt) and 4 + 15 <= r.prompt_len <= 4 + 30
        assert 3 <= r.output_len <= 7 and not r.images and r.prompt_ids is None
    exact = ds.sample_random(tok, 5, ds.TextLenConfig(30, 7, 0, 1.0, "sglang"), seed=2)
    assert {(r.prompt_len, r.output_len) for r in exact} == {(30, 7)}


def test_random_ids(tok):
    reqs = ds.sample_random_ids(tok, 10, ds.TextLenConfig(25, 6, 3, 1.0, "sglang"), seed=1)
    vocab = set(ds.usable_token_ids(tok).tolist())
    prefixes = {tuple(r.prompt_ids[:3]) for r in reqs}
    assert len(prefixes) == 1
    for r in reqs:
        assert len(r.prompt_ids) == r.prompt_len == 28 and r.output_len == 6
        assert set(r.prompt_ids) <= vocab and r.prompt == tok.decode(r.prompt_ids)


def test_generated_shared_prefix(tok):
    cfg = ds.GSPConfig(num_groups=3, prompts_per_group=4, system_prompt_len=20, question_len=6, output_len=9)
    reqs = ds.sample_generated_shared_prefix(tok, cfg, seed=0)
    assert len(reqs) == 12 and {r.output_len for r in reqs} == {9}
    systems = [r.prompt.split("\n\n")[0] for r in reqs]
    assert len(set(systems)) == 3 and all(systems.count(s) == 4 for s in set(systems))
    assert all(_ntok(tok, s) == 20 for s in systems)
    assert all(r.prompt_len == _ntok(tok, r.prompt) for r in reqs)
    assert systems != sorted(systems, key=systems.index)  # shuffled, not group after group
    with pytest.raises(ds.DatasetError, match="--gsp-num-groups"):
        ds.sample_generated_shared_prefix(tok, ds.GSPConfig(num_groups=0))


def _conv(prompt: str, reply: str, style: str = "sharegpt") -> dict:
    if style == "sharegpt":
        return {"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": reply}]}
    return {"conversation": [{"role": "system", "content": "be brief"}, {"role": "user", "content": prompt},
                             {"role": "assistant", "content": reply}]}


LONG = "the quick brown fox jumps over the lazy dog again and again"


def test_sharegpt_pairs_filters_and_output_override(tok, tmp_path):
    records = [_conv(LONG, LONG), _conv("hi", LONG), _conv(LONG, "ok"), _conv(LONG + " two", LONG, "openai"),
               {"conversations": [{"from": "human", "value": LONG}]}, {"id": 1}]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(records))
    assert ds.sharegpt_pair(records[3]) == (LONG + " two", LONG)  # the first human/user turn and its reply
    reqs = ds.sample_sharegpt(tok, 10, str(path), seed=0)
    assert sorted(r.prompt for r in reqs) == sorted([LONG, LONG + " two"])  # < 4-token prompt/reply skipped
    assert all(r.output_len == _ntok(tok, LONG) and r.prompt_len == _ntok(tok, r.prompt) for r in reqs)
    fixed = ds.sample_sharegpt(tok, 10, str(path), output_len=3, seed=0)
    assert len(fixed) == 3 and {r.output_len for r in fixed} == {3}  # the short reply counts now
    assert len(ds.sample_sharegpt(tok, 2, str(path), output_len=3, seed=0)) == 2
    assert ds.sample_sharegpt(tok, 10, str(path), context_len=_ntok(tok, LONG) * 2, seed=0)[0].prompt == LONG
    jsonl = tmp_path / "sg.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in records))
    assert len(ds.sample_sharegpt(tok, 10, str(jsonl), seed=0)) == 2


def _png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (10, 20, 30)).save(buf, format="PNG")
    return buf.getvalue()


def test_mmmu_local_format(tok, tmp_path):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(_png(8, 6))
    b64 = base64.b64encode(_png(4, 4)).decode()
    records = [
        {"question": "What is shown?", "image": "imgs/a.png", "options": "['cat', 'dog']"},
        {"question": "Compare <image 1> and <image 2>.", "image_1": b64, "image_2": "https://example.com/x.png"},
        {"question": "Count", "images": ["data:image/png;base64," + b64], "options": ["1", "2", "3"]},
    ]
    path = tmp_path / "mmmu.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records))
    reqs = {r.prompt.split("\n")[0]: r for r in ds.sample_mmmu(tok, 5, str(path), output_len=12, seed=0)}
    assert len(reqs) == 3
    first = reqs["Question: What is shown?"]
    assert first.prompt == "Question: What is shown?\nOptions:\nA. cat\nB. dog\n\nAnswer: "
    assert first.images_first and first.output_len == 12 and first.prompt_len == _ntok(tok, first.prompt)
    assert [p["type"] for p in first.content()] == ["image_url", "text"]
    head, data = first.images[0].split(",", 1)
    assert head == "data:image/png;base64" and Image.open(io.BytesIO(base64.b64decode(data))).size == (8, 6)
    second = reqs["Question: Compare <image 1> and <image 2>."]
    assert second.images == ["data:image/png;base64," + b64, "https://example.com/x.png"]
    assert second.prompt.endswith("\n\nAnswer: ") and "Options" not in second.prompt
    assert len(ds.sample_mmmu(tok, 2, str(path), 12, seed=0)) == 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"question": "q", "image": "nope.png"}]))
    with pytest.raises(ds.DatasetError, match="record 0"):
        ds.sample_mmmu(tok, 1, str(bad), 4)
    bad.write_text(json.dumps([{"question": "q"}]))
    with pytest.raises(ds.DatasetError, match="no image"):
        ds.sample_mmmu(tok, 1, str(bad), 4)


@pytest.mark.parametrize("name", ["sharegpt", "mmmu"])
def test_missing_dataset_path_is_one_line_naming_the_flag(tmp_path, capsys, name):
    for extra in ([], ["--dataset-path", str(tmp_path / "absent.json")]):
        # The check comes before any server query: no server runs here.
        with pytest.raises(SystemExit) as e:
            bench_serving.main(["--dataset-name", name, "--port", "1", *extra])
        msg = str(e.value.code)
        assert msg.startswith("--dataset-path") and "\n" not in msg and name in msg, msg
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ds.DatasetError, match="--dataset-path"):
        ds.read_records(str(bad), name)


def test_completions_backends_refuse_image_datasets():
    with pytest.raises(SystemExit, match="--backend sglang or a \\*-chat backend"):
        bench_serving.main(["--backend", "vllm", "--dataset-name", "image", "--port", "1"])


def test_get_dataset_routes_every_name(tok, tmp_path):
    args = bench_serving.build_parser().parse_args([
        "--random-input-len", "12", "--random-output-len", "4", "--random-range-ratio", "1", "--image-count", "1",
        "--image-resolution", "8x8", "--random-mm-bucket-config", "{(8, 8, 1): 1.0}", "--gsp-num-groups", "2",
        "--gsp-prompts-per-group", "2", "--gsp-system-prompt-len", "5", "--gsp-question-len", "3", "--disable-tqdm"])
    sizes = {}
    for name in ("random", "random-ids", "generated-shared-prefix", "image", "random-mm"):
        ratio = 0.0 if name == "random-mm" else 1.0  # vLLM's rule: r = 0 is exact, r = 1 is refused
        ns = argparse.Namespace(**{**vars(args), "dataset_name": name, "random_range_ratio": ratio})
        reqs = ds.get_dataset(ns, tok, 3, 0)
        sizes[name] = (len(reqs), {r.output_len for r in reqs}, {len(r.images) for r in reqs})
    assert sizes == {"random": (3, {4}, {0}), "random-ids": (3, {4}, {0}), "generated-shared-prefix": (4, {256}, {0}),
                     "image": (3, {4}, {1}), "random-mm": (3, {4}, {1})}
    with pytest.raises(ds.DatasetError, match="--random-range-ratio"):
        ds.get_dataset(argparse.Namespace(**{**vars(args), "dataset_name": "random-mm"}), tok, 1, 0)
