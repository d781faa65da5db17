"""Shared fixtures and helpers for the fastdata test suite.

Everything is generated at test time in ``tmp_path``: tiny images (8-40 px)
written with numpy + Pillow. Nothing touches the network.

The expected class/sample mapping is computed here with torchvision's
ImageFolder algorithm re-implemented (torchvision is not installed and is not
needed), never with fastdata's own source scanner:

* classes = sorted names of the non-hidden sub-folders of the root;
* for each class, in label order::

      for root, _, fnames in sorted(os.walk(class_dir, followlinks=True)):
          for fname in sorted(fnames):
              keep it if its lower-cased extension is in IMG_EXTENSIONS

fastdata deliberately differs from torchvision in one way, which the
re-implementation mirrors: hidden entries (names starting with ".") are never
classes nor samples, at any depth.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import allowed_skips
import numpy as np
import pytest
import toyformat
from clusters import dask, ray_address, staging  # noqa: F401
from emulators import azure_env, azure_server, gcs_env, gcs_server  # noqa: F401
from PIL import Image
from servers import http_server, s3_env, s3_server, s3_server_auth, s3_server_fresh  # noqa: F401

# A format defined by the test suite itself: the contract tests, parametrized
# over the registry, cover it exactly like the built-in formats.
toyformat.register()
TESTS_DIR = str(Path(__file__).parent)

# torchvision's IMG_EXTENSIONS, written out (torchvision is not installed): what
# ImageFolder takes, and what fastdata packs by default.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
ACCEPTED_EXTENSIONS = IMG_EXTENSIONS
# What make_image_bytes writes: torchvision's and ".gif" (a tree's GIFs are images,
# ignored unless a pack asks for them with extensions="+gif").
IMAGE_FILE_EXTENSIONS = IMG_EXTENSIONS + (".gif",)

#: The default tree. Entries ending in "/" are (possibly empty) folders; every
#: other entry is a file whose content follows from its extension (an image for
#: an accepted extension, text or junk otherwise). Class names sort
#: non-trivially ("A_cls" < "b_cls" < "c10" < "c2" < "z_empty" by code point),
#: file and folder names too ("Z" < "_" < "a"; "sub-x" < "sub/deep" because
#: "-" < "/").
DEFAULT_SPEC: tuple[str, ...] = (
    # class A_cls: nested folders, upper-case extensions, hidden entries, a .txt
    "A_cls/img0.jpg",
    "A_cls/IMG1.JPEG",
    "A_cls/sub/z.webp",
    "A_cls/sub/deep/x.png",
    "A_cls/sub-x/y.bmp",
    "A_cls/notes.txt",
    "A_cls/.hidden.jpg",
    "A_cls/.hid_dir/h.png",
    # class b_cls
    "b_cls/b0.Png",
    "b_cls/b1.ppm",
    "b_cls/B4.TIFF",
    "b_cls/nested/b2.tif",
    "b_cls/nested/b3.gif",  # an image, but not torchvision's: ignored by default
    "b_cls/nested/more/b5.pgm",
    # class c10 ("c10" sorts before "c2")
    "c10/a.jpeg",
    "c10/Z.jpg",
    "c10/_u.png",
    "c10/thumbs.db",
    # class c2
    "c2/x.PPM",
    "c2/p.png",
    "c2/\u00fcn\u00ef.png",
    # an empty class (with an empty sub-folder): keeps its label
    "z_empty/",
    "z_empty/sub/",
    # hidden class folder and hidden / stray files at the root
    ".hidden_cls/h.jpg",
    ".DS_Store",
    "README.txt",
)

#: The classes of DEFAULT_SPEC, in label order (written out as a sanity check
#: of the re-implementation itself).
DEFAULT_CLASSES = ["A_cls", "b_cls", "c10", "c2", "z_empty"]

#: The sample keys of DEFAULT_SPEC in torchvision order, written out by hand.
DEFAULT_KEYS = [
    "A_cls/IMG1.JPEG",
    "A_cls/img0.jpg",
    "A_cls/sub/z.webp",
    "A_cls/sub-x/y.bmp",
    "A_cls/sub/deep/x.png",
    "b_cls/B4.TIFF",
    "b_cls/b0.Png",
    "b_cls/b1.ppm",
    "b_cls/nested/b2.tif",
    "b_cls/nested/more/b5.pgm",
    "c10/Z.jpg",
    "c10/_u.png",
    "c10/a.jpeg",
    "c2/p.png",
    "c2/x.PPM",
    "c2/\u00fcn\u00ef.png",
]


class Sample(NamedTuple):
    """One expected sample: its key (root-relative, "/"-separated), label and file bytes."""

    key: str
    label: int
    data: bytes


@dataclass
class ImageTree:
    """A generated ImageFolder tree and what torchvision would make of it."""

    root: Path
    classes: list[str]
    samples: list[Sample]
    ignored: list[str] = field(default_factory=list)

    @property
    def keys(self) -> list[str]:
        return [s.key for s in self.samples]

    @property
    def labels(self) -> list[int]:
        return [s.label for s in self.samples]

    @property
    def payloads(self) -> list[bytes]:
        return [s.data for s in self.samples]

    @property
    def class_counts(self) -> list[int]:
        counts = Counter(s.label for s in self.samples)
        return [counts.get(i, 0) for i in range(len(self.classes))]

    def __len__(self) -> int:
        return len(self.samples)


# -- the torchvision mapping, re-implemented --------------------------------------


def torchvision_classes(root: str | os.PathLike) -> list[str]:
    """Sorted non-hidden sub-folder names (torchvision's find_classes, minus hidden)."""
    return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))


