"""Requests for the feature-transport tests (shm, cuda_ipc): a prompt with two small images, and a mix
of normal, streamed-then-abandoned, rejected and corrupt-image requests that ends transported items
on every path (consumed, aborted mid-stream, refused after preparation, failed while preparing)."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import requests

from conftest import data_url, noise_image, png_bytes

TWO_IMAGE_PROMPT = ("<|im_start|>user\n" + "<|vision_start|><|image_pad|><|vision_end|>" * 2
                    + "What is shown?<|im_end|>\n<|im_start|>assistant\n")
KINDS = ("ok", "stream_abort", "rejected", "bad_image")


def two_image_body(seed: int, max_new: int = 4, **kw) -> dict:
    imgs = [data_url(png_bytes(noise_image(64 + 16 * (seed % 3), 64, seed * 2 + k))) for k in range(2)]
    return {"text": TWO_IMAGE_PROMPT, "image_data": imgs,
            "sampling_params": {"max_new_tokens": max_new, "temperature": 0}, **kw}


def _one(url: str, kind: str, i: int) -> str:
    if kind == "ok":
        r = requests.post(url + "/generate", json=two_image_body(i), timeout=120)
        assert r.status_code == 200, r.text
    elif kind == "stream_abort":
        with requests.post(url + "/generate", json=two_image_body(i, 64, stream=True), stream=True, timeout=120) as r:
            assert r.status_code == 200
            next(r.iter_lines())  # first chunk, then hang up: the server aborts the request
    elif kind == "rejected":  # too long for the context: refused after the images were prepared
        body = two_image_body(i)
        body["text"] = TWO_IMAGE_PROMPT + "word " * 5000
        assert requests.post(url + "/generate", json=body, timeout=120).status_code == 400
    else:
        body = two_image_body(i)
        body["image_data"][1] = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAA"  # truncated PNG
        assert requests.post(url + "/generate", json=body, timeout=120).status_code == 400
    return kind


def run_mixed_traffic(url: str, count: int, workers: int, seed: int = 0) -> list[str]:
    """`count` requests from `workers` threads, kinds drawn (ok twice as often) from `seed`; returns the
    kinds sent. Every request got its expected status when this returns."""
    rng = random.Random(seed)
    kinds = [rng.choice(["ok", *KINDS]) for _ in range(count)]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda ik: _one(url, ik[1], ik[0]), enumerate(kinds)))
