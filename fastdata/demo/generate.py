"""Write a demo ImageFolder tree: argument checks, layout, atomic replacement."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from fastdata.demo.palette import Palette, class_palette, image_rng
from fastdata.demo.photos import make_photo
from fastdata.demo.tiny import make_tiny
from fastdata.errors import SourceError
from fastdata.progress import progress_bar

__all__ = ["KINDS", "SynthSummary", "synthesize"]

# kind -> (default n, default classes, file extension)
KINDS: dict[str, tuple[int, int, str]] = {
    "photos": (512, 8, ".jpg"),
    "tiny": (2048, 10, ".png"),
}

# kind -> what one image is, in words (singular, plural)
_NOUNS: dict[str, tuple[str, str]] = {
    "photos": ("photo-like JPEG", "photo-like JPEGs"),
    "tiny": ("32x32 PNG", "32x32 PNGs"),
}

_MAKERS: dict[str, Callable[[np.random.Generator, Palette], tuple[bytes, tuple[int, int]]]] = {
    "photos": make_photo,
    "tiny": make_tiny,
}


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

    def describe(self) -> str:
        """What was written, in words: "512 photo-like JPEGs in 8 classes"."""
        one, many = _NOUNS.get(self.kind, ("image", "images"))
        classes = "class" if self.classes == 1 else "classes"
        return (f"{self.images:,} {one if self.images == 1 else many} in {self.classes} "
                f"{classes}")


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
        ValueError: ``kind`` is unknown, or ``n``, ``classes`` or ``seed`` is
            out of range.
        TypeError: ``n``, ``classes`` or ``seed`` is not an integer.
        SourceError: ``root`` is a file, or a non-empty folder and
            ``overwrite`` is not set.
    """
    start = time.perf_counter()
    n, classes, seed = _check_arguments(kind, n, classes, seed)
    root = Path(root).expanduser().absolute()
    _check_root(root, overwrite)
    root.parent.mkdir(parents=True, exist_ok=True)

    # Build next to root (same filesystem) so the final move is a rename.
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.synth-", dir=root.parent))
    bar = progress_bar(n, f"synth {kind}", enabled=progress)
    try:
        total_bytes, sum_w, sum_h = _write_tree(tmp, kind, n, classes, seed, bar)
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


def _check_arguments(kind: str, n: int | None, classes: int | None,
                     seed: int) -> tuple[int, int, int]:
    """``(n, classes, seed)`` as plain ints, defaults filled in, after checking them."""
    if kind not in KINDS:
        raise ValueError(f"unknown synthetic kind {kind!r}; choose one of "
                         f"{', '.join(sorted(KINDS))}")
    default_n, default_classes, _ = KINDS[kind]
    n = default_n if n is None else n
    classes = default_classes if classes is None else classes
    # bool is an int subclass; reject it so that n=True is not "1 image".
    for name, value in (("n", n), ("classes", classes), ("seed", seed)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise TypeError(f"{name} must be an integer, got {value!r}")
    n, classes, seed = int(n), int(classes), int(seed)
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if classes < 1:
        raise ValueError(f"classes must be at least 1, got {classes}")
    if classes > n:
        raise ValueError(f"classes ({classes}) must not exceed n ({n}): every class gets "
                         "at least one image")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    return n, classes, seed


def _check_root(root: Path, overwrite: bool) -> None:
    """Refuse a ``root`` that is a file, or a non-empty folder without ``overwrite``."""
    if root.exists() or root.is_symlink():
        if not root.is_dir():
            raise SourceError("exists and is not a folder; choose another path", path=root)
        if any(root.iterdir()) and not overwrite:
            raise SourceError(
                "folder exists and is not empty; choose another path or pass --overwrite",
                path=root,
            )


def _write_tree(tmp: Path, kind: str, n: int, classes: int, seed: int,
                bar) -> tuple[int, int, int]:
    """Write every class folder and image into ``tmp``.

    Returns:
        The total bytes written and the sums of the images' widths and heights.
    """
    make = _MAKERS[kind]
    ext = KINDS[kind][2]
    class_width = max(3, len(str(classes - 1)))
    index_width = max(6, len(str(n - 1)))
    counts = [n // classes + (1 if c < n % classes else 0) for c in range(classes)]
    palettes = [class_palette(seed, kind, c) for c in range(classes)]
    total_bytes = sum_w = sum_h = 0
    index = 0
    for c, count in enumerate(counts):
        class_dir = tmp / f"class_{c:0{class_width}d}"
        class_dir.mkdir()
        for _ in range(count):
            data, (w, h) = make(image_rng(seed, kind, index), palettes[c])
            (class_dir / f"img_{index:0{index_width}d}{ext}").write_bytes(data)
            total_bytes += len(data)
            sum_w += w
            sum_h += h
            index += 1
            bar.update(1)
    return total_bytes, sum_w, sum_h


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
