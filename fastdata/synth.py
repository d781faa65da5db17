"""Built-in demo data: write a synthetic ImageFolder tree to try fastdata on.

Two kinds are available:

* ``"photos"`` -- photo-like JPEGs shaped like ImageNet (ILSVRC-2012 train):
  sides 300-640 px (mean about 470x385; many 500x375 / 500x333 and their
  portrait twins) and a mean file size of about 110 kB (~0.6 bytes/pixel).
  They are encoded the way most ImageNet JPEGs are: 70% at quality 88-95 and
  mostly without chroma subsampling (4:4:4), the rest at 75-87 and mostly
  4:2:0; baseline, standard Huffman tables. The content is built to compress
  and decode like camera photos rather than like flat colour or white noise:
  a lit, vignetted scene, shaded shapes and clusters of small objects (edges),
  textured regions (grass and hair streaks, foliage and gravel blobs, fabric,
  planks and tiles, fine grain) at several scales, out-of-focus patches, and
  sensor noise (luma, stronger in bright areas and the corners, plus weaker,
  blotchy chroma). JPEG decode time follows from bytes and pixels, and costs
  the same per byte on these images as on real photos, so decode benchmarks
  on them are meaningful; ``bench/synth_realism.py`` prints the figures next
  to real photos and the ImageNet reference.
* ``"tiny"`` -- 32x32 RGB PNGs like CIFAR: a small shape on a gradient.

Every image is drawn from its own random stream, seeded by
``(seed, kind, image index)``, so output is byte-identical for the same
arguments whatever the order of generation.

    summary = synthesize("demo/", kind="photos", n=512)
    fastdata.pack("demo/", "demo.lmdb")
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from fastdata.errors import SourceError
from fastdata.progress import progress_bar

__all__ = ["SynthSummary", "synthesize", "KINDS"]

# kind -> (default n, default classes, file extension)
KINDS: dict[str, tuple[int, int, str]] = {
    "photos": (512, 8, ".jpg"),
    "tiny": (2048, 10, ".png"),
}

# Mixed into every seed so that "photos" and "tiny" never share a stream.
_KIND_TAG = {"photos": 1, "tiny": 2}
# Separates per-class palette streams from per-image streams.
_CLASS_TAG = 0xC1A55


@dataclass(frozen=True)
class SynthSummary:
    """What :func:`synthesize` wrote.

    Attributes:
        root: absolute path of the ImageFolder tree.
        kind: ``"photos"`` or ``"tiny"``.
        images: number of image files written.
        classes: number of class folders written.
        bytes: total size of the image files.
        seconds: wall time taken.
        mean_bytes: mean file size.
        mean_width: mean image width in pixels.
        mean_height: mean image height in pixels.
    """

    root: str
    kind: str
    images: int
    classes: int
    bytes: int
    seconds: float
    mean_bytes: float
    mean_width: float
    mean_height: float

    def to_dict(self) -> dict:
        """The summary as a plain, JSON-serialisable dict."""
        return asdict(self)


# --------------------------------------------------------------------------- #
# Public entry point
# --------------------------------------------------------------------------- #


def synthesize(
    root: str | os.PathLike,
    *,
    kind: str = "photos",
    n: int | None = None,
    classes: int | None = None,
    seed: int = 0,
    progress: bool | None = None,
    overwrite: bool = False,
) -> SynthSummary:
    """Write a synthetic ImageFolder tree ``root/<class_name>/<file>``.

    Images are spread evenly over the classes (``n // classes`` each, the
    remainder going to the first classes). Class folders are named
    ``class_000``, ``class_001``, ... and files ``img_000000.jpg`` (``.png``
    for ``"tiny"``), numbered across the whole tree.

    The tree is built in a temporary sibling folder and moved into place only
    when complete, so a failure or interruption leaves no partial output.

    Args:
        root: folder to create. It must be absent or empty unless
            ``overwrite`` is set.
        kind: ``"photos"`` (ImageNet-like JPEGs) or ``"tiny"`` (32x32 PNGs).
        n: number of images; defaults to 512 for photos, 2048 for tiny.
        classes: number of classes; defaults to 8 for photos, 10 for tiny.
        seed: random seed; equal arguments give byte-identical files.
        progress: True forces a progress bar, False hides it, None shows it
            only when stderr is a terminal.
        overwrite: replace an existing non-empty ``root`` entirely (its
            previous contents are deleted).

    Returns:
        A :class:`SynthSummary` of what was written.

    Raises:
        SourceError: ``kind`` is unknown, ``n`` or ``classes`` is out of
            range, or ``root`` is a file or a non-empty folder and
            ``overwrite`` is not set.
    """
    start = time.perf_counter()
    if kind not in KINDS:
        raise SourceError(
            f"unknown synthetic kind {kind!r}; choose one of {', '.join(sorted(KINDS))}",
            path=root,
        )
    default_n, default_classes, ext = KINDS[kind]
    n = default_n if n is None else n
    classes = default_classes if classes is None else classes
    # bool is an int subclass; reject it so that n=True is not "1 image".
    for name, value in (("n", n), ("classes", classes), ("seed", seed)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise SourceError(f"{name} must be an integer, got {value!r}", path=root)
    n, classes, seed = int(n), int(classes), int(seed)
    if n < 1:
        raise SourceError(f"n must be at least 1, got {n}", path=root)
    if classes < 1:
        raise SourceError(f"classes must be at least 1, got {classes}", path=root)
    if classes > n:
        raise SourceError(f"classes ({classes}) must not exceed n ({n})", path=root)
    if seed < 0:
        raise SourceError(f"seed must be non-negative, got {seed}", path=root)

    root = Path(root).expanduser().absolute()
    if root.exists() or root.is_symlink():
        if not root.is_dir():
            raise SourceError("exists and is not a folder; choose another path", path=root)
        if any(root.iterdir()) and not overwrite:
            raise SourceError(
                "folder exists and is not empty; choose another path or pass --overwrite",
                path=root,
            )
    root.parent.mkdir(parents=True, exist_ok=True)

    make = _make_photo if kind == "photos" else _make_tiny
    class_width = max(3, len(str(classes - 1)))
    index_width = max(6, len(str(n - 1)))
    counts = [n // classes + (1 if c < n % classes else 0) for c in range(classes)]
    palettes = [_class_palette(seed, kind, c) for c in range(classes)]

    # Build next to root (same filesystem) so the final move is a rename.
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.synth-", dir=root.parent))
    total_bytes = 0
    sum_w = sum_h = 0
    bar = progress_bar(n, f"synth {kind}", enabled=progress)
    try:
        index = 0
        for c, count in enumerate(counts):
            class_dir = tmp / f"class_{c:0{class_width}d}"
            class_dir.mkdir()
            for _ in range(count):
                rng = np.random.default_rng(np.random.SeedSequence([seed, _KIND_TAG[kind], index]))
                data, (w, h) = make(rng, palettes[c])
                (class_dir / f"img_{index:0{index_width}d}{ext}").write_bytes(data)
                total_bytes += len(data)
                sum_w += w
                sum_h += h
                index += 1
                bar.update(1)
        _replace_dir(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        bar.close()

    return SynthSummary(
        root=str(root),
        kind=kind,
        images=n,
        classes=classes,
        bytes=total_bytes,
        seconds=time.perf_counter() - start,
        mean_bytes=total_bytes / n,
        mean_width=sum_w / n,
        mean_height=sum_h / n,
    )


def _replace_dir(src: Path, dst: Path) -> None:
    """Move the finished tree ``src`` to ``dst``, replacing whatever is there."""
    if not (dst.exists() or dst.is_symlink()):
        os.replace(src, dst)
        return
    if not any(dst.iterdir()):
        # An empty folder the caller made (perhaps the cwd): keep it, with its
        # permissions, and move the class folders in.
        for child in sorted(src.iterdir()):
            # shutil.move: dst may be a link to another filesystem.
            shutil.move(os.fspath(child), os.fspath(dst / child.name))
        os.rmdir(src)
        return
    if dst.is_symlink():
        # Replace the link itself; never delete what it points to.
        dst.unlink()
        os.replace(src, dst)
        return
    # Swap via a trash name so dst is never missing for long and a failed
    # rename leaves the old tree intact.
    trash = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old-", dir=dst.parent))
    os.replace(dst, trash / "old")
    try:
        os.replace(src, dst)
    except BaseException:
        os.replace(trash / "old", dst)
        os.rmdir(trash)
        raise
    shutil.rmtree(trash, ignore_errors=True)


# --------------------------------------------------------------------------- #
# Per-class colour tendencies
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class _Palette:
    """A class's colour tendency: a dominant and a secondary RGB colour (0-1)."""

    main: np.ndarray
    second: np.ndarray
    shape_kind: int


