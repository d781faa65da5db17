"""Near-duplicates (``fastdata dedup --near``): how well planted copies are
found, and what the hash index costs at 10^5-10^6 records.

    python bench/near_dups.py planted              # precision/recall per threshold
    python bench/near_dups.py planted --flip       # mirrored copies counted too
    python bench/near_dups.py index --sizes 100000,1000000

``planted`` makes ``--n`` photo-like JPEGs (fastdata's demo generator), then
for ``--originals`` of them one copy of each kind: resized to half, re-encoded
at quality 40, cropped by 3% per side, and mirrored; packs everything into
LMDB and runs ``fastdata.dedup(near=True)`` at several thresholds. A pair
reported is right when both records come from one original; recall is per
kind of copy (found in its original's group). The hashing rate is printed.

``index`` times the index alone (``fastdata.near_duplicates.near_pairs``) on
synthetic hashes: uniformly random 63-bit values, 1% of them near copies of
another (0 to the threshold's bits changed), and checks that every planted
pair is found. Real hashes cluster more than uniform ones, so real buckets
are fuller: these are the index's best case, the planted run its real one.
"""

from __future__ import annotations

import argparse
import io
import itertools
import os
import resource
import shutil
import sys
import tempfile
import time

import numpy as np

KINDS = ("resized", "reencoded", "cropped", "mirrored")


def _copies(path: str) -> dict[str, bytes]:
    from PIL import Image

    image = Image.open(path).convert("RGB")
    w, h = image.size

    def jpeg(im, quality=90):
        out = io.BytesIO()
        im.save(out, "JPEG", quality=quality)
        return out.getvalue()

    cut = (int(w * .03), int(h * .03), w - int(w * .03), h - int(h * .03))
    return {"resized": jpeg(image.resize((w // 2, h // 2), Image.BILINEAR)),
            "reencoded": jpeg(image, 40), "cropped": jpeg(image.crop(cut)),
            "mirrored": jpeg(image.transpose(Image.FLIP_LEFT_RIGHT))}


def planted(args) -> None:
    import fastdata
    from fastdata.demo import synthesize

    work = tempfile.mkdtemp(prefix="near-")
    try:
        src = os.path.join(work, "src")
        synthesize(src, kind="photos", n=args.n, seed=1, progress=False)
        files = sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs)
        rng = np.random.default_rng(0)
        originals = sorted(rng.choice(len(files), args.originals, replace=False).tolist())
        origin = {}  # key -> original key (itself for originals)
        for f in files:
            origin[os.path.relpath(f, src)] = os.path.relpath(f, src)
        for k in originals:
            for kind, data in _copies(files[k]).items():
                key = os.path.relpath(files[k], src).replace(".jpg", f"-{kind}.jpg")
                with open(os.path.join(src, key), "wb") as out:
                    out.write(data)
                origin[key] = os.path.relpath(files[k], src)
        out = os.path.join(work, "d.lmdb")
        fastdata.pack(src, out, progress=False)
        n = len(origin)
        print(f"{n} images: {len(files)} photos, {args.originals} of them copied 4 ways "
              f"({', '.join(KINDS)}); flip={args.flip}")
        print("threshold  pairs  precision  " + "  ".join(f"{k:>9}" for k in KINDS))
        for threshold in args.thresholds:
            start = time.perf_counter()
            report = fastdata.dedup(out, near=True, threshold=threshold, flip=args.flip,
                                    progress=False)
            seconds = time.perf_counter() - start
            pairs = right = 0
            group_of = {}
            for number, g in enumerate(report.groups):
                keys = [m.key for m in g.members]
                for a, b in itertools.combinations(keys, 2):
                    pairs += 1
                    right += origin[a] == origin[b]
                group_of.update((key, number) for key in keys)
            recall = []
            for kind in KINDS:
                copies = [k for k in origin if k.endswith(f"-{kind}.jpg")]
                found = sum(k in group_of and group_of.get(origin[k]) == group_of[k]
                            for k in copies)
                recall.append(found / len(copies))
            precision = right / pairs if pairs else 1.0
            print(f"{threshold:>9}  {pairs:>5}  {precision:>9.3f}  "
                  + "  ".join(f"{r:>9.3f}" for r in recall)
                  + f"   ({seconds:.1f} s, {n / seconds:,.0f} img/s with the pass)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def index(args) -> None:
    from fastdata.near_duplicates import near_pairs

    rng = np.random.default_rng(0)
    for n in args.sizes:
        hashes = rng.integers(0, 1 << 63, n, dtype=np.uint64)
        planted = n // 100
        a = rng.choice(n, planted, replace=False)
        b = rng.choice(np.setdiff1d(np.arange(n), a), planted, replace=False)
        for i, j in zip(a.tolist(), b.tolist()):
            flips = rng.choice(63, int(rng.integers(0, args.threshold + 1)), replace=False)
            value = int(hashes[i])
            for bit in flips.tolist():
                value ^= 1 << bit
            hashes[j] = value
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        pairs = near_pairs(hashes, args.threshold)
        seconds = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        found = {(int(x), int(y)) for x, y in pairs[:, :2].tolist()}
        missed = sum((min(i, j), max(i, j)) not in found for i, j in zip(a.tolist(), b.tolist()))
        print(f"{n:>9,} records, threshold {args.threshold}: {seconds:6.2f} s, "
              f"{len(pairs):,} pairs ({planted:,} planted, {missed} missed), "
              f"peak RSS {peak / 1024:,.0f} MB (+{(peak - before) / 1024:,.0f} MB)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("planted")
    p.add_argument("--n", type=int, default=400)
    p.add_argument("--originals", type=int, default=50)
    p.add_argument("--flip", action="store_true")
    p.add_argument("--thresholds", type=lambda s: [int(x) for x in s.split(",")],
                   default=[4, 6, 8, 10, 12])
    p.set_defaults(run=planted)
    q = sub.add_parser("index")
    q.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                   default=[100_000, 1_000_000])
    q.add_argument("--threshold", type=int, default=8)
    q.set_defaults(run=index)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    sys.exit(main())
