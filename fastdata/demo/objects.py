"""Objects drawn over the demo photos' scene: large shaded shapes and clutter.

Edges are what make a photo expensive to compress; both kinds of object are
drawn with antialiased edges (a coverage mask drawn at 2x, box-reduced).
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageChops, ImageDraw

from fastdata.demo.palette import Palette, jitter

__all__ = ["draw_clutter", "draw_shapes"]


def draw_clutter(rng: np.random.Generator, img: Image.Image, palette: Palette, w: int, h: int) -> None:
    """Paste clusters of small objects onto the PIL image ``img`` in place.

    Colours are drawn at 1x; the coverage mask at 2x and box-reduced, so the
    objects' edges are antialiased.
    """
    ss = 2
    layer = Image.new("RGB", (w, h))
    mask = Image.new("L", (w * ss, h * ss), 0)
    dl, dm = ImageDraw.Draw(layer), ImageDraw.Draw(mask)
    n_clusters = int(rng.integers(1, 5))
    centres = rng.uniform(0.1, 0.9, (n_clusters, 2)) * np.array([w, h])
    spreads = rng.uniform(0.05, 0.3, n_clusters) * max(w, h)
    n = int(rng.integers(30, 160))
    which = rng.integers(0, n_clusters, n)
    pos = centres[which] + rng.normal(0, 1, (n, 2)) * spreads[which, None]
    sizes = np.exp(rng.uniform(np.log(3.0), np.log(40.0), n))
    aspect = rng.uniform(0.4, 1.0, n)
    rot = rng.uniform(0, 2 * np.pi, n)
    kinds = rng.choice(4, n, p=[0.4, 0.25, 0.2, 0.15])
    # Each cluster shares a colour family; objects vary around it.
    family = [palette.main if rng.random() < 0.5 else rng.uniform(0.05, 0.95, 3) for _ in range(n_clusters)]
    colours = np.clip(np.array(family)[which] + rng.normal(0, 0.12, (n, 3)), 0.02, 0.98) * 255
    polys = rng.uniform(0.5, 1.0, (n, 5))
    for i in range(n):
        fill = tuple(int(v) for v in colours[i])
        edge = tuple(int(v * 0.55) for v in colours[i])
        cx, cy = pos[i]
        r, ra = sizes[i] / 2, sizes[i] * aspect[i] / 2
        if kinds[i] == 0:  # pebble, fruit, berry, leaf seen flat
            box = (cx - r, cy - ra, cx + r, cy + ra)
            dl.ellipse(box, fill=fill, outline=edge)
            dm.ellipse(tuple(v * ss for v in box), fill=255)
            hl = tuple(min(255, int(v * 1.3 + 20)) for v in fill)  # a highlight
            dl.ellipse((cx - r * 0.5, cy - ra * 0.6, cx, cy - ra * 0.1), fill=hl)
        elif kinds[i] < 3:  # irregular polygon (leaf, rock) or rotated box (window, label)
            if kinds[i] == 1:
                ang = rot[i] + np.linspace(0, 2 * np.pi, 5, endpoint=False)
                pts = np.stack([cx + r * polys[i] * np.cos(ang), cy + ra * polys[i] * np.sin(ang)], 1)
            else:
                c_, s_ = np.cos(rot[i]), np.sin(rot[i])
                d = np.array([(-r, -ra), (r, -ra), (r, ra), (-r, ra)])
                pts = np.stack([cx + c_ * d[:, 0] - s_ * d[:, 1], cy + s_ * d[:, 0] + c_ * d[:, 1]], 1)
            dl.polygon(pts.ravel().tolist(), fill=fill, outline=edge)
            dm.polygon((pts * ss).ravel().tolist(), fill=255)
        else:  # twig, wire, stem
            x1, y1 = cx + 2 * r * np.cos(rot[i]), cy + 2 * r * np.sin(rot[i])
            width = max(1, int(ra / 3))
            dl.line((cx, cy, x1, y1), fill=fill, width=width + 1)
            dm.line((cx * ss, cy * ss, x1 * ss, y1 * ss), fill=255, width=width * ss)
    img.paste(layer, (0, 0), mask.reduce(ss))


def draw_shapes(rng: np.random.Generator, img: Image.Image, palette: Palette, w: int, h: int) -> None:
    """Paste 2-7 antialiased, shaded shapes onto the PIL image ``img`` in place."""
    for _ in range(int(rng.integers(2, 8))):
        bw = int(rng.integers(max(16, w // 10), max(17, int(w * 0.6))))
        bh = int(rng.integers(max(16, h // 10), max(17, int(h * 0.6))))
        x0 = int(rng.integers(-bw // 4, w - bw * 3 // 4))
        y0 = int(rng.integers(-bh // 4, h - bh * 3 // 4))
        mask = _shape_mask(rng, palette, bw, bh)
        img.paste(_shape_fill(rng, palette, bw, bh), (x0, y0), mask)


def _shape_mask(rng: np.random.Generator, palette: Palette, bw: int, bh: int) -> Image.Image:
    """The antialiased coverage mask ('L', bw x bh) of one shape."""
    ss = 2  # supersampling factor: draw at 2x, box-reduce -> antialiased edges
    mask = Image.new("L", (bw * ss, bh * ss), 0)
    draw = ImageDraw.Draw(mask)
    shape = int(rng.integers(0, 4)) if rng.random() < 0.5 else palette.shape_kind
    W, H = bw * ss - 1, bh * ss - 1
    if shape == 0:
        draw.ellipse((0, 0, W, H), fill=255)
    elif shape == 1:
        k = int(rng.integers(3, 8))
        ang = np.sort(rng.uniform(0, 2 * np.pi, k))
        rad = rng.uniform(0.55, 1.0, k)
        pts = [(W / 2 * (1 + r * np.cos(a)), H / 2 * (1 + r * np.sin(a))) for a, r in zip(ang, rad)]
        draw.polygon(pts, fill=255)
    elif shape == 2:
        # Rotated rectangle (a box, a window, a book...).
        a = rng.uniform(0, np.pi)
        cx, cy, hw, hh = W / 2, H / 2, W * rng.uniform(0.25, 0.5), H * rng.uniform(0.15, 0.5)
        ca, sa = np.cos(a), np.sin(a)
        pts = [(cx + ca * dx - sa * dy, cy + sa * dx + ca * dy)
               for dx, dy in ((-hw, -hh), (hw, -hh), (hw, hh), (-hw, hh))]
        draw.polygon(pts, fill=255)
    else:
        # A few thick strokes (branches, poles, wires).
        for _ in range(int(rng.integers(1, 4))):
            p = rng.uniform(0, 1, 4) * np.array([W, H, W, H])
            draw.line(tuple(p), fill=255, width=int(rng.integers(2, 12)) * ss)
    return mask.reduce(ss)


def _shape_fill(rng: np.random.Generator, palette: Palette, bw: int, bh: int) -> Image.Image:
    """The RGB fill (bw x bh) of one shape.

    A class-leaning colour, shaded across the shape, sometimes with a
    stripe/check pattern (printed, woven or man-made surfaces).
    """
    base = palette.main if rng.random() < 0.5 else rng.uniform(0.05, 0.95, 3).astype(np.float32)
    colour = jitter(rng, base, 0.1)
    gx = np.arange(bw, dtype=np.float32)[None, :]
    gy = np.arange(bh, dtype=np.float32)[:, None]
    a = rng.uniform(0, 2 * np.pi)
    k = np.float32(rng.uniform(0.2, 0.6))
    # Linear shading, built from a row and a column (one full-size pass).
    shade = (1.0 + k * np.float32(np.cos(a)) * (gx / bw - 0.5)) + k * np.float32(np.sin(a)) * (gy / bh - 0.5)
    if rng.random() < 0.3:
        period = rng.uniform(3.0, 14.0)
        b = rng.uniform(0, np.pi)
        f = np.float32(2 * np.pi / period)
        shade *= 1.0 + 0.15 * np.sin(gx * (np.float32(np.cos(b)) * f) + gy * (np.float32(np.sin(b)) * f))
    # colour x shade in C: a grey shading image (1.25 -> 255, so that
    # highlights keep their gradation) times a solid colour (x1.25).
    shade = np.clip(shade * (255.0 / 1.25), 0, 255).astype(np.uint8)
    tint = tuple(min(255, int(c * 255 * 1.25)) for c in colour)
    return ImageChops.multiply(Image.merge("RGB", [Image.fromarray(shade, "L")] * 3),
                               Image.new("RGB", (bw, bh), tint))
