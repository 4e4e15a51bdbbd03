"""benchmark/multimodal/bench_frontend.py on a few chats: every mode's summary row is complete and its counts
add up (each image either processed or taken from another's flight; unique images are all processed), the
compact mode really sends one frame, nothing prepared is left in the manager, and with a preprocessing worker
the pixel work is counted in the worker, not in the main process."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_frontend", REPO / "benchmark/multimodal/bench_frontend.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_modes_report_cpu_per_image_and_counts_that_add_up(bench, tiny_model_dir):
    model = bench.model_copy(str(tiny_model_dir("qwen3-vl-tiny")))
    urls = [bench.jpeg_data_url(s) for s in range(4)]
    rows = {m: bench.run_mode(model, m, urls[:1], urls[1:], concurrency=2) for m in bench.MODES}
    for mode, row in rows.items():
        assert row["images"] == 3 and row["main_process_cpu_s"] > 0 and row["cpu_ms_per_image"] > 0, row
        assert row["images_processed"] + row["images_shared"] == 3, row
        assert row["latency_ms_p50"] <= row["latency_ms_p99"]
    assert rows["unique"]["images_processed"] == rows["compact"]["images_processed"] == 3


def test_the_compact_mode_builds_one_frame_per_image(bench, tiny_model_dir):
    tm = bench.make_manager(bench.model_copy(str(tiny_model_dir("qwen3-vl-tiny"))), compact=True)
    try:
        assert tm.builder.processor.compact_still_images is True
    finally:
        tm.builder.close()
        tm._request_pool.shutdown(wait=False)


def test_with_a_worker_the_pixel_work_leaves_the_main_process(bench, tiny_model_dir):
    """--workers 1: the images are processed in the worker process, whose CPU is reported apart and outweighs
    what the tokenizer manager's process spends on the same chats."""
    model = bench.model_copy(str(tiny_model_dir("qwen3-vl-tiny")))
    urls = [bench.jpeg_data_url(s) for s in range(4)]
    row = bench.run_mode(model, "unique", urls[:1], urls[1:], concurrency=2, workers=1)
    assert row["workers"] == 1 and row["images_processed"] == 3, row
    assert len(row["worker_cpu_s"]) == 1 and row["worker_cpu_s"][0] > row["main_process_cpu_s"] > 0, row
