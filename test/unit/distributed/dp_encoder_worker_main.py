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


def uint8_items_for(grids: list[tuple[int, int, int]], visual, merge: int, seed: int) -> list:
    """SGLANG_MM_UINT8_PIXELS carriers of the same grids: (H, W, 3) images, (F, H, W, 3) videos with an odd
    frame count where the grid allows (the last frame fills the last temporal patch)."""
    import torch

    from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem, PixelNorm

    _, tp, p = visual.patch_embed.shape[:3]
    g = torch.Generator().manual_seed(seed)
    items = []
    for t, h, w in grids:
        kind = "video" if t > 1 else "image"
        shape = (h * p, w * p, 3) if t == 1 else (t * tp - (1 if tp > 1 else 0), h * p, w * p, 3)
        norm = PixelNorm(kind, p, tp, merge, (0.5, 0.4, 0.3), (0.2, 0.3, 0.25), True, 1 / 255, True)
        items.append(MultimodalDataItem(Modality.VIDEO if t > 1 else Modality.IMAGE,
                                        feature=torch.randint(0, 256, shape, dtype=torch.uint8, generator=g),
                                        image_grid_thw=(t, h, w), pixel_norm=norm))
    return items


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
                    # uint8 carriers: each rank finishes only the items dealt to it
                    u8 = uint8_items_for(grids, dp.visual, dp.config.vision.spatial_merge_size, seed)
                    results[name, k, "u8"] = [e.numpy() for e in dp.get_image_feature(u8)]
        outbox.put((rank, "ok", (info, results)))
    except Exception:
        outbox.put((rank, "error", traceback.format_exc()))
        return
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
