"""sglang.tuning.trace: the --trace JSONL format -> requests and send offsets."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from sglang.benchmark.datasets import DatasetError
from sglang.tuning.trace import load_trace


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    from sglang.testing.tokenizer_builder import write_tokenizer_files

    out = tmp_path_factory.mktemp("tok")
    write_tokenizer_files(out)
    return AutoTokenizer.from_pretrained(str(out))


def write(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_records_become_requests_at_their_offsets(tmp_path, tok):
    (tmp_path / "img").mkdir()
    Image.new("RGB", (32, 24), (200, 10, 10)).save(tmp_path / "img" / "a.png")
    trace = write(tmp_path / "t.jsonl", [
        "# recorded 2025-01-01",
        {"timestamp": 101.5, "input_len": 20, "output_len": 4, "images": ["img/a.png", "https://x.test/b.jpg"],
         "images_first": False},
        "",
        {"timestamp": 100.0, "prompt": "What is this?", "images": ["img/a.png"], "output_len": 8},
        {"timestamp": 100.5, "prompt": "Hi", "output_len": 1},
    ])
    t = load_trace(trace, tok, time_scale=0.5)
    assert np.allclose(t.offsets, [0.0, 0.25, 0.75])
    first, second, third = t.requests
    assert first.prompt == "What is this?" and first.output_len == 8 and first.images_first
    assert first.prompt_len == len(tok.encode("What is this?", add_special_tokens=False))
    assert first.images[0].startswith("data:image/png;base64,")
    assert second.images == [] and second.output_len == 1
    assert third.prompt_len == 20 and not third.images_first
    assert third.images[0] is first.images[0]  # one file, read once, the same bytes every time
    assert third.images[1] == "https://x.test/b.jpg"


@pytest.mark.parametrize("row, message", [
    ('{"timestamp": 1, "prompt": "x"', "line 1: not JSON"),
    ({"prompt": "x", "output_len": 1}, "missing 'timestamp'"),
    ({"timestamp": 0, "prompt": "x"}, "missing 'output_len'"),
    ({"timestamp": 0, "prompt": "x", "output_len": 0}, "output_len must be >= 1"),
    ({"timestamp": 0, "output_len": 3}, "give 'prompt' or 'input_len'"),
    ({"timestamp": "0", "prompt": "x", "output_len": 3}, "'timestamp' must be float"),
    ({"timestamp": 0, "prompt": "x", "output_len": True}, "'output_len' must be int"),
    ({"timestamp": 0, "prompt": "x", "output_len": 3, "images": ["nope.png"]}, "neither a file, a URL nor base64"),
])
def test_bad_records_name_their_line(tmp_path, tok, row, message):
    with pytest.raises(DatasetError, match=message):
        load_trace(write(tmp_path / "bad.jsonl", [row]), tok)


def test_missing_or_empty_trace(tmp_path, tok):
    with pytest.raises(DatasetError, match="no such file"):
        load_trace(tmp_path / "none.jsonl", tok)
    with pytest.raises(DatasetError, match="no requests"):
        load_trace(write(tmp_path / "empty.jsonl", ["# nothing"]), tok)
