"""How ImageNet-like are fastdata's synthetic photos? Their figures next to real ones.

Runs ``synthesize(kind="photos", n=512, seed=0)`` pinned to one CPU core and
prints, for the JPEGs it writes: mean file size, mean width x height, bytes per
pixel, and the decode rate on one core with PIL (``Image.open`` +
``convert("RGB")``) and with OpenCV (``cv2.imdecode``), in images/s and in ms
per megapixel. Next to them, the same figures for:

* the synthetic pixels re-encoded like the real photos below (quality 90,
  4:4:4): a like-for-like check that they cost what real photos cost per byte;
* the real photos that ship with scikit-learn (china.jpg and flower.jpg,
  640x427), re-encoded by Pillow at quality 90 without chroma subsampling, as
  most ImageNet JPEGs are (skipped without scikit-learn);
* ImageNet ILSVRC-2012 train, as fixed reference figures (not measured here):
  mean file size about 110 KB (0.6-0.8 bytes/pixel), and from the project's
  design notes, on this kind of machine one core decodes a ~500x375 ImageNet
  JPEG at about 460 images/s with PIL and about 1,000 with OpenCV.

Decode timings alternate between the sets, round after round, and keep each
set's best round, so every column sees the same machine state. On shared
virtual machines absolute rates drift by up to ~1.5x from run to run; compare
the columns of one run.

    python bench/synth_realism.py [--n 512] [--sample 48] [--rounds 5]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fastdata.demo import synthesize  # noqa: E402
from fastdata.demo.palette import class_palette, image_rng  # noqa: E402
from fastdata.demo.photos import photo_image  # noqa: E402

# ImageNet ILSVRC-2012 train, reference figures (not measured by this script).
IMAGENET_MEAN_FILE_KB = 110.0  # mean JPEG size, about 110 KB
IMAGENET_BYTES_PER_PIXEL = (0.6, 0.8)
IMAGENET_MEAN_WH = "~400x350-500x375"
# From the design notes, "measured on this kind of machine": one core decodes a
# ~500x375 JPEG at ~460 img/s with PIL, ~1,000 img/s with OpenCV.
IMAGENET_REF_WH = (500, 375)
IMAGENET_PIL_IMG_S = 460.0
IMAGENET_CV2_IMG_S = 1000.0

REAL_QUALITY, REAL_SUBSAMPLING = 90, "4:4:4"


def _pin_one_core() -> None:
    # Figures are per core: pin the process (and so any library threads).
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})


def _encode(rgb: np.ndarray, quality: int, subsampling: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=quality, subsampling=subsampling)
    return buf.getvalue()


class _Set:
    """A list of JPEG files in memory and their best decode times per pass."""

    def __init__(self, name: str, blobs: list[bytes], sizes: list[tuple[int, int]]):
        self.name = name
        self.blobs = blobs
        self.arrays = [np.frombuffer(b, np.uint8) for b in blobs]
        self.sizes = sizes
        self.best = {"pil": float("inf"), "cv2": float("inf")}

    @property
    def n(self) -> int:
        return len(self.blobs)

    @property
    def pixels(self) -> int:
        return sum(w * h for w, h in self.sizes)

    @property
    def nbytes(self) -> int:
        return sum(len(b) for b in self.blobs)

    def time_round(self, min_s: float) -> None:
        import cv2

        def pil():
            for b in self.blobs:
                Image.open(io.BytesIO(b)).convert("RGB")

        def ocv():
            for a in self.arrays:
                cv2.imdecode(a, cv2.IMREAD_COLOR)

        for key, fn in (("pil", pil), ("cv2", ocv)):
            reps, t0 = 0, time.perf_counter()
            while True:  # small sets: repeat until the timing is long enough
                fn()
                reps += 1
                elapsed = time.perf_counter() - t0
                if elapsed >= min_s:
                    break
            self.best[key] = min(self.best[key], elapsed / reps)

    def rate(self, key: str) -> tuple[float, float]:
        """(images/s, ms per megapixel) for decoder ``key``."""
        t = self.best[key]
        return self.n / t, t * 1e3 / (self.pixels / 1e6)


def _real_photos() -> list[np.ndarray] | None:
    try:
        import sklearn
    except ImportError:
        return None
    folder = os.path.join(os.path.dirname(sklearn.__file__), "datasets", "images")
    return [np.asarray(Image.open(os.path.join(folder, f)).convert("RGB"))
            for f in ("china.jpg", "flower.jpg")]


def _synthetic_pixels(count: int, seed: int = 0, classes: int = 8) -> list[np.ndarray]:
    """The pixels of the first ``count`` images of a synthesize(seed=seed) run."""
    palettes = [class_palette(seed, "photos", c) for c in range(classes)]
    # Same class assignment as synthesize(): consecutive blocks per class.
    n = max(count, classes)
    counts = [n // classes + (1 if c < n % classes else 0) for c in range(classes)]
    labels = [c for c, k in enumerate(counts) for _ in range(k)]
    out = []
    for i in range(count):
        pixels, _ = photo_image(image_rng(seed, "photos", i), palettes[labels[i]])
        out.append(pixels)
    return out


def _kb(nbytes: float) -> str:
    return f"{nbytes / 1000:.1f} kB ({nbytes / 1024:.1f} KiB)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=512, help="images in the synthesize() run")
    ap.add_argument("--sample", type=int, default=48,
                    help="synthetic images re-encoded at q90 4:4:4 for the like-for-like column")
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds (best one kept)")
    args = ap.parse_args()
    _pin_one_core()
    import cv2

    cv2.setNumThreads(1)

    # 1. The synthetic dataset, exactly as `fastdata synth` writes it.
    with tempfile.TemporaryDirectory() as tmp:
        summary = synthesize(os.path.join(tmp, "photos"), kind="photos", n=args.n,
                             seed=0, progress=False)
        blobs, sizes = [], []
        for folder, _, names in sorted(os.walk(summary.root)):
            for name in sorted(names):
                with open(os.path.join(folder, name), "rb") as f:
                    blobs.append(f.read())
                with Image.open(io.BytesIO(blobs[-1])) as im:  # header only
                    sizes.append(im.size)
    sets = [_Set(f"synthetic (n={args.n})", blobs, sizes)]

    # 2. Like-for-like: synthetic pixels encoded like the real photos. Each
    #    like-for-like set has a flat-grey twin (same sizes and encoding): its
    #    decode time is the per-pixel fixed cost, leaving the cost per byte.
    def like_for_like(name: str, images: list[np.ndarray]) -> tuple[_Set, _Set]:
        dims = [(p.shape[1], p.shape[0]) for p in images]
        return (_Set(name, [_encode(p, REAL_QUALITY, REAL_SUBSAMPLING) for p in images], dims),
                _Set(name + " flat", [_encode(np.full_like(p, 128), REAL_QUALITY, REAL_SUBSAMPLING)
                                      for p in images], dims))

    sample = _synthetic_pixels(min(args.sample, args.n))
    pairs = [like_for_like(f"synth. px q{REAL_QUALITY} {REAL_SUBSAMPLING}", sample)]

    # 3. Real photos.
    real = _real_photos()
    if real is not None:
        pairs.append(like_for_like(f"sklearn q{REAL_QUALITY} {REAL_SUBSAMPLING}", real))
    sets += [s for s, _ in pairs]

    timed = sets + [flat for _, flat in pairs]
    for s in timed:  # warm up
        s.time_round(0.0)
        s.best = {"pil": float("inf"), "cv2": float("inf")}
    for _ in range(args.rounds):
        for s in timed:
            s.time_round(0.25)

    # 4. The table.
    ref_mp = IMAGENET_REF_WH[0] * IMAGENET_REF_WH[1] / 1e6
    cols = [s.name for s in sets] + ["ImageNet train (ref.)"]
    rows = [
        ("images", [str(s.n) for s in sets] + ["1.28M"]),
        ("mean file size", [_kb(s.nbytes / s.n) for s in sets]
         + [f"~{IMAGENET_MEAN_FILE_KB:.0f} KB"]),
        ("mean W x H", [f"{np.mean([w for w, _ in s.sizes]):.0f} x {np.mean([h for _, h in s.sizes]):.0f}"
                        for s in sets] + [IMAGENET_MEAN_WH]),
        ("bytes / pixel", [f"{s.nbytes / s.pixels:.3f}" for s in sets]
         + ["{:.1f}-{:.1f}".format(*IMAGENET_BYTES_PER_PIXEL)]),
    ]
    for key, label, ref in (("pil", "PIL decode, 1 core", IMAGENET_PIL_IMG_S),
                            ("cv2", "cv2 decode, 1 core", IMAGENET_CV2_IMG_S)):
        rows.append((label + " img/s", [f"{s.rate(key)[0]:.0f}" for s in sets]
                     + [f"~{ref:.0f} (500x375)"]))
        rows.append((label + " ms/MP", [f"{s.rate(key)[1]:.2f}" for s in sets]
                     + [f"~{1e3 / ref / ref_mp:.1f}"]))
    if real is None:
        print("scikit-learn is not installed: no real photos to compare with (pip install scikit-learn)")
    widths = [max(22, *(len(r[0]) for r in rows))] + [
        max(len(c), *(len(r[1][i]) for r in rows)) for i, c in enumerate(cols)]
    line = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    print(f"JPEG figures on one core (Pillow {Image.__version__}, OpenCV {cv2.__version__}):")
    print(line.format("", *cols))
    for label, values in rows:
        print(line.format(label, *values))

    syn = sets[0]
    pil_rate = syn.rate("pil")[0]
    print(f"synthetic / ImageNet reference: file size x{syn.nbytes / syn.n / 1000 / IMAGENET_MEAN_FILE_KB:.2f}, "
          f"PIL img/s x{pil_rate / IMAGENET_PIL_IMG_S:.2f}, cv2 img/s x{syn.rate('cv2')[0] / IMAGENET_CV2_IMG_S:.2f}")
    per_kib = [(s.best["pil"] - flat.best["pil"]) / (s.nbytes / 1024) for s, flat in pairs]
    text = ", ".join(f"{s.name} {c * 1e6:.1f} us" for (s, _), c in zip(pairs, per_kib))
    if real is not None:
        text += f" (synthetic/real x{per_kib[0] / per_kib[1]:.2f})"
    print(f"PIL decode time per KiB of JPEG data, above the per-pixel cost of a flat image: {text}")
    print(f"generation: synthesize(kind='photos', n={args.n}, seed=0) on one core: "
          f"{summary.images / summary.seconds:.0f} images/s ({summary.seconds:.2f} s)")


if __name__ == "__main__":
    main()