def torchvision_samples(root: str | os.PathLike,
                        extensions: tuple[str, ...] = ACCEPTED_EXTENSIONS) -> list[Sample]:
    """torchvision's make_dataset order, with file bytes, skipping hidden entries."""
    root = os.fspath(root)
    out = []
    for label, name in enumerate(torchvision_classes(root)):
        class_dir = os.path.join(root, name)
        for dirpath, _, fnames in sorted(os.walk(class_dir, followlinks=True)):
            rel_dir = os.path.relpath(dirpath, class_dir)
            if any(part.startswith(".") for part in Path(rel_dir).parts if part != "."):
                continue
            for fname in sorted(fnames):
                if fname.startswith("."):
                    continue
                if not fname.lower().endswith(extensions):
                    continue
                path = os.path.join(dirpath, fname)
                key = os.path.relpath(path, root).replace(os.sep, "/")
                with open(path, "rb") as f:
                    out.append(Sample(key, label, f.read()))
    return out


# -- image generation ---------------------------------------------------------------


def _seed_for(name: str, seed: int) -> int:
    return zlib.crc32(f"{seed}:{name}".encode("utf-8"))


def make_image_bytes(ext: str, *, size: tuple[int, int] | None = None, seed: int = 0,
                     name: str = "") -> bytes:
    """Encode a small random image in the format that ``ext`` calls for.

    Args:
        ext: file extension with dot, any letter case.
        size: (width, height); default: random in 8..40 from the seed.
        seed, name: make the pixels (and so the bytes) deterministic.
    """
    rng = np.random.default_rng(_seed_for(name, seed))
    w, h = size if size is not None else (int(rng.integers(8, 41)), int(rng.integers(8, 41)))
    pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    img = Image.fromarray(pixels, "RGB")
    ext = ext.lower()
    buf = io.BytesIO()
    if ext in (".jpg", ".jpeg"):
        img.save(buf, "JPEG", quality=90)
    elif ext == ".png":
        mode = ("RGB", "RGBA", "L")[int(rng.integers(0, 3))]
        if mode == "RGBA":
            alpha = rng.integers(0, 256, size=(h, w, 1), dtype=np.uint8)
            img = Image.fromarray(np.concatenate([pixels, alpha], axis=2), "RGBA")
        elif mode == "L":
            img = img.convert("L")
        img.save(buf, "PNG")
    elif ext == ".bmp":
        img.save(buf, "BMP")
    elif ext == ".webp":
        img.save(buf, "WEBP", quality=80)
    elif ext == ".ppm":
        img.save(buf, "PPM")
    elif ext == ".pgm":
        img.convert("L").save(buf, "PPM")
    elif ext in (".tif", ".tiff"):
        img.save(buf, "TIFF")
    elif ext == ".gif":
        img.convert("P", palette=Image.Palette.ADAPTIVE).save(buf, "GIF")
    else:
        raise ValueError(f"no image format for extension {ext!r}")
    return buf.getvalue()


