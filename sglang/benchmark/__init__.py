"""Serving benchmark client: datasets, the streaming chat client, metrics and the request runner.

`python -m sglang.bench_serving --help` is the entry point; `benchmark/multimodal/ttft_probe.py` reuses the
image helpers and the streaming client.
"""
