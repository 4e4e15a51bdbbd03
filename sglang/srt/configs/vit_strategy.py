"""How the vision towers are built: implementation choices that change no weights and no outputs
(beyond float rounding), resolved once from the environment and passed down to the model constructor.

`ViTStrategy.from_env()` is the only place that reads SGLANG_VIT_PATCH_EMBED_LINEAR and
SGLANG_VIT_FAST_POS_EMBED; `get_model` calls it when it is given no strategy, so models and layers never
read a switch themselves.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ViTStrategy:
    """patch_embed_linear: the patch embedding as one Linear, Conv3d checkpoint weights reshaped at load
    (False: the baseline Conv3d). fast_pos_embed: position-embedding interpolation and 2D rotary indices
    cached per grid shape (False: the baseline, recomputed every forward). ulysses_sp: the server flag
    `--enable-vit-ulysses-sp` (not an environment switch; the runner passes it to `from_env`): at TP > 1
    the tower's weights are replicated and its tokens split over the ranks (False: the TP-sharded tower).
    dp_encoder: the server flag `--mm-enable-dp-encoder`: at TP > 1 the tower's weights are replicated and
    each encode call's images are split over the ranks, each rank running whole images (False: the
    TP-sharded tower). towers: which parts of the model are built and loaded: "all" (the default), "text"
    (`--language-only`: no vision tower, its images arrive as embeddings from encoders) or "vision"
    (`--encoder-only`: the vision tower alone, no decoder, no LM head). The defaults are the switches'
    defaults."""

    patch_embed_linear: bool = True
    fast_pos_embed: bool = True
    ulysses_sp: bool = False
    dp_encoder: bool = False
    towers: str = "all"

    def __post_init__(self):
        if self.towers not in ("all", "text", "vision"):
            raise ValueError(f"ViTStrategy.towers must be all, text or vision, got {self.towers!r}")

    @classmethod
    def from_env(cls, ulysses_sp: bool = False, dp_encoder: bool = False, towers: str = "all") -> "ViTStrategy":
        from sglang.srt.environ import envs

        return cls(
            patch_embed_linear=envs.SGLANG_VIT_PATCH_EMBED_LINEAR.get(),
            fast_pos_embed=envs.SGLANG_VIT_FAST_POS_EMBED.get(),
            ulysses_sp=ulysses_sp,
            dp_encoder=dp_encoder,
            towers=towers,
        )
