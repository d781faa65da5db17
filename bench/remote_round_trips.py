"""Round trips before the first batch of a dataset at a URL.

    python bench/remote_round_trips.py [--delay-ms 100] [--photos 2000]

Serves 2,000 tiny images in tar shards of 100 with the test suite's HTTP
server (tests/servers.py), which holds each request --delay-ms before its
answer, then opens the dataset (a stream and map-style, shuffled, batch 64)
and takes its first batch through ``fastdata.loader``. It prints the seconds
from the open to the first batch at the delay and at 0 ms (the CPU's share),
the round trips of waiting between them, and each request with the time it
reached the server. torch and fastdata are imported before the clock starts.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]


def first_batch(url: str, streaming: bool, server, delay: float) -> tuple[float, list]:
    """Seconds from the open to the first batch, and the requests (seconds
    after the open, path, Range) in the order they reached the server."""
    import servers

    import fastdata

    server.server.delay = delay
    seen: list = []
    began = time.perf_counter()
    original = servers.RangeHandler._send

    def send(self, body):
        seen.append((time.perf_counter() - began, self.path, self.headers.get("Range")))
        return original(self, body)

    servers.RangeHandler._send = send
    try:
        os.environ["FASTDATA_CACHE_DIR"] = tempfile.mkdtemp()
        began = time.perf_counter()
        ds = fastdata.open_dataset(url, streaming=streaming,
                                   order=fastdata.Order(shuffle=True, batch_size=64))
        next(iter(fastdata.loader(ds)))
        return time.perf_counter() - began, seen
    finally:
        servers.RangeHandler._send = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay-ms", type=float, default=100.0)
    parser.add_argument("--photos", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=12, help="requests listed per run")
    args = parser.parse_args()

    import torch  # noqa: F401  (imported before the clock starts)
    from servers import HTTPServer

    import fastdata
    import fastdata.loaders.datasets  # noqa: F401
    from fastdata.demo import synthesize

    with tempfile.TemporaryDirectory() as tmp:
        synthesize(os.path.join(tmp, "src"), kind="tiny", n=args.photos, seed=3)
        www = os.path.join(tmp, "www")
        fastdata.pack(os.path.join(tmp, "src"), os.path.join(www, "d-%06d.tar"),
                      options=fastdata.PackOptions(shard_size=100), progress=False)
        server = HTTPServer(www)
        url = f"{server.url}/d.tar.fastdata.json"
        delay = args.delay_ms / 1000
        try:
            for way in ("stream", "map"):
                first_batch(url, way == "stream", server, 0.0)      # warm: imports, pools
                cpu, _ = first_batch(url, way == "stream", server, 0.0)
                wall, seen = first_batch(url, way == "stream", server, delay)
                print(f"{way}: first batch {wall:.2f} s after the open at {args.delay_ms:g} ms "
                      f"per request, {cpu:.2f} s at 0 ms: {(wall - cpu) / delay:.1f} round "
                      f"trips of waiting; {len(seen)} requests")
                for at, path, rng in seen[:args.requests]:
                    print(f"  {at:6.3f} s  {path}{'  ' + rng if rng else ''}")
        finally:
            server.close()


if __name__ == "__main__":
    main()
