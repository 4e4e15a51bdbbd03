"""How many preprocessing workers a server gets (`multimodal/mm_worker_plan.py`, `server_args_checks`): asked
for, that many; unset, the measured default (one per two CPUs, 1 to 4) where the shared-memory transport runs
and none where it does not; asked for where it does not run, start-up refuses by name; out-of-range counts
are refused; the spec the workers build from carries the switches read here."""

from __future__ import annotations

import pytest

from sglang.srt.multimodal.mm_worker_plan import default_worker_num, worker_plan
from sglang.srt.multimodal.processor_spec import ProcessorSpec
from sglang.srt.server_args import ServerArgs


def test_the_default_count_follows_the_cpus():
    assert [default_worker_num(c) for c in (1, 2, 3, 4, 8, 64)] == [1, 1, 1, 2, 4, 4]


def test_asked_for_unset_and_zero(monkeypatch):
    monkeypatch.delenv("SGLANG_MM_SHM_TRANSPORT", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert worker_plan(ServerArgs(mm_processor_worker_num=3))[0] == 3
    assert worker_plan(ServerArgs(mm_processor_worker_num=0))[0] == 0
    n, why = worker_plan(ServerArgs())
    assert n == 4 and "8 CPU" in why


def test_unset_resolves_to_none_without_shared_memory(monkeypatch):
    monkeypatch.setenv("SGLANG_MM_SHM_TRANSPORT", "0")
    n, why = worker_plan(ServerArgs())
    assert n == 0 and "shared-memory" in why


def test_asking_for_workers_without_shared_memory_is_refused(monkeypatch):
    monkeypatch.setenv("SGLANG_MM_SHM_TRANSPORT", "0")
    with pytest.raises(ValueError, match=r"--mm-processor-worker-num 2: .*SGLANG_MM_SHM_TRANSPORT=0.*"
                                         r"--mm-processor-worker-num 0"):
        ServerArgs(mm_processor_worker_num=2)
    ServerArgs(mm_processor_worker_num=0)  # the in-process path is always there


@pytest.mark.parametrize("flag, value", [("mm_processor_worker_num", -1), ("mm_processor_worker_num", 65),
                                         ("mm_io_worker_num", 0)])
def test_out_of_range_counts_are_refused(flag, value):
    with pytest.raises(ValueError, match="--" + flag.replace("_", "-")):
        ServerArgs(**{flag: value})


def test_the_cli_takes_both_flags():
    args = ServerArgs.from_argv(["--mm-processor-worker-num", "2", "--mm-io-worker-num", "8"])
    assert (args.mm_processor_worker_num, args.mm_io_worker_num) == (2, 8)


def test_the_spec_carries_the_switches_read_here(tiny_model_dir, monkeypatch):
    path = str(tiny_model_dir("qwen3-vl-tiny"))
    monkeypatch.setenv("SGLANG_MM_COMPACT_STILL_IMAGES", "1")
    monkeypatch.setenv("SGLANG_MM_UINT8_PIXELS", "1")
    spec = ProcessorSpec.from_server_args(ServerArgs(model_path=path, media_fetch_timeout=7), path)
    monkeypatch.delenv("SGLANG_MM_COMPACT_STILL_IMAGES")  # a worker's environment does not matter: the spec does
    monkeypatch.delenv("SGLANG_MM_UINT8_PIXELS")
    processor = spec.build(None)
    assert processor.compact_still_images and processor.uint8_pixels and spec.fetcher.timeout == 7


def test_io_threads_size_the_media_pool_without_workers(tiny_model_dir):
    from sglang.srt.managers.request_builder import RequestBuilder

    path = str(tiny_model_dir("qwen3-vl-tiny"))
    builder = RequestBuilder(ServerArgs(model_path=path, mm_processor_worker_num=0, mm_io_worker_num=3), path)
    try:
        assert builder.mm_pool is None and builder.media_pool._max_workers == 3
    finally:
        builder.close()
