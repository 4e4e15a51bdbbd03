"""The launched server with --tp-size 2 --enable-vit-ulysses-sp (gloo on CPU): the vision tower runs
with replicated weights and split tokens, and greedy answers equal transformers' for one and several
images; start-up logs the replicated weight memory."""

from __future__ import annotations

import pytest
import requests

from conftest import CASES, build_case, data_url, png_bytes

MAX_NEW = 8


@pytest.fixture(scope="module")
def ulysses_server(launch_server):
    return launch_server("--tp-size", "2", "--enable-vit-ulysses-sp", "--log-level", "info")  # info: the memory line


@pytest.mark.parametrize("case", ["one_image", "three_images_mixed_sizes"])
def test_ulysses_tp2_matches_transformers(ulysses_server, hf_ref, case):
    _, tmpl, images = build_case(CASES[case])
    r = requests.post(ulysses_server.url + "/generate", timeout=120, json={
        "text": hf_ref.render(tmpl),
        "image_data": [data_url(png_bytes(img)) for img in images],
        "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0},
    })
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == hf_ref.greedy(case, tmpl, images, MAX_NEW)


def test_start_up_logs_replicated_memory(ulysses_server):
    log = ulysses_server.log_path.read_text(errors="replace")
    assert log.count("vit-ulysses-sp: vision tower weights replicated on each of 2 ranks") == 2, log[-3000:]