def _content_for(rel: str, *, size, seed) -> bytes:
    name = rel.rsplit("/", 1)[-1]
    ext = os.path.splitext(name)[1].lower()
    if ext in IMAGE_FILE_EXTENSIONS:
        return make_image_bytes(ext, size=size, seed=seed, name=rel)
    if ext == ".txt":
        return f"not an image: {rel}\n".encode()
    return b"\x00\x01junk\xff" + rel.encode()


def make_image_tree(root: str | os.PathLike, spec=DEFAULT_SPEC, *,
                    size: tuple[int, int] | None = None, seed: int = 0,
                    order: str = "reverse",
                    extensions: tuple[str, ...] = ACCEPTED_EXTENSIONS) -> list[Sample]:
    """Build an ImageFolder tree under ``root`` and return its expected samples.

    Args:
        root: the folder to create (may exist).
        spec: relative paths; a trailing "/" makes a folder, anything else a
            file (an image for an accepted extension, text or junk otherwise).
        size: (width, height) of every image (equal sizes let a DataLoader
            collate tensors); default random 8..40 px per image.
        seed: changes every image's pixels.
        order: "reverse", "sorted" or "random" (seeded): the order in which the
            entries are created, so tests can check it never matters.
        extensions: the extensions the expected samples have (torchvision's by
            default; IMAGE_FILE_EXTENSIONS for a pack with extensions="+gif").

    Returns:
        ``[(key, label, bytes), ...]`` in torchvision order (see module doc).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    entries = list(spec)
    if order == "reverse":
        entries.reverse()
    elif order == "random":
        random.Random(seed).shuffle(entries)
    elif order != "sorted":
        raise ValueError(order)
    for rel in entries:
        path = root / rel
        if rel.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_content_for(rel, size=size, seed=seed))
    return torchvision_samples(root, extensions)


def build_tree(root, spec=DEFAULT_SPEC, **kwargs) -> ImageTree:
    """``make_image_tree`` (same arguments) as an ImageTree."""
    samples = make_image_tree(root, spec, **kwargs)
    return ImageTree(Path(root), torchvision_classes(root), samples)


def uniform_spec(classes=("cat", "dog", "eel"), per_class: int = 6,
                 exts=(".png", ".jpg", ".bmp", ".webp", ".ppm", ".tif")) -> tuple[str, ...]:
    """A flat spec with ``per_class`` images per class, cycling through ``exts``."""
    return tuple(f"{c}/img{i:03d}{exts[(i + j) % len(exts)]}"
                 for j, c in enumerate(classes) for i in range(per_class))


#: Ten classes of uneven sizes: 47 records, a prime, so no rank count divides it.
UNEVEN_COUNTS = (3, 6, 2, 8, 4, 7, 1, 9, 5, 2)


def uneven_spec(counts=UNEVEN_COUNTS, exts=(".png", ".bmp", ".ppm")) -> tuple[str, ...]:
    """A flat spec with ``counts[k]`` images in class ``class{k}`` (lossless
    formats by default: a sample's bytes identify it)."""
    return tuple(entry for k, count in enumerate(counts)
                 for entry in uniform_spec((f"class{k}",), count, exts))


# -- decoding / comparing ---------------------------------------------------------------


def expected_rgb(data: bytes) -> np.ndarray:
    """HWC uint8 RGB, as torchvision's PIL loader gives it."""
    with Image.open(io.BytesIO(data)) as img:
        return np.array(img.convert("RGB"))


def expected_chw(data: bytes) -> np.ndarray:
    return np.ascontiguousarray(expected_rgb(data).transpose(2, 0, 1))


def is_jpeg(data: bytes) -> bool:
    return data[:3] == b"\xff\xd8\xff"


def assert_pixels(actual, data: bytes, *, chw: bool = False, what: str = "") -> None:
    """``actual`` (HWC, or CHW with ``chw``) holds the pixels of the encoded ``data``
    as Pillow's ``convert("RGB")`` gives them: exactly for every lossless format,
    and within the documented decoder tolerance for JPEG (mean absolute
    difference below 1, a few levels at most), since fastdata may pick a faster
    JPEG decoder than Pillow."""
    actual = np.asarray(actual)
    expected = expected_chw(data) if chw else expected_rgb(data)
    assert actual.dtype == np.uint8, what
    assert actual.shape == expected.shape, what
    if is_jpeg(data):
        diff = np.abs(actual.astype(np.int16) - expected.astype(np.int16))
        assert diff.mean() < 1.0 and diff.max() <= 8, (what, diff.mean(), diff.max())
    else:
        assert np.array_equal(actual, expected), what


def pixel_digest(arr) -> str:
    """A short digest of an image array, to identify samples in any order."""
    import hashlib

    arr = np.ascontiguousarray(np.asarray(arr))
    return hashlib.sha1(arr.tobytes() + str(arr.shape).encode()).hexdigest()


def largest_data_file(path: str | os.PathLike, manifest=None) -> Path:
    """The largest file of a packed dataset: from ``manifest.shards[*].path``
    (relative to the dataset) when given, else by walking the output path."""
    path = Path(path)
    candidates = []
    if manifest is not None:
        base = path if path.is_dir() else path.parent
        for shard in manifest.shards:
            p = base / shard["path"]
            if not p.exists() and path.is_file():
                p = path
            if p.is_file():
                candidates.append(p)
    if not candidates:
        if path.is_file():
            candidates = [path]
        else:
            candidates = [Path(r) / f for r, _, fs in os.walk(path) for f in fs]
    return max(candidates, key=lambda p: p.stat().st_size)


def truncate_to_half(path: Path) -> int:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    return size // 2


def run_python(code: str, *args: str, timeout: float = 120,
               **kwargs) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter; output captured as text."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.fixture
def refused_port():
    """A port of 127.0.0.1 where every connection is refused, for the whole test:
    it is bound here (so nothing else can take it) but not listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def run_ranks(script: str, world: int, args, tmp_path, *, timeout: float = 90,
              name: str = "rank") -> list[dict]:
    """Run ``script`` as ``world`` torch.distributed ranks, one real process each.

    Every rank gets ``INIT RANK WORLD OUT *args`` (a gloo ``init_method``: a
    ``file://`` rendezvous in ``tmp_path``, so no port is picked) and writes a
    JSON result to OUT, which is returned, in rank order. A rank that fails
    fails the test with its output; ranks that are still running after
    ``timeout`` seconds (a hang, e.g. a collective that one rank never joins)
    are killed with their DataLoader workers and fail the test instead of
    blocking the suite.
    """
    import fastdata

    # A new file each run: a killed run leaves its store behind.
    init = Path(tempfile.mkdtemp(prefix=f"{name}-init-", dir=tmp_path), "store").as_uri()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(fastdata.__file__))),
         os.environ.get("PYTHONPATH", "")]))
    outs = [Path(tmp_path) / f"{name}{r}.json" for r in range(world)]
    logs = [Path(tmp_path) / f"{name}{r}.log" for r in range(world)]
    procs = []
    try:
        for r in range(world):
            with open(logs[r], "w") as log:  # a file: a chatty rank never fills a pipe
                # A session of its own: a hang is killed with the rank's workers.
                procs.append(subprocess.Popen(
                    [sys.executable, "-c", textwrap.dedent(script), init, str(r),
                     str(world), str(outs[r]), *map(str, args)],
                    stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                break  # one rank failed: the others may wait for it forever
            if time.monotonic() > deadline:
                pytest.fail(f"ranks still running after {timeout}s (a hang): "
                            + _rank_logs(procs, logs))
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    codes = [p.returncode for p in procs]
    if any(codes):
        pytest.fail(f"ranks exited with {codes} (-9: killed after another failed): "
                    + _rank_logs(procs, logs))
    return [json.loads(o.read_text()) for o in outs]


def _rank_logs(procs, logs) -> str:
    return "".join(f"\n--- rank {r} (exit {p.poll()}):\n{log.read_text()[-3000:]}"
                   for r, (p, log) in enumerate(zip(procs, logs)))


def list_partials(folder: str | os.PathLike) -> list[str]:
    """Leftover temporary entries of an interrupted or failed write."""
    return sorted(n for n in os.listdir(folder) if "partial" in n or n.endswith(".old"))


# -- fixtures ---------------------------------------------------------------------


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: slower tests (spawned DataLoader workers, subprocesses); "
                   "deselect with -m 'not slow'")


# Under FASTDATA_CI=1 a skip that tests/allowed_skips.py does not allow fails the
# run: a broken install must not quietly drop the tests of what it lacks.
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    allowed_skips.enforce(report)
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_make_collect_report(collector):
    report = yield     # a module skipped whole: optional.require at its top
    allowed_skips.enforce(report)
    return report


def pytest_terminal_summary(terminalreporter):
    lines = allowed_skips.summary_lines(terminalreporter.stats.get("skipped", []))
    if lines:
        title = ("skips FASTDATA_CI=1 allows (tests/allowed_skips.py)"
                 if allowed_skips.in_ci() else "skips by reason")
        terminalreporter.write_sep("-", title)
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture
def image_tree(tmp_path) -> ImageTree:
    """The default tree (DEFAULT_SPEC) under ``tmp_path/src``."""
    return build_tree(tmp_path / "src")


@pytest.fixture
def packed(tmp_path, request):
    """Factory: ``pack_to(fmt_ext, tree=None, name="out", **pack_options)`` packs
    ``tree`` (default: the ``image_tree`` fixture) into ``tmp_path/packed/NAME+EXT``
    with ``fastdata.pack`` and returns the output path."""
    import fastdata
    from fastdata.packers.pack import PackOptions

    def pack_to(fmt_ext: str, tree: ImageTree | None = None, name: str = "out",
                **options) -> Path:
        if tree is None:
            tree = request.getfixturevalue("image_tree")
        out = tmp_path / "packed" / f"{name}{fmt_ext}"
        fastdata.pack(tree.root, out, options=PackOptions(**options), progress=False)
        return out

    return pack_to


@pytest.fixture
def pack_to(packed):
    """Alias of ``packed``."""
    return packed


@contextlib.contextmanager
def no_hang(seconds: int = 20):
    """Fail (instead of hanging the suite) if the block runs too long."""
    def on_alarm(signum, frame):
        raise TimeoutError(f"no result within {seconds}s: the reader hangs")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def lmdb_get(path, key: bytes) -> bytes:
    """One value read with the plain lmdb module (nothing of fastdata involved)."""
    import lmdb

    env = lmdb.open(os.fspath(path), subdir=True, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return bytes(txn.get(key))
    finally:
        env.close()


def lmdb_put(path, items: dict[bytes, bytes]) -> None:
    """Rewrite keys with the plain lmdb module (nothing of fastdata involved)."""
    import lmdb

    env = lmdb.open(os.fspath(path), subdir=True)
    try:
        with env.begin(write=True) as txn:
            for key, value in items.items():
                txn.put(key, value)
    finally:
        env.close()


class Interrupt:
    """Replace ``os.<name>`` so that its ``n``-th call raises KeyboardInterrupt."""

    def __init__(self, monkeypatch, name: str, n: int) -> None:
        self.real = getattr(os, name)
        self.calls = 0
        self.n = n
        monkeypatch.setattr(os, name, self)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt
        return self.real(*args, **kwargs)
