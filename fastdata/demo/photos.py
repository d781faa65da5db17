"""Photo-like demo JPEGs shaped and encoded like ImageNet's (ILSVRC-2012 train).

Sizes and JPEG settings follow ImageNet's mix; the pixels are a lit,
vignetted scene with shaded objects, regional textures, sensor noise and
the odd out-of-focus patch, so the files compress and decode like photos.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageChops, ImageFilter

from fastdata.demo.objects import draw_clutter, draw_shapes
from fastdata.demo.palette import Palette, jitter
from fastdata.demo.textures import octave_noise, texture

__all__ = ["make_photo", "photo_encoding", "photo_image", "photo_size"]


def make_photo(rng: np.random.Generator, palette: Palette) -> tuple[bytes, tuple[int, int]]:
    """One photo as JPEG bytes, and its (width, height).

    Args:
        rng: the image's own random stream.
        palette: the colour tendency of the image's class.
    """
    img, quality, subsampling = _photo(rng, palette)
    buf = io.BytesIO()
    # Baseline JPEG with the standard Huffman tables, as cameras write them.
    img.save(buf, "JPEG", quality=quality, subsampling=subsampling)
    return buf.getvalue(), img.size


def photo_image(rng: np.random.Generator, palette: Palette) -> tuple[np.ndarray, tuple[int, str]]:
    """The RGB uint8 pixels of one photo and the (quality, subsampling) it is saved with.

    Draws exactly what :func:`make_photo` draws from ``rng``, without encoding.
    """
    img, quality, subsampling = _photo(rng, palette)
    return np.asarray(img), (quality, subsampling)


def photo_size(rng: np.random.Generator) -> tuple[int, int]:
    """An ImageNet-like (width, height): mostly landscape, long side near 500."""
    # ImageNet is dominated by 500x375 / 500x333 and their portrait twins,
    # with a spread of other sizes; both sides are kept within 300-640.
    if rng.random() < 0.5:
        long_side = 500
    else:
        long_side = int(rng.integers(320, 641))
    aspect = float(rng.choice([4 / 3, 3 / 2, 1.0, 5 / 4, 16 / 9], p=[0.45, 0.4, 0.03, 0.07, 0.05]))
    short_side = int(np.clip(round(long_side / aspect), 300, 640))
    if rng.random() < 0.85:
        return long_side, short_side
    return short_side, long_side


def photo_encoding(rng: np.random.Generator) -> tuple[int, str]:
    """A JPEG quality (75-95) and chroma subsampling, skewed the way ImageNet is.

    Most ImageNet training JPEGs are lightly compressed (quality about 96 is
    the most common) and not chroma subsampled (M. Ehrlich, "Compression in
    the ImageNet Dataset", 2021); a minority are web-style 4:2:0 at lower
    quality. Here 70% are at quality 88-95 and about 70% are 4:4:4.
    """
    if rng.random() < 0.7:
        quality = int(rng.integers(88, 96))
        p = (0.85, 0.05, 0.1)
    else:
        quality = int(rng.integers(75, 88))
        p = (0.35, 0.15, 0.5)
    return quality, str(rng.choice(["4:4:4", "4:2:2", "4:2:0"], p=p))



def _photo(rng: np.random.Generator, palette: Palette) -> tuple[Image.Image, int, str]:
    """One photo: (RGB PIL image, JPEG quality, chroma subsampling)."""
    w, h = photo_size(rng)
    quality, subsampling = photo_encoding(rng)
    return _photo_pixels(rng, palette, w, h), quality, subsampling


def _photo_pixels(rng: np.random.Generator, palette: Palette, w: int, h: int) -> Image.Image:
    """One photo-like image, as an RGB PIL image of size (w, h).

    Full-resolution work is done on 8-bit PIL images (resampling, lookup
    tables, compositing, blend modes all run in C), which keeps generation
    fast; only the low-resolution scene is built in float.
    """
    # 1. A lit, vignetted background scene: two class-tinted colours.
    img, scene, vignette = _scene(rng, palette, w, h)

    # 2. Objects: a few large antialiased shapes with their own shading, then
    #    clusters of small ones (leaves, stones, windows, twigs): edges.
    draw_shapes(rng, img, palette, w, h)
    draw_clutter(rng, img, palette, w, h)

    # 3. Surface texture, applied like a reflectance map (overlay blend):
    #    grass, foliage, gravel, fabric, wood grain, fur... in regions and at
    #    several scales. In real photos this fine detail is what dominates JPEG
    #    size and decode time.
    tex = texture(rng, w, h)
    img = ImageChops.overlay(img, Image.merge("RGB", (tex, tex, tex)))

    # 4. Sensor noise everywhere: luma plus a little chroma, stronger where the
    #    scene is bright (shot noise) and in the corners (vignetting gain).
    lum = scene.mean(axis=2) * 255.0
    img = _add_sensor_noise(rng, img, lum, 1.0 + 1.5 * vignette)

    # 5. Mild blur in places: an out-of-focus patch, feathered so it has no seam.
    if rng.random() < 0.3:
        _blur_patch(rng, img, w, h)
    return img


def _scene(rng: np.random.Generator, palette: Palette, w: int,
           h: int) -> tuple[Image.Image, np.ndarray, np.ndarray]:
    """The lit background scene, upsampled to (w, h).

    Returns:
        The RGB image, the low-resolution scene it was made from (float RGB,
        0-1) and the low-resolution vignetting map (squared distance from the
        centre), which the sensor noise follows.
    """
    # Low-frequency scene at 1/4 resolution: cheap to build in float and
    # smooth enough that bilinear upsampling adds no visible blockiness.
    lw, lh = max(8, w // 4), max(8, h // 4)
    yy, xx = np.mgrid[0:lh, 0:lw].astype(np.float32)
    xx /= lw
    yy /= lh
    # Two class-tinted colours blended along a smooth, wandering boundary
    # (sky/ground, wall/floor, ...).
    top = jitter(rng, palette.main, 0.12)
    bottom = jitter(rng, palette.second if rng.random() < 0.6 else palette.main * 0.6, 0.12)
    angle = rng.uniform(0, 2 * np.pi)
    ramp = (np.cos(angle) * (xx - 0.5) + np.sin(angle) * (yy - 0.5)) * rng.uniform(1.5, 5.0)
    ramp += 0.6 * octave_noise(rng, lw, lh, cells=2.0, octaves=2, persistence=0.5)
    blend = 1.0 / (1.0 + np.exp(-ramp))
    scene = top * (1 - blend[..., None]) + bottom * blend[..., None]
    # Colour variation at several scales, and per-channel so it is not grey.
    for ch in range(3):
        scene[..., ch] += 0.09 * octave_noise(rng, lw, lh, cells=3.0, octaves=3, persistence=0.6)
    # Illumination: a directional light, broad lit and shadowed areas, and
    # vignetting. Real photos span most of the tonal range.
    light = 1.0 + rng.uniform(0.2, 0.6) * (np.cos(angle + 1.3) * (xx - 0.5) + np.sin(angle + 1.3) * (yy - 0.5))
    light *= np.exp(rng.uniform(0.2, 0.5) * octave_noise(rng, lw, lh, cells=2.5, octaves=2, persistence=0.6))
    light *= rng.uniform(1.0, 1.4)  # exposure
    vignette = (xx - 0.5) ** 2 + (yy - 0.5) ** 2
    light *= 1.0 - rng.uniform(0.1, 0.45) * vignette
    scene *= light[..., None]
    np.clip(scene, 0.0, 1.0, out=scene)
    img = Image.fromarray((scene * 255.0).astype(np.uint8)).resize((w, h), Image.BILINEAR)
    return img, scene, vignette


def _blur_patch(rng: np.random.Generator, img: Image.Image, w: int, h: int) -> None:
    """Blur a random rectangle of ``img`` in place, feathered towards its edges."""
    bw = int(rng.integers(w // 5, w // 2 + 1))
    bh = int(rng.integers(h // 5, h // 2 + 1))
    box = (int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1)))
    box = (*box, box[0] + bw, box[1] + bh)
    region = img.crop(box)
    gy, gx = np.ogrid[-1:1:bh * 1j, -1:1:bw * 1j]
    feather = np.clip((1.0 - (gx * gx + gy * gy)) * 2.0, 0.0, 1.0)
    img.paste(region.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.6, 1.5)))), box[:2],
              Image.fromarray((feather * 255).astype(np.uint8)))


def _add_sensor_noise(rng: np.random.Generator, img: Image.Image, lum: np.ndarray,
                      gain: np.ndarray) -> Image.Image:
    """``img`` with camera noise added.

    ``lum`` (0-255) and ``gain`` are low-resolution maps of the scene's
    brightness and of the vignetting-correction gain. Luma noise has a read
    part and a signal-dependent (shot) part and is stronger in the corners;
    chroma noise is a few times weaker and blotchy (2x2 px), as demosaicing
    leaves it. The noise is triangular (the difference of two uniforms),
    close enough to Gaussian and much cheaper to draw.
    """
    w, h = img.size
    iso = rng.lognormal(0.15, 0.35)  # per-image gain
    read = rng.uniform(0.6, 1.4)
    shot = rng.uniform(0.01, 0.04)
    sigma = np.sqrt(read * read + shot * lum) * gain * iso
    smean = float(sigma.mean())
    # The noise level varies smoothly: a nearest-neighbour map is plenty.
    sigma_img = Image.fromarray(np.clip(sigma * 16.0, 0, 255).astype(np.uint8), "L")
    sig = np.asarray(sigma_img.resize((w, h), Image.NEAREST)).astype(np.float32)
    u = rng.integers(0, 256, (2, h, w), np.uint8)
    noise = u[0].astype(np.float32)
    noise -= u[1]
    # u1 - u2 has a standard deviation of 256/sqrt(6); sig is 16x sigma.
    sig *= np.float32(np.sqrt(6.0) / 256.0 / 16.0)
    noise *= sig
    noise += np.float32(128.5)  # +0.5: astype truncates
    np.clip(noise, 0, 255, out=noise)
    n = Image.fromarray(noise.astype(np.uint8), "L")
    img = ImageChops.add(img, Image.merge("RGB", (n, n, n)), 1.0, -128)
    # Chroma: zero-luma colour noise (two components on the plane R+G+B = 0,
    # equal variance in each channel) at half resolution.
    a, b = rng.random((2, h // 2 + 1, w // 2 + 1), np.float32) - np.float32(0.5)
    k = np.float32(rng.uniform(0.3, 0.7) * smean * np.sqrt(12.0) * np.sqrt(1.5))
    a *= k * np.float32(np.sqrt(0.5))
    b *= k * np.float32(np.sqrt(1.0 / 6.0))
    c = np.stack([a + b, b - a, np.float32(-2.0) * b], axis=2)
    c += np.float32(128.5)
    np.clip(c, 0, 255, out=c)
    chroma = Image.fromarray(c.astype(np.uint8)).resize((w, h), Image.NEAREST)
    return ImageChops.add(img, chroma, 1.0, -128)