def _hsv_to_rgb(h: float, s: float, v: float) -> np.ndarray:
    i = int(h * 6.0) % 6
    f = h * 6.0 - int(h * 6.0)
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    return np.array([(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][i], np.float32)


def _class_palette(seed: int, kind: str, c: int) -> _Palette:
    rng = np.random.default_rng(np.random.SeedSequence([seed, _KIND_TAG[kind], _CLASS_TAG, c]))
    # Spread hues around the wheel (golden-ratio steps) so neighbouring
    # classes differ, then jitter so the seed matters.
    hue = (c * 0.618034 + rng.uniform(0, 1)) % 1.0
    main = _hsv_to_rgb(hue, rng.uniform(0.35, 0.7), rng.uniform(0.45, 0.8))
    second = _hsv_to_rgb((hue + rng.uniform(0.25, 0.75)) % 1.0, rng.uniform(0.2, 0.6),
                         rng.uniform(0.3, 0.9))
    return _Palette(main=main, second=second, shape_kind=int(rng.integers(0, 4)))


def _jitter(rng: np.random.Generator, colour: np.ndarray, amount: float) -> np.ndarray:
    return np.clip(colour + rng.normal(0.0, amount, 3).astype(np.float32), 0.02, 0.98)


# --------------------------------------------------------------------------- #
# Photos
# --------------------------------------------------------------------------- #


def _photo_size(rng: np.random.Generator) -> tuple[int, int]:
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


def _photo_encoding(rng: np.random.Generator) -> tuple[int, str]:
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


def _upsample(field: np.ndarray, w: int, h: int) -> np.ndarray:
    """Bicubic upsampling of a 2-D float field to (h, w)."""
    from PIL import Image

    return np.asarray(Image.fromarray(np.ascontiguousarray(field, np.float32), "F")
                      .resize((w, h), Image.BICUBIC))


def _octave_noise(rng: np.random.Generator, w: int, h: int, *, cells: float,
                  octaves: int, persistence: float) -> np.ndarray:
    """Multi-octave smooth noise on an (h, w) grid, roughly unit variance."""
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


def _photo(rng: np.random.Generator, palette: _Palette):
    """One photo: (RGB PIL image, JPEG quality, chroma subsampling)."""
    w, h = _photo_size(rng)
    quality, subsampling = _photo_encoding(rng)
    return _photo_pixels(rng, palette, w, h), quality, subsampling


def _photo_image(rng: np.random.Generator, palette: _Palette) -> tuple[np.ndarray, tuple[int, str]]:
    """The RGB uint8 pixels of one photo and the (quality, subsampling) it is saved with."""
    img, quality, subsampling = _photo(rng, palette)
    return np.asarray(img), (quality, subsampling)


def _make_photo(rng: np.random.Generator, palette: _Palette) -> tuple[bytes, tuple[int, int]]:
    img, quality, subsampling = _photo(rng, palette)
    buf = io.BytesIO()
    # Baseline JPEG with the standard Huffman tables, as cameras write them.
    img.save(buf, "JPEG", quality=quality, subsampling=subsampling)
    return buf.getvalue(), img.size


def _photo_pixels(rng: np.random.Generator, palette: _Palette, w: int, h: int):
    """One photo-like image, as an RGB PIL image of size (w, h).

    Full-resolution work is done on 8-bit PIL images (resampling, lookup
    tables, compositing, blend modes all run in C), which keeps generation
    fast; only the low-resolution scene is built in float.
    """
    from PIL import Image, ImageChops

    # 1. Low-frequency scene at 1/4 resolution: cheap to build in float and
    #    smooth enough that bilinear upsampling adds no visible blockiness.
    lw, lh = max(8, w // 4), max(8, h // 4)
    yy, xx = np.mgrid[0:lh, 0:lw].astype(np.float32)
    xx /= lw
    yy /= lh
    # Two class-tinted colours blended along a smooth, wandering boundary
    # (sky/ground, wall/floor, ...).
    top = _jitter(rng, palette.main, 0.12)
    bottom = _jitter(rng, palette.second if rng.random() < 0.6 else palette.main * 0.6, 0.12)
    angle = rng.uniform(0, 2 * np.pi)
    ramp = (np.cos(angle) * (xx - 0.5) + np.sin(angle) * (yy - 0.5)) * rng.uniform(1.5, 5.0)
    ramp += 0.6 * _octave_noise(rng, lw, lh, cells=2.0, octaves=2, persistence=0.5)
    blend = 1.0 / (1.0 + np.exp(-ramp))
    scene = top * (1 - blend[..., None]) + bottom * blend[..., None]
    # Colour variation at several scales, and per-channel so it is not grey.
    for ch in range(3):
        scene[..., ch] += 0.09 * _octave_noise(rng, lw, lh, cells=3.0, octaves=3, persistence=0.6)
    # Illumination: a directional light, broad lit and shadowed areas, and
    # vignetting. Real photos span most of the tonal range.
    light = 1.0 + rng.uniform(0.2, 0.6) * (np.cos(angle + 1.3) * (xx - 0.5) + np.sin(angle + 1.3) * (yy - 0.5))
    light *= np.exp(rng.uniform(0.2, 0.5) * _octave_noise(rng, lw, lh, cells=2.5, octaves=2, persistence=0.6))
    light *= rng.uniform(1.0, 1.4)  # exposure
    vignette = (xx - 0.5) ** 2 + (yy - 0.5) ** 2
    light *= 1.0 - rng.uniform(0.1, 0.45) * vignette
    scene *= light[..., None]
    np.clip(scene, 0.0, 1.0, out=scene)
    img = Image.fromarray((scene * 255.0).astype(np.uint8)).resize((w, h), Image.BILINEAR)

    # 2. Objects: a few large antialiased shapes with their own shading, then
    #    clusters of small ones (leaves, stones, windows, twigs): edges.
    _draw_shapes(rng, img, palette, w, h)
    _draw_clutter(rng, img, palette, w, h)

    # 3. Surface texture, applied like a reflectance map (overlay blend):
    #    grass, foliage, gravel, fabric, wood grain, fur... in regions and at
    #    several scales. In real photos this fine detail is what dominates JPEG
    #    size and decode time.
    tex = _texture(rng, w, h)
    img = ImageChops.overlay(img, Image.merge("RGB", (tex, tex, tex)))

    # 4. Sensor noise everywhere: luma plus a little chroma, stronger where the
    #    scene is bright (shot noise) and in the corners (vignetting gain).
    lum = scene.mean(axis=2) * 255.0
    img = _add_sensor_noise(rng, img, lum, 1.0 + 1.5 * vignette)

    # 5. Mild blur in places: an out-of-focus patch, feathered so it has no seam.
    if rng.random() < 0.3:
        from PIL import ImageFilter

        bw = int(rng.integers(w // 5, w // 2 + 1))
        bh = int(rng.integers(h // 5, h // 2 + 1))
        box = (int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1)))
        box = (*box, box[0] + bw, box[1] + bh)
        region = img.crop(box)
        gy, gx = np.ogrid[-1:1:bh * 1j, -1:1:bw * 1j]
        feather = np.clip((1.0 - (gx * gx + gy * gy)) * 2.0, 0.0, 1.0)
        img.paste(region.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.6, 1.5)))), box[:2],
                  Image.fromarray((feather * 255).astype(np.uint8)))
    return img


