"""One spawned rank of the data-parallel encoder test (gloo, CPU): builds each tiny model twice at TP=2,
TP-sharded vision tower (today's path) and with --mm-enable-dp-encoder (whole tower, images split over
the ranks), runs `get_image_feature` on every case with both and returns the results."""

from __future__ import annotations

import traceback


def items_for(grids: list[tuple[int, int, int]], row: int, seed: int) -> list:
    import torch

    from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem

    g = torch.Generator().manual_seed(seed)
    return [
        MultimodalDataItem(
            modality=Modality.VIDEO if t > 1 else Modality.IMAGE,
            feature=torch.randn(t * h * w, row, generator=g),
            image_grid_thw=(t, h, w),
        )
        for t, h, w in grids
    ]


def patch_row(visual) -> int:
    shape = visual.patch_embed.shape
    return shape[0] * shape[1] * shape[2] ** 2


def run(rank: int, size: int, port: int, model_dirs: dict[str, str], cases: list, outbox) -> None:
    import torch

    from sglang.srt.configs.vit_strategy import ViTStrategy
    from sglang.srt.distributed.parallel_state import init_tp_group
    from sglang.srt.model_loader.loader import get_model

    torch.set_num_threads(1)
    try:
        tp = init_tp_group(size, rank, f"127.0.0.1:{port}", "gloo", 120)
        results, info = {}, {}
        for name, path in model_dirs.items():
            sharded = get_model(path, "float32", tp=tp, vit=ViTStrategy())
            dp = get_model(path, "float32", tp=tp, vit=ViTStrategy(dp_encoder=True))
            info[name] = {
                "sharded_qkv_rows": sharded.visual.blocks[0].attn.qkv.weight.shape[0],
                "dp_qkv_rows": dp.visual.blocks[0].attn.qkv.weight.shape[0],
                "dp_group_size": dp.vision_dp.size if dp.vision_dp is not None else 1,
            }
            row = patch_row(dp.visual)
            with torch.inference_mode():
                for k, (grids, seed) in enumerate(cases):
                    items = items_for(grids, row, seed)
                    # numpy: pickled by value, so the rank may exit before the test process reads them
                    results[name, k] = tuple([e.numpy() for e in m.get_image_feature(items)] for m in (sharded, dp))
        outbox.put((rank, "ok", (info, results)))
    except Exception:
        outbox.put((rank, "error", traceback.format_exc()))
        return
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
