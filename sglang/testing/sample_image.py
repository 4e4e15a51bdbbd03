"""A deterministic test card (colour bars over a grey ramp), so demos and smoke tests need no files."""

from __future__ import annotations


def test_card(width: int = 640, height: int = 360):
    import numpy as np
    from PIL import Image

    img = np.zeros((height, width, 3), dtype=np.uint8)
    bars = [(255, 255, 255), (255, 255, 0), (0, 255, 255), (0, 255, 0), (255, 0, 255), (255, 0, 0), (0, 0, 255)]
    for i, c in enumerate(bars):
        img[: height * 2 // 3, i * width // len(bars) : (i + 1) * width // len(bars)] = c
    img[height * 2 // 3 :] = np.linspace(0, 255, width, dtype=np.uint8)[None, :, None]
    return Image.fromarray(img, "RGB")