# Texture --------------------------------------------------------------------- #

# Random fields are built as 8-bit images: uniform random bytes on a coarse
# grid, resampled to full size in C. One "unit" of a field is the standard
# deviation of its grid values, _U8 grey levels; the 8-bit quantisation is far
# below what survives JPEG, and this is many times faster than float normals.
_U8 = 73.9  # standard deviation of uniform bytes 0-255


def _field(rng: np.random.Generator, w: int, h: int, cell: float, resample=None):
    """Smooth random field with a feature size of ``cell`` px, as an 'L' image."""
    from PIL import Image

    small = rng.integers(0, 256, (int(h / cell) + 3, int(w / cell) + 3), np.uint8)
    return Image.fromarray(small, "L").resize(
        (w, h), Image.BICUBIC if resample is None else resample)


def _lut(gain: float, amp: float, bias: float = 0.0) -> list[int]:
    """A 256-entry table: 8-bit field -> 128 + amp * clip(gain * unit + bias, -1, 1)."""
    x = (np.arange(256, dtype=np.float64) - 128.0) / _U8
    y = np.clip(gain * x + bias, -1.0, 1.0)
    return np.clip(np.round(128.0 + amp * y), 0, 255).astype(np.uint8).tolist()


def _tex_grain(rng: np.random.Generator, w: int, h: int, amp: float, cell: float | None = None):
    """Fine isotropic detail: sand, distant foliage, fur, rough plaster."""
    field = _field(rng, w, h, rng.uniform(1.5, 3.0) if cell is None else cell)
    # Half of the time thresholded into speckles with crisp edges.
    gain = rng.uniform(1.0, 2.0) if rng.random() < 0.5 else 0.5
    return field.point(_lut(gain, amp))


