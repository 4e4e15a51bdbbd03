"""One spawned rank of the Ulysses test group (gloo, CPU): builds each tiny model's vision tower twice,
TP-sharded (today's path) and with --enable-vit-ulysses-sp (replicated weights, split tokens), then
serves requests from the test process until told to stop, so one process group runs many cases."""

from __future__ import annotations

import traceback


def pixels_for(grids: list[tuple[int, int, int]], row: int, seed: int):
    import torch

    n = sum(t * h * w for t, h, w in grids)
    return torch.randn(n, row, generator=torch.Generator().manual_seed(seed))


def a2a_inputs(sizes: list[int], heads: int, seed: int):
    """The whole (N, 3, heads, 4) sequence every rank cuts its own shard from."""
    import torch

    return torch.randn(sum(sizes), 3, heads, 4, generator=torch.Generator().manual_seed(seed))


def serve(rank: int, size: int, port: int, model_dirs: dict[str, str], inbox, outbox) -> None:
    import torch

    from sglang.srt.configs.vit_strategy import ViTStrategy
    from sglang.srt.distributed.parallel_state import init_tp_group
    from sglang.srt.distributed.sequence_parallel import SequenceSplit, UlyssesShards
    from sglang.srt.model_loader.loader import get_model

    torch.set_num_threads(1)
    try:
        tp = init_tp_group(size, rank, f"127.0.0.1:{port}", "gloo", 120)
        towers, info = {}, {}
        for name, path in model_dirs.items():
            sharded = get_model(path, "float32", tp=tp, vit=ViTStrategy()).visual
            ulysses = get_model(path, "float32", tp=tp, vit=ViTStrategy(ulysses_sp=True)).visual
            towers[name] = (sharded, ulysses)
            info[name] = {
                "sharded_qkv_rows": sharded.blocks[0].attn.qkv.weight.shape[0],
                "ulysses_qkv_rows": ulysses.blocks[0].attn.qkv.weight.shape[0],
                "ulysses_sp_size": ulysses.sp.size if ulysses.sp is not None else 1,
                "sharded_sp": sharded.sp is not None,
            }
        outbox.put((rank, "ready", info))
    except Exception:
        outbox.put((rank, "error", traceback.format_exc()))
        return
    while True:
        msg = inbox.get()
        if msg is None:
            break
        kind, payload = msg
        try:
            with torch.inference_mode():
                if kind == "tower":
                    name, grids, seed = payload
                    sharded, ulysses = towers[name]
                    row = sharded.patch_embed.shape[0] * sharded.patch_embed.shape[1] * sharded.patch_embed.shape[2] ** 2
                    px = pixels_for(grids, row, seed)
                    result = (sharded(px, grids), ulysses(px, grids))
                elif kind == "a2a":
                    sizes, heads, seed = payload
                    bounds = [0]
                    for s in sizes:
                        bounds.append(bounds[-1] + s)
                    shards = UlyssesShards(tp, SequenceSplit(tuple(bounds), (False,) * (size - 1)))
                    full = a2a_inputs(sizes, heads, seed)
                    by_heads = shards.seq_to_heads(full[shards.local])
                    back = shards.heads_to_seq(by_heads)
                    gathered = shards.gather(full[shards.local].flatten(1))
                    result = (by_heads, back, gathered)
                else:
                    raise ValueError(kind)
            outbox.put((rank, "ok", result))
        except Exception:
            outbox.put((rank, "error", traceback.format_exc()))
    import torch.distributed as dist

    dist.destroy_process_group()
