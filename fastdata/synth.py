"""Built-in demo data: write a synthetic ImageFolder tree to try fastdata on.

Two kinds are available:

* ``"photos"`` -- photo-like JPEGs of ImageNet-like size (sides 300-640 px),
  quality 75-95. The content is built to compress and decode like real photos
  rather than like flat colour or white noise: smooth illumination, multi-octave
  smooth noise, antialiased shapes with shading, textured regions with fine
  detail, out-of-focus areas and a little sensor grain. Benchmarks on them are
  therefore meaningful (bytes per pixel and decode time per megapixel are
  within about 30% of real photos encoded at the same quality; see
  ``bench/synth_realism.py``).
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
    if dst.is_symlink():
        # Replace the link itself; never delete what it points to.
        dst.unlink()
        os.replace(src, dst)
        return
    # Swap via a trash name so dst is never missing for long and a failed
    # rename leaves the old tree intact.
    trash = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old-", dir=dst.parent))
    os.rmdir(trash)
    os.replace(dst, trash)
    try:
        os.replace(src, dst)
    except BaseException:
        os.replace(trash, dst)
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
    if rng.random() < 0.45:
        long_side = 500
    else:
        long_side = int(rng.integers(320, 641))
    aspect = float(rng.choice([4 / 3, 3 / 2, 1.0, 5 / 4, 16 / 9], p=[0.45, 0.25, 0.12, 0.1, 0.08]))
    short_side = int(np.clip(round(long_side / aspect), 300, 640))
    if rng.random() < 0.75:
        return long_side, short_side
    return short_side, long_side


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


def _photo_image(rng: np.random.Generator, palette: _Palette) -> tuple[np.ndarray, int]:
    """The RGB uint8 pixels of one photo and the JPEG quality to save it at."""
    w, h = _photo_size(rng)
    quality = int(rng.integers(75, 96))
    return _photo_pixels(rng, palette, w, h), quality


def _make_photo(rng: np.random.Generator, palette: _Palette) -> tuple[bytes, tuple[int, int]]:
    from PIL import Image

    img, quality = _photo_image(rng, palette)
    h, w = img.shape[:2]
    buf = io.BytesIO()
    # Pillow's default for quality < 100 is 4:2:0 chroma subsampling, as in
    # most camera and web JPEGs.
    Image.fromarray(img).save(buf, "JPEG", quality=quality, subsampling="4:2:0")
    return buf.getvalue(), (w, h)


def _photo_pixels(rng: np.random.Generator, palette: _Palette, w: int, h: int) -> np.ndarray:
    """The RGB uint8 pixels of one photo-like image."""
    from PIL import Image

    # 1. Low-frequency scene at 1/4 resolution: cheap to build in float and
    #    smooth enough that bicubic upsampling adds no visible blockiness.
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
        scene[..., ch] += 0.09 * _octave_noise(rng, lw, lh, cells=3.0, octaves=4, persistence=0.6)
    # Illumination: a directional light plus vignetting.
    light = 1.0 + rng.uniform(0.1, 0.4) * (np.cos(angle + 1.3) * (xx - 0.5) + np.sin(angle + 1.3) * (yy - 0.5))
    light *= 1.0 - rng.uniform(0.1, 0.45) * ((xx - 0.5) ** 2 + (yy - 0.5) ** 2)
    scene *= light[..., None]
    low = Image.fromarray(np.clip(scene * 255.0, 0, 255).astype(np.uint8)).resize((w, h), Image.BICUBIC)

    # 2. Objects: antialiased shapes with their own shading and texture.
    _draw_shapes(rng, low, palette, w, h)

    # 3. Fine texture (foliage, fabric, fur, gravel...) in some regions only;
    #    this is what dominates JPEG size and decode time in real photos.
    pix = np.asarray(low).astype(np.float32)
    detail_mask = _upsample(rng.standard_normal((4, 5), np.float32), w, h)
    # Fairly sharp region boundaries: textured areas next to smooth ones.
    detail_mask = np.clip(detail_mask * rng.uniform(1.0, 2.5) + rng.uniform(-0.2, 0.6), 0.0, 1.0)
    pix += (_texture(rng, w, h) * (rng.uniform(14.0, 28.0) * detail_mask + 2.0))[..., None] \
        * np.array([1.0, 0.95, 0.85], np.float32)
    # Sensor noise: weak and everywhere.
    pix += rng.standard_normal((h, w), np.float32)[..., None] * np.float32(rng.uniform(1.0, 2.5))
    out = Image.fromarray(np.clip(pix, 0, 255).astype(np.uint8))

    # 4. Mild blur in places: an out-of-focus patch, feathered so it has no seam.
    if rng.random() < 0.5:
        from PIL import ImageFilter

        bw = int(rng.integers(w // 4, w // 2 + 1))
        bh = int(rng.integers(h // 4, h // 2 + 1))
        box = (int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1)))
        box = (*box, box[0] + bw, box[1] + bh)
        region = out.crop(box)
        gy, gx = np.ogrid[-1:1:bh * 1j, -1:1:bw * 1j]
        feather = np.clip((1.0 - (gx * gx + gy * gy)) * 2.0, 0.0, 1.0)
        out.paste(region.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.8, 2.0)))), box[:2],
                  Image.fromarray((feather * 255).astype(np.uint8)))
    return np.asarray(out)


def _texture(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """Zero-mean fine texture with a 1/f-like spectrum, sometimes streaky."""
    out = np.zeros((h, w), np.float32)
    # Finest to coarsest; the finer octaves dominate, as in grass or gravel.
    for div, amp in ((2, 1.0), (4, 0.7), (8, 0.5)):
        gw, gh = w // div + 2, h // div + 2
        if rng.random() < 0.3:
            # Anisotropic octave: streaks (wood grain, grass blades, hair).
            if rng.random() < 0.5:
                gw = max(2, gw // 4)
            else:
                gh = max(2, gh // 4)
        out += amp * _upsample(rng.standard_normal((gh, gw), np.float32), w, h)
    return out


def _draw_shapes(rng: np.random.Generator, img, palette: _Palette, w: int, h: int) -> None:
    """Paste 2-7 antialiased, shaded shapes onto the PIL image ``img`` in place."""
    from PIL import Image, ImageDraw

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
        gy, gx = np.mgrid[0:bh, 0:bw].astype(np.float32)
        a = rng.uniform(0, 2 * np.pi)
        shade = 1.0 + rng.uniform(0.2, 0.6) * (np.cos(a) * (gx / bw - 0.5) + np.sin(a) * (gy / bh - 0.5))
        if rng.random() < 0.3:
            period = rng.uniform(3.0, 14.0)
            b = rng.uniform(0, np.pi)
            shade *= 1.0 + 0.15 * np.sin((np.cos(b) * gx + np.sin(b) * gy) * (2 * np.pi / period))
        fill = np.clip(colour * shade[..., None] * 255.0, 0, 255).astype(np.uint8)
        img.paste(Image.fromarray(fill), (x0, y0), mask)


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