def _tex_blobs(rng: np.random.Generator, w: int, h: int, amp: float):
    """Foliage, gravel, pebbles, spots: blobs with sharp, antialiased edges."""
    from PIL import ImageChops

    cell = rng.uniform(1.8, 7.0)
    blobs = _field(rng, w, h, cell).point(_lut(rng.uniform(1.2, 3.0), amp))
    if rng.random() < 0.5:
        # Detail inside the blobs at a finer scale (veins, facets, fur tips).
        fine = _field(rng, w, h, cell / 2.5).point(_lut(0.8, amp * 0.5))
        blobs = ImageChops.add(blobs, fine, 1.0, -128)
    return blobs


def _tex_strokes(rng: np.random.Generator, w: int, h: int, amp: float):
    """Grass blades, hair, straw, wood grain: streaks along one direction, plus blades."""
    from PIL import Image, ImageDraw

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


def _tex_weave(rng: np.random.Generator, w: int, h: int, amp: float):
    """Man-made periodic texture, slightly warped: fabric, wicker, planks, tiles."""
    from PIL import Image

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


def _texture(rng: np.random.Generator, w: int, h: int):
    """A reflectance map as an 'L' image centred on 128 (no change).

    Two to four texture layers, each in its own irregular region with fairly
    sharp borders and at its own strength and scale, so that some areas are
    busy and others smooth, as in a real scene (later layers occlude earlier
    ones, like surfaces in front of others); then a fine grain everywhere.
    """
    from PIL import Image, ImageChops

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


