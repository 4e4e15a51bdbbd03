"""--enable-vit-ulysses-sp actually splits the tokens: at TP=2 with the flag each rank's vision tower embeds
only its shard of the patches (a tower that skipped the sequence-parallel forward would run every patch on
every rank, with the same result), and the gathered output equals the single-rank tower's. Both ranks run
in one process, one thread each; the all-to-alls and the all-gather are stood in for by an exchange
between the two threads (same semantics as torch.distributed's, rank taken from the group handle)."""

from __future__ import annotations

import threading

import pytest
import torch

from sglang.srt.configs.vit_strategy import ViTStrategy
from sglang.srt.distributed import sequence_parallel
from sglang.srt.distributed.parallel_state import TPInfo
from sglang.srt.model_loader.loader import get_model

SIZE = 2
GRIDS = [(1, 4, 4), (1, 8, 6), (1, 2, 2), (1, 6, 10)]


class _Exchange:
    """Every rank hands in a tensor and gets all ranks' tensors back, in rank order."""

    def __init__(self, size: int):
        self.barrier = threading.Barrier(size, timeout=120)
        self.slots: list = [None] * size

    def swap(self, rank: int, value):
        self.slots[rank] = value
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before every rank has read it
        return out


def _fake_collectives(monkeypatch, ex: _Exchange):
    def all_to_all_single(out, inp, output_split_sizes=None, input_split_sizes=None, group=None):
        rank = group
        every = ex.swap(rank, list(inp.split(input_split_sizes, dim=0)))
        out.copy_(torch.cat([chunks[rank] for chunks in every], dim=0))

    def all_gather(parts, tensor, group=None):
        for part, t in zip(parts, ex.swap(group, tensor.clone())):
            part.copy_(t)

    monkeypatch.setattr(sequence_parallel.dist, "all_to_all_single", all_to_all_single)
    monkeypatch.setattr(sequence_parallel.dist, "all_gather", all_gather)


@pytest.mark.parametrize("preset", ["qwen3-vl-tiny", "qwen2.5-vl-tiny"])
def test_ulysses_tower_takes_the_sequence_parallel_forward(tiny_model_dir, monkeypatch, preset):
    path = str(tiny_model_dir(preset))
    single = get_model(path, "float32").visual
    # group handle = the rank: the stand-in collectives read it
    ranks = [get_model(path, "float32", tp=TPInfo(rank=r, size=SIZE, group=r), vit=ViTStrategy(ulysses_sp=True)).visual
             for r in range(SIZE)]
    assert all(v.sp is not None and v.sp.size == SIZE for v in ranks)
    ex = _Exchange(SIZE)
    _fake_collectives(monkeypatch, ex)
    seen = [[] for _ in range(SIZE)]
    for r, v in enumerate(ranks):
        v.patch_embed.register_forward_pre_hook(lambda mod, args, r=r: seen[r].append(args[0].shape[0]))
    shape = single.patch_embed.shape
    total = sum(t * h * w for t, h, w in GRIDS)
    pixels = torch.randn(total, shape[0] * shape[1] * shape[2] * shape[3], generator=torch.Generator().manual_seed(0))
    outs, errors = [None] * SIZE, []

    def run(r):
        try:
            with torch.inference_mode():
                outs[r] = ranks[r](pixels, GRIDS)
        except BaseException as e:  # noqa: BLE001 - reported below; the other rank must not wait forever
            errors.append(e)
            ex.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(SIZE)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    # A tower that skipped the sequence-parallel forward finishes without any collective: nothing fails there.
    assert all(sum(s) < total for s in seen), f"a rank embedded every patch ({seen} of {total}): no token split"
    assert not errors, errors
    assert sum(sum(s) for s in seen) == total
    with torch.inference_mode():
        ref = single(pixels, GRIDS)
    for out in outs:
        assert out.shape == ref.shape
        assert (out - ref).abs().max().item() <= 1e-5 * ref.abs().max().item() + 1e-6
