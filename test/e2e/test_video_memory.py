"""Videos that cost far more memory decoded than sent, each beside an ordinary request (hostile.py): frames
are resized to the model's size as they are decoded, so 12 solid 8000x8000 PNGs as a frame list (~2.4 MB)
and two 8000x8000 mp4s in one chat are served; a clip whose pixel values pass SGLANG_VIDEO_MAX_BYTES is a
400 naming it, found after one frame. /health answers throughout, the ordinary request completes, no
shared-memory segment is left. The HTTP process's peak memory growth is printed (docs/reliability.md), not
asserted: the bound is asserted where the test controls it (test_video_io.py)."""

from __future__ import annotations

import base64

import pytest
import requests

from conftest import shm_sglang_entries, wait_until
from hostile import HOSTILE_TIMEOUT_S, beside_ordinary

from sglang.testing.sample_video import solid_clip, solid_png

av = pytest.importorskip("av")

# small enough that 6000 frames of 32x32 (at least 32x32 each at the model's size) pass it
MAX_BYTES = 64 << 20
VIDEO_PROMPT = "<|vision_start|><|video_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def mem_server(launch_server):
    return launch_server("--limit-mm-per-prompt", '{"image": 1, "video": 2}',
                         env={"SGLANG_VIDEO_MAX_BYTES": str(MAX_BYTES)})


def _status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _frame_list_body():
    frames = [_b64(solid_png(8000, (i * 20, 255 - i * 20, 128))) for i in range(12)]
    return "/generate", {"text": VIDEO_PROMPT + "Describe.", "video_data": [frames],
                         "sampling_params": {"max_new_tokens": 2, "temperature": 0}}


def _two_mp4_body():
    url = "data:video/mp4;base64," + _b64(solid_clip(8000, 8000, 2, 4))
    content = [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "and"},
               {"type": "video_url", "video_url": {"url": url}}]
    return "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": content}],
                                    "max_tokens": 2, "temperature": 0}


def _over_budget_body():
    tiny = _b64(solid_png(32, (9, 9, 9)))
    return "/generate", {"text": VIDEO_PROMPT, "video_data": [[tiny] * 6000],
                         "sampling_params": {"max_new_tokens": 2}}


CASES = {"12_solid_8000px_pngs_as_frames": (_frame_list_body, 200, None),
         "two_8000px_mp4s_in_one_chat": (_two_mp4_body, 200, None),
         "frame_list_past_the_byte_budget": (_over_budget_body, 400, "SGLANG_VIDEO_MAX_BYTES")}


# the 8000x8000 PNG frames decode for ~30 s on 2 cores: the slow target runs that case
@pytest.mark.parametrize("case", [c if not c.startswith("12_solid") else pytest.param(c, marks=pytest.mark.slow)
                                  for c in CASES])
def test_large_videos_beside_ordinary_traffic(mem_server, case):
    make, status, word = CASES[case]
    route, body = make()
    pid = mem_server.proc.pid  # the HTTP process: tokenizer manager and its decode threads
    idle_kib = _status_kib(pid, "VmRSS")
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # VmHWM from here
    before = {n for n in shm_sglang_entries() if n.startswith(f"sglang_mm_{mem_server.port}_")}

    def hostile():
        return requests.post(mem_server.url + route, json=body, timeout=HOSTILE_TIMEOUT_S)

    # in flight: decoding has raised the process's memory (each full-size frame is ~190 MB), or it is over
    r, worst = beside_ordinary(mem_server.url, hostile,
                               in_flight=lambda: status == 400 or _status_kib(pid, "VmRSS") > idle_kib + (120 << 10))
    peak_mib = (_status_kib(pid, "VmHWM") - idle_kib) >> 10
    print(f"\nvideo memory figures: {case}: HTTP process peak growth {peak_mib} MiB, slowest /health {worst:.3f} s, "
          f"status {r.status_code}")
    assert r.status_code == status, r.text
    if word:
        assert word in r.text and "MiB" in r.text
    wait_until(lambda: {n for n in shm_sglang_entries() if n.startswith(f"sglang_mm_{mem_server.port}_")} <= before,
               30, what="no new shared-memory segment")