def _add_sensor_noise(rng: np.random.Generator, img, lum: np.ndarray, gain: np.ndarray):
    """``img`` with camera noise added.

    ``lum`` (0-255) and ``gain`` are low-resolution maps of the scene's
    brightness and of the vignetting-correction gain. Luma noise has a read
    part and a signal-dependent (shot) part and is stronger in the corners;
    chroma noise is a few times weaker and blotchy (2x2 px), as demosaicing
    leaves it. The noise is triangular (the difference of two uniforms),
    close enough to Gaussian and much cheaper to draw.
    """
    from PIL import Image, ImageChops

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


def _draw_clutter(rng: np.random.Generator, img, palette: _Palette, w: int, h: int) -> None:
    """Paste clusters of small objects onto the PIL image ``img`` in place.

    Colours are drawn at 1x; the coverage mask at 2x and box-reduced, so the
    objects' edges are antialiased.
    """
    from PIL import Image, ImageDraw

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


def _draw_shapes(rng: np.random.Generator, img, palette: _Palette, w: int, h: int) -> None:
    """Paste 2-7 antialiased, shaded shapes onto the PIL image ``img`` in place."""
    from PIL import Image, ImageChops, ImageDraw

    ss = 2  # supersampling factor: draw at 2x, box-reduce -> antialiased edges
    for _ in range(int(rng.integers(2, 8))):
        bw = int(rng.integers(max(16, w // 10), max(17, int(w * 0.6))))
        bh = int(rng.integers(max(16, h // 10), max(17, int(h * 0.6))))
        x0 = int(rng.integers(-bw // 4, w - bw * 3 // 4))
        y0 = int(rng.integers(-bh // 4, h - bh * 3 // 4))
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
        mask = mask.reduce(ss)

        # Fill: a class-leaning colour, shaded across the shape, sometimes
        # with a stripe/check pattern (printed, woven or man-made surfaces).
        base = palette.main if rng.random() < 0.5 else rng.uniform(0.05, 0.95, 3).astype(np.float32)
        colour = _jitter(rng, base, 0.1)
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
        fill = ImageChops.multiply(Image.merge("RGB", [Image.fromarray(shade, "L")] * 3),
                                   Image.new("RGB", (bw, bh), tint))
        img.paste(fill, (x0, y0), mask)


# --------------------------------------------------------------------------- #
# Tiny (CIFAR-like)
# --------------------------------------------------------------------------- #


def _make_tiny(rng: np.random.Generator, palette: _Palette) -> tuple[bytes, tuple[int, int]]:
    from PIL import Image, ImageDraw

    size, ss = 32, 4
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / (size - 1)
    a = rng.uniform(0, 2 * np.pi)
    t = np.clip(0.5 + 0.7 * (np.cos(a) * (xx - 0.5) + np.sin(a) * (yy - 0.5)), 0, 1)[..., None]
    c0 = _jitter(rng, palette.second, 0.12)
    c1 = _jitter(rng, palette.second * 0.5 + 0.25, 0.12)
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
    colour = _jitter(rng, palette.main, 0.1)
    shade = (1.0 + 0.4 * (0.5 - yy))[..., None]
    fg = Image.fromarray(np.clip(colour * shade * 255, 0, 255).astype(np.uint8))
    bg.paste(fg, (0, 0), mask)

    pix = np.asarray(bg).astype(np.float32) + rng.normal(0, 4.0, (size, size, 3)).astype(np.float32)
    buf = io.BytesIO()
    Image.fromarray(np.clip(pix, 0, 255).astype(np.uint8)).save(buf, "PNG")
    return buf.getvalue(), (size, size)

