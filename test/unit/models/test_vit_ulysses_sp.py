"""--enable-vit-ulysses-sp at TP=2 over gloo: the Ulysses vision tower (whole weights on each rank, the
patches split over the ranks, attention after an all-to-all to head shards) gives the same features as
the TP-sharded tower and the single-rank tower, for random image mixes (hypothesis), on both models;
the all-to-alls equal their single-process references. One spawned process group runs every case."""

from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "distributed"))
from ulysses_worker_main import a2a_inputs, pixels_for, serve  # noqa: E402

from sglang.srt.configs.vit_strategy import ViTStrategy  # noqa: E402
from sglang.srt.distributed.parallel_state import TPInfo  # noqa: E402
from sglang.srt.distributed.sequence_parallel import reference_heads_to_seq, reference_seq_to_heads  # noqa: E402
from sglang.srt.model_loader.loader import get_model, log_replicated_vision_memory  # noqa: E402
from sglang.srt.utils.network import pick_unused_port  # noqa: E402

PRESETS = {"qwen3": "qwen3-vl-tiny", "qwen2_5": "qwen2.5-vl-tiny"}
SIZE = 2
SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Group:
    """Two spawned ranks; `ask` sends one request to both and returns their answers by rank."""

    def __init__(self, dirs: dict[str, str]):
        ctx = mp.get_context("spawn")
        self.inboxes = [ctx.Queue() for _ in range(SIZE)]
        self.outbox = ctx.Queue()
        port = pick_unused_port()
        self.procs = [
            ctx.Process(target=serve, args=(r, SIZE, port, dirs, self.inboxes[r], self.outbox), daemon=True)
            for r in range(SIZE)
        ]
        for p in self.procs:
            p.start()
        self.broken = None
        self.info = self._collect("ready")

    def _collect(self, expect: str) -> dict:
        out = {}
        for _ in range(SIZE):
            rank, status, value = self.outbox.get(timeout=120)
            if status not in (expect, "ok"):
                self.broken = value  # the ranks are out of step now: every later case fails at once
                pytest.fail(f"rank {rank}: {value}")
            out[rank] = value
        return out

    def ask(self, kind: str, payload) -> dict:
        if self.broken:
            pytest.fail(f"the group failed earlier: {self.broken}")
        for q in self.inboxes:
            q.put((kind, payload))
        return self._collect("ok")

    def close(self) -> None:
        for q in self.inboxes:
            q.put(None)
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


@pytest.fixture(scope="module")
def dirs(tiny_model_dir) -> dict[str, str]:
    return {name: str(tiny_model_dir(preset)) for name, preset in PRESETS.items()}


@pytest.fixture(scope="module")
def group(dirs):
    g = Group(dirs)
    yield g
    g.close()


@pytest.fixture(scope="module")
def single(dirs):
    return {name: get_model(path, "float32").visual for name, path in dirs.items()}


def test_weights_replicated_only_in_the_vision_tower(group):
    for rank in range(SIZE):
        for name, info in group.info[rank].items():
            assert info["ulysses_qkv_rows"] == SIZE * info["sharded_qkv_rows"], name
            assert info["ulysses_sp_size"] == SIZE and not info["sharded_sp"], name


def _grids(even_max: int):
    side = st.integers(1, even_max // 2).map(lambda v: 2 * v)
    return st.lists(st.tuples(st.sampled_from([1, 1, 1, 2]), side, side), min_size=1, max_size=5)


def _check_tower(group, single, name, grids, seed):
    tower = single[name]
    row = tower.patch_embed.shape[0] * tower.patch_embed.shape[1] * tower.patch_embed.shape[2] ** 2
    with torch.inference_mode():
        ref = tower(pixels_for(grids, row, seed), grids)
    scale = ref.abs().max().item()
    for rank, (sharded, ulysses) in group.ask("tower", (name, grids, seed)).items():
        assert ulysses.shape == ref.shape
        assert (ulysses - ref).abs().max().item() <= 1e-5 * scale + 1e-6, (rank, grids)
        assert (ulysses - sharded).abs().max().item() <= 1e-5 * scale + 1e-6, (rank, grids)


@SETTINGS
@given(grids=_grids(12), seed=st.integers(0, 2**16))
def test_qwen3_vl_ulysses_equals_sharded_and_single_rank(group, single, grids, seed):
    _check_tower(group, single, "qwen3", grids, seed)


@SETTINGS
@given(grids=_grids(20), seed=st.integers(0, 2**16))
def test_qwen2_5_vl_windows_survive_the_split(group, single, grids, seed):
    """Window reordering before the split, partial edge windows, full-attention layers, reverse order."""
    _check_tower(group, single, "qwen2_5", grids, seed)


@pytest.mark.parametrize("name", ["qwen3", "qwen2_5"])
def test_one_rank_without_tokens(group, single, name):
    """A single 2x2 image is one merge window: one rank holds nothing and still takes part."""
    _check_tower(group, single, name, [(1, 2, 2)], 7)


@SETTINGS
@given(sizes=st.lists(st.integers(0, 6), min_size=SIZE, max_size=SIZE).filter(sum), seed=st.integers(0, 99))
def test_all_to_all_matches_reference(group, sizes, seed):
    heads = 4
    full = a2a_inputs(sizes, heads, seed)
    bounds = [0]
    for s in sizes:
        bounds.append(bounds[-1] + s)
    shards = [full[bounds[r] : bounds[r + 1]] for r in range(SIZE)]
    got = group.ask("a2a", (sizes, heads, seed))
    per_rank_heads = [reference_seq_to_heads(shards, r) for r in range(SIZE)]
    for rank, (by_heads, back, gathered) in got.items():
        assert torch.equal(by_heads, per_rank_heads[rank])
        assert torch.equal(back, reference_heads_to_seq(per_rank_heads, sizes, rank))
        assert torch.equal(back, shards[rank])
        assert torch.equal(gathered, full.flatten(1))


def test_heads_not_dividing_are_refused_with_one_line(dirs):
    with pytest.raises(ValueError) as e:
        get_model(dirs["qwen3"], "float32", tp=TPInfo(rank=0, size=3), vit=ViTStrategy(ulysses_sp=True))
    msg = str(e.value)
    assert "\n" not in msg and "--enable-vit-ulysses-sp" in msg and "2 attention heads" in msg


def test_replicated_memory_line(single, dirs):
    model = get_model(dirs["qwen3"], "float32")
    line = log_replicated_vision_memory(model, TPInfo(rank=0, size=2))
    assert line.startswith("vit-ulysses-sp: vision tower weights replicated on each of 2 ranks")
