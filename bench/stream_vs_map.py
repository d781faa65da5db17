"""Streams against map-style reading of the same local shards, both through
``fastdata.loader()`` with its defaults.

    python bench/stream_vs_map.py [--repeat 3] [--epochs 3]

Generates the demo photos (512 JPEGs, decoded to 224x224) and tiny images
(10,000 32x32 PNGs, as stored), packs each into tar shards, and reads them
with ``open_dataset(..., streaming=True)`` and map-style, each through
``fastdata.loader(ds)`` (float32 batches of 64, shuffled), alternately (each
first in turn), ``--repeat`` times. Prints samples/s (best epoch after a warm-up one) and the
stream/map ratio of the best of each, with the way ``loader()`` chose to run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def rate(path: str, streaming: bool, size, epochs: int) -> tuple[float, str]:
    import fastdata

    ds = fastdata.open_dataset(path, streaming=streaming, decode=fastdata.Decode(size=size),
                               order=fastdata.Order(shuffle=True, batch_size=64))
    loader = fastdata.loader(ds)
    best = 0.0
    for epoch in range(1 + epochs):
        start = time.perf_counter()
        n = sum(len(batch[1]) for batch in loader)
        if epoch:
            best = max(best, n / (time.perf_counter() - start))
    ds.close()
    return best, str(loader.choice).split(":")[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    import fastdata
    from fastdata.demo import synthesize

    with tempfile.TemporaryDirectory() as tmp:
        for kind, n, size, per_shard in (("photos", 512, (224, 224), 128),
                                         ("tiny", 10000, None, 1000)):
            synthesize(os.path.join(tmp, kind), kind=kind, n=n, seed=0, progress=False)
            path = fastdata.pack(os.path.join(tmp, kind), os.path.join(tmp, f"{kind}-%06d.tar"),
                                 options=fastdata.PackOptions(shard_size=per_shard),
                                 progress=False).output
            best = {True: 0.0, False: 0.0}
            figures = {True: [], False: []}
            how = {}
            for r in range(args.repeat):
                # Each goes first in turn: the second of a pair runs on a warmer machine.
                for streaming in ((False, True) if r % 2 == 0 else (True, False)):
                    r, how[streaming] = rate(path, streaming, size, args.epochs)
                    figures[streaming].append(r)
                    best[streaming] = max(best[streaming], r)
            print(f"{kind} ({n} in tar shards of {per_shard}), loader() defaults:")
            for streaming, name in ((False, "map-style"), (True, "stream")):
                runs = ", ".join(f"{r:,.0f}" for r in figures[streaming])
                print(f"  {name:9} {runs} samples/s  [{how[streaming]}]")
            print(f"  stream / map-style, best against best: {best[True] / best[False]:.2f}")


if __name__ == "__main__":
    main()
