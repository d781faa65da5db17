"""Random fields and surface textures for the demo photos.

Textures are reflectance maps: 8-bit 'L' images centred on 128 (no change),
applied to a scene with an overlay blend. Random fields are built as 8-bit
images: uniform random bytes on a coarse grid, resampled to full size in C.
One "unit" of a field is the standard deviation of its grid values, ``_U8``
grey levels; the 8-bit quantisation is far below what survives JPEG, and this
is many times faster than float normals.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageChops, ImageDraw

__all__ = ["octave_noise", "texture"]

_U8 = 73.9  # standard deviation of uniform bytes 0-255


def _upsample(field: np.ndarray, w: int, h: int) -> np.ndarray:
    """Bicubic upsampling of a 2-D float field to (h, w)."""
    return np.asarray(Image.fromarray(np.ascontiguousarray(field, np.float32), "F")
                      .resize((w, h), Image.BICUBIC))


def octave_noise(rng: np.random.Generator, w: int, h: int, *, cells: float,
                 octaves: int, persistence: float) -> np.ndarray:
    """Multi-octave smooth noise on an (h, w) grid, roughly unit variance.

    Args:
        rng: the image's random stream.
        w: width of the grid.
        h: height of the grid.
        cells: grid cells along the longer side in the first octave; each
            further octave doubles it.
        octaves: number of octaves summed.
        persistence: amplitude ratio of one octave to the previous one.
    """
    out = np.zeros((h, w), np.float32)
    amp, norm = 1.0, 0.0
    scale = max(w, h)
    for _ in range(octaves):
        gw = max(2, int(round(cells * w / scale)) + 1)
        gh = max(2, int(round(cells * h / scale)) + 1)
        out += amp * _upsample(rng.standard_normal((gh, gw), np.float32), w, h)
        norm += amp * amp
        amp *= persistence
        cells *= 2.0
    return out / np.float32(np.sqrt(norm))


def _field(rng: np.random.Generator, w: int, h: int, cell: float,
           resample: int | None = None) -> Image.Image:
    """Smooth random field with a feature size of ``cell`` px, as an 'L' image."""
    small = rng.integers(0, 256, (int(h / cell) + 3, int(w / cell) + 3), np.uint8)
    return Image.fromarray(small, "L").resize(
        (w, h), Image.BICUBIC if resample is None else resample)


def _lut(gain: float, amp: float, bias: float = 0.0) -> list[int]:
    """A 256-entry table: 8-bit field -> 128 + amp * clip(gain * unit + bias, -1, 1)."""
    x = (np.arange(256, dtype=np.float64) - 128.0) / _U8
    y = np.clip(gain * x + bias, -1.0, 1.0)
    return np.clip(np.round(128.0 + amp * y), 0, 255).astype(np.uint8).tolist()


def _tex_grain(rng: np.random.Generator, w: int, h: int, amp: float,
               cell: float | None = None) -> Image.Image:
    """Fine isotropic detail: sand, distant foliage, fur, rough plaster."""
    field = _field(rng, w, h, rng.uniform(1.5, 3.0) if cell is None else cell)
    # Half of the time thresholded into speckles with crisp edges.
    gain = rng.uniform(1.0, 2.0) if rng.random() < 0.5 else 0.5
    return field.point(_lut(gain, amp))


def _tex_blobs(rng: np.random.Generator, w: int, h: int, amp: float) -> Image.Image:
    """Foliage, gravel, pebbles, spots: blobs with sharp, antialiased edges."""
    cell = rng.uniform(1.8, 7.0)
    blobs = _field(rng, w, h, cell).point(_lut(rng.uniform(1.2, 3.0), amp))
    if rng.random() < 0.5:
        # Detail inside the blobs at a finer scale (veins, facets, fur tips).
        fine = _field(rng, w, h, cell / 2.5).point(_lut(0.8, amp * 0.5))
        blobs = ImageChops.add(blobs, fine, 1.0, -128)
    return blobs


def _tex_strokes(rng: np.random.Generator, w: int, h: int, amp: float) -> Image.Image:
    """Grass blades, hair, straw, wood grain: streaks along one direction, plus blades."""
    # Mostly upright (grass, reeds, bark) or at any angle (hair, grain, straw).
    theta = np.pi / 2 + rng.normal(0, 0.25) if rng.random() < 0.5 else rng.uniform(0, np.pi)
    across = rng.uniform(1.5, 3.5)
    along = across * rng.uniform(4.0, 15.0)
    # Streaks: noise fine across and coarse along the strokes, mapped onto the
    # frame by one affine resampling (rotation plus anisotropic scaling).
    ct, st = np.cos(theta), np.sin(theta)
    xs, ys = np.array([0.0, w, 0.0, w]), np.array([0.0, 0.0, h, h])
    t_across, t_along = -xs * st + ys * ct, xs * ct + ys * st
    cols = int(np.ptp(t_across) / across) + 4
    rows = int(np.ptp(t_along) / along) + 4
    small = Image.fromarray(rng.integers(0, 256, (rows, cols), np.uint8), "L")
    data = (-st / across, ct / across, 1.0 - t_across.min() / across,
            ct / along, st / along, 1.0 - t_along.min() / along)
    layer = small.transform((w, h), Image.AFFINE, data, resample=Image.BILINEAR)
    # Crisp single blades / hairs / twigs over the streaks.
    draw = ImageDraw.Draw(layer)
    n = int(rng.integers(100, 400))
    length = rng.uniform(5.0, 25.0) * rng.uniform(0.4, 1.0, n)
    ang = theta + rng.normal(0, 0.3, n)
    x0, y0 = rng.uniform(0, w, n), rng.uniform(0, h, n)
    pts = np.stack([x0, y0, x0 - length * np.cos(ang), y0 - length * np.sin(ang)], 1)
    for p, grey in zip(pts.tolist(), rng.integers(0, 256, n).tolist()):
        draw.line(p, fill=grey, width=1)
    return layer.point(_lut(rng.uniform(1.0, 2.5), amp))


def _tex_weave(rng: np.random.Generator, w: int, h: int, amp: float) -> Image.Image:
    """Man-made periodic texture, slightly warped: fabric, wicker, planks, tiles."""
    y = np.arange(h, dtype=np.float32)[:, None]
    x = np.arange(w, dtype=np.float32)[None, :]
    a = rng.uniform(0, np.pi)
    ca, sa = np.float32(np.cos(a)), np.float32(np.sin(a))
    p1 = rng.uniform(4.0, 16.0)
    p2 = p1 * rng.uniform(1.0, 3.0)
    f1, f2 = rng.uniform(0.005, 0.03, 2).astype(np.float32)
    ph1, ph2 = rng.uniform(0, 2 * np.pi, 2).astype(np.float32)
    # A smooth warp (cloth folds, perspective) from separable sinusoids.
    warp = np.float32(rng.uniform(0.5, 3.0)) * np.sin(x * f1 + ph1) * np.cos(y * f2 + ph2)
    su = np.sin((x * ca + y * sa) * np.float32(2 * np.pi / p1) + warp)
    sv = np.sin((y * ca - x * sa) * np.float32(2 * np.pi / p2) + warp)
    kind = rng.random()
    if kind < 0.5:  # weave: threads alternately over and under
        su *= sv
        su *= np.float32(2.5)
    elif kind < 0.8:  # planks, slats, stripes with crisp joints, grain along them
        sv *= np.float32(4.0)
        np.clip(sv, -1.0, 1.0, out=sv)
        sv *= np.float32(0.6)
        su *= np.float32(0.4)
        su += sv
    else:  # tiles or bricks: dark mortar lines on a lighter field
        np.abs(su, out=su)
        np.minimum(su, np.abs(sv), out=su)
        su *= np.float32(12.0)
        su -= np.float32(1.5)
    np.clip(su, -1.0, 1.0, out=su)
    su *= np.float32(amp * 0.6)  # man-made patterns: mostly low contrast
    su += np.float32(128.5)
    return Image.fromarray(su.astype(np.uint8), "L")


_TEXTURES = (_tex_grain, _tex_blobs, _tex_strokes, _tex_weave)


def texture(rng: np.random.Generator, w: int, h: int) -> Image.Image:
    """A reflectance map as an 'L' image centred on 128 (no change).

    Two to four texture layers, each in its own irregular region with fairly
    sharp borders and at its own strength and scale, so that some areas are
    busy and others smooth, as in a real scene (later layers occlude earlier
    ones, like surfaces in front of others); then a fine grain everywhere.

    Args:
        rng: the image's random stream.
        w: width of the map.
        h: height of the map.
    """
    tex = Image.new("L", (w, h), 128)
    for _ in range(int(rng.integers(2, 5))):
        kind = int(rng.choice(4, p=[0.3, 0.3, 0.25, 0.15]))
        layer = _TEXTURES[kind](rng, w, h, rng.uniform(40.0, 100.0))
        cells = rng.uniform(1.5, 4.0)
        mask = _field(rng, w, h, max(w, h) / cells, Image.BILINEAR).point(
            _lut(rng.uniform(4.0, 12.0), 127.5, rng.uniform(0.0, 4.0)))
        tex = Image.composite(layer, tex, mask)
    # Fine grain everywhere, on top: micro-texture of every surface.
    grain = _tex_grain(rng, w, h, rng.uniform(10.0, 25.0), rng.uniform(1.2, 2.0))
    return ImageChops.add(tex, grain, 1.0, -128)

