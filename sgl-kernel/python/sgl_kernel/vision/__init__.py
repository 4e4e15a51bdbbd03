"""Kernels for vision encoders (ViT) of the VLMs."""

from sgl_kernel.vision.pos_embed import gather_blend_rows, gather_blend_rows_torch

__all__ = ["gather_blend_rows", "gather_blend_rows_torch"]
