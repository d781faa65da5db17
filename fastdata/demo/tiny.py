"""Tiny demo images: 32x32 RGB PNGs like CIFAR, a small shape on a gradient."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw

from fastdata.demo.palette import Palette, jitter

__all__ = ["make_tiny"]


def make_tiny(rng: np.random.Generator, palette: Palette) -> tuple[bytes, tuple[int, int]]:
    """One 32x32 image as PNG bytes, and its (width, height).

    A gradient background in the class's secondary colour, one antialiased
    object of the class's typical shape and main colour, and mild noise.

    Args:
        rng: the image's own random stream.
        palette: the colour tendency of the image's class.
    """
    size, ss = 32, 4
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / (size - 1)
    a = rng.uniform(0, 2 * np.pi)
    t = np.clip(0.5 + 0.7 * (np.cos(a) * (xx - 0.5) + np.sin(a) * (yy - 0.5)), 0, 1)[..., None]
    c0 = jitter(rng, palette.second, 0.12)
    c1 = jitter(rng, palette.second * 0.5 + 0.25, 0.12)
    bg = Image.fromarray(np.clip((c0 * (1 - t) + c1 * t) * 255, 0, 255).astype(np.uint8))

    # One object, class-typical in shape and colour, drawn at 4x for antialiasing.
    mask = Image.new("L", (size * ss, size * ss), 0)
    draw = ImageDraw.Draw(mask)
    r = rng.uniform(6, 12) * ss
    cx, cy = rng.uniform(10, 22, 2) * ss
    kind = palette.shape_kind if rng.random() < 0.8 else int(rng.integers(0, 4))
    if kind == 0:
        draw.ellipse((cx - r, cy - r * rng.uniform(0.6, 1.0), cx + r, cy + r * rng.uniform(0.6, 1.0)), fill=255)
    elif kind == 1:
        draw.polygon([(cx, cy - r), (cx + r, cy + r * 0.8), (cx - r, cy + r * 0.8)], fill=255)
    elif kind == 2:
        draw.rectangle((cx - r, cy - r * 0.7, cx + r, cy + r * 0.7), fill=255)
    else:
        draw.polygon([(cx + r * np.cos(t_) * (1 if i % 2 == 0 else 0.45),
                       cy + r * np.sin(t_) * (1 if i % 2 == 0 else 0.45))
                      for i, t_ in enumerate(np.linspace(0, 2 * np.pi, 10, endpoint=False))], fill=255)
    mask = mask.resize((size, size), Image.BOX)
    colour = jitter(rng, palette.main, 0.1)
    shade = (1.0 + 0.4 * (0.5 - yy))[..., None]
    fg = Image.fromarray(np.clip(colour * shade * 255, 0, 255).astype(np.uint8))
    bg.paste(fg, (0, 0), mask)

    pix = np.asarray(bg).astype(np.float32) + rng.normal(0, 4.0, (size, size, 3)).astype(np.float32)
    buf = io.BytesIO()
    Image.fromarray(np.clip(pix, 0, 255).astype(np.uint8)).save(buf, "PNG")
    return buf.getvalue(), (size, size)
