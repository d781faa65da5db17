"""Reading tar shards over http through a proxy that adds latency and caps the
bandwidth, against the same shards on local disk, with the loaders' defaults.

    python bench/remote_latency.py [--photos 6144] [--shards-of 128]
                                   [--delays 0,20,40,80] [--rate 60] [--repeat 1]
                                   [--workers N] [--json FILE]

Packs generated ImageNet-like photos into tar shards of --shards-of records
(pack-time shuffled), serves them with nginx on 127.0.0.1 (``start_nginx`` of
storage_ranges.py) and puts a proxy of its own in front (this file run with
--proxy-serve, asyncio streams, its own process). The proxy holds each request
--delay ms before sending it on (time to first byte, as a far object store
adds) and sends each connection's responses at most --rate MB/s (a token
bucket per connection; 0: unlimited), so reading many connections at once
pays and one connection at a time does not. It counts requests, body bytes
and the connections used at once.

For the local folder, then each delay (--repeat rounds, interleaved so that
the machine's drift hits every row alike), it reads one epoch at 224x224,
batch 64, shuffled, with what a user gets by default:

- stream: ``open_dataset(path, streaming=True, ...)`` then ``fastdata.loader``;
- map: ``open_dataset(path, ...)`` (the map-style TarDataset) then ``fastdata.loader``;

each with an empty shard cache, and prints samples/s over the epoch (from
creating the iterator to its end; its ratio to local), samples/s from the
first batch on, the time to the first batch, and what went through the proxy.
Loopback: nginx and the proxy run on the cores that decode (their CPU seconds
are printed); the local files are in the page cache, which favours local.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from urllib.parse import parse_qs, urlsplit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from storage_ranges import cpu_seconds, start_nginx

#: Bytes a connection may send at once past its rate (the token bucket's size),
#: and the chunk read from upstream: small next to a record, so pacing is smooth.
BURST = 64 * 1024
#: Errors that end one connection (client gone, upstream gone, a malformed
#: message); the proxy goes on serving the others.
CONNECTION_ERRORS = (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError,
                     IndexError)


# --- the proxy (its own process: its CPU time is not the loader's) ---------------------------

def _parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    """(first line, headers with lower-case names) of an HTTP message head."""
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return lines[0], headers


class Pacer:
    """A token bucket for one connection, reading the proxy's rate at each send
    (a pooled connection outlives a run, the rate may change between runs)."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy, self.tokens, self.last = proxy, float(BURST), time.monotonic()

    async def send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        rate = self.proxy.rate
        if rate > 0:
            now = time.monotonic()
            self.tokens = min(BURST, self.tokens + (now - self.last) * rate) - len(data)
            self.last = now
            if self.tokens < 0:       # in debt: wait until the bucket has refilled it
                await asyncio.sleep(-self.tokens / rate)
        writer.write(data)
        await writer.drain()


class Proxy:
    """Forwards each client connection to one upstream connection, requests in
    turn (HTTP/1.1 keep-alive), each after ``delay`` seconds. ``/__stats``,
    ``/__reset`` and ``/__set?delay_ms=&rate_mbps=`` are answered here."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.delay, self.rate = 0.0, 0.0          # seconds; bytes/s (0: unlimited)
        self.open = 0            # client connections open now, used or not
        self.generation = 0      # bumped by /__reset: which connections count as used
        self.reset()

    def reset(self) -> None:
        self.generation += 1
        # Connections pooled by an earlier run stay open but idle: only those
        # that carry a request after the reset count as used (live, peak).
        self.requests = self.bytes = self.live = self.peak = self.connections = 0

    def stats(self) -> dict:
        return {"requests": self.requests, "bytes": self.bytes, "peak_connections": self.peak,
                "open_connections": self.open, "connections_used": self.connections,
                "delay_ms": self.delay * 1000, "rate_mbps": self.rate / 1e6}

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        up: list = [None]        # (reader, writer) to nginx, opened at the first request
        counted = 0              # the generation this connection was last counted in
        pacer = Pacer(self)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return       # the client closed between requests
                first, headers = _parse_head(head)
                method, target = first.split(" ")[:2]
                # GET/HEAD have no body; one given is forwarded with its request.
                head += await reader.readexactly(int(headers.get("content-length", 0)))
                if target.startswith("/__"):
                    await self._control(target, writer)
                    continue
                if counted != self.generation:
                    counted = self.generation
                    self.live += 1
                    self.connections += 1
                    self.peak = max(self.peak, self.live)
                self.requests += 1
                if self.delay:
                    await asyncio.sleep(self.delay)
                keep = await self._forward(up, head, method, writer, pacer)
                if not keep or headers.get("connection", "").lower() == "close":
                    return
        except CONNECTION_ERRORS:
            pass                 # this connection ends; the proxy serves on
        finally:
            self.open -= 1
            if counted == self.generation:
                self.live -= 1
            writer.close()
            if up[0]:
                up[0][1].close()

    async def _forward(self, link: list, request: bytes, method: str, writer,
                       pacer: Pacer) -> bool:
        """Sends ``request`` upstream and relays its response; whether to keep
        going. ``link[0]``: the upstream connection (the caller closes it)."""
        for attempt in range(2):
            link[0] = up = link[0] or await asyncio.open_connection(*self.upstream,
                                                                    limit=1 << 16)
            try:
                up[1].write(request)
                await up[1].drain()
                head = await up[0].readuntil(b"\r\n\r\n")
                break
            except (ConnectionError, asyncio.IncompleteReadError):
                # nginx closed a kept-alive connection that sat idle: GET and
                # HEAD may be sent again, once, on a new one.
                up[1].close()
                link[0] = None
                if attempt:
                    raise
        first, headers = _parse_head(head)
        status = int(first.split(" ")[1])
        await pacer.send(writer, head)
        keep = "close" not in headers.get("connection", "").lower()
        if method == "HEAD" or status in (204, 304) or status < 200:
            pass                                     # no body
        elif "content-length" in headers:
            await self._copy(up[0], writer, pacer, int(headers["content-length"]))
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            while True:                              # size line, data, CRLF; 0: trailers
                line = await up[0].readuntil(b"\r\n")
                await pacer.send(writer, line)
                size = int(line.split(b";")[0], 16)
                if size == 0:
                    while line != b"\r\n":
                        line = await up[0].readuntil(b"\r\n")
                        await pacer.send(writer, line)
                    break
                await self._copy(up[0], writer, pacer, size)
                await pacer.send(writer, await up[0].readexactly(2))
        else:                                        # body to the end of the connection
            await self._copy(up[0], writer, pacer, None)
            keep = False
        if not keep:
            up[1].close()
            link[0] = None
        return keep

    async def _copy(self, source, writer, pacer: Pacer, length: int | None) -> None:
        """Relays ``length`` body bytes (None: to the end), paced, counted."""
        while length is None or length > 0:
            chunk = await source.read(BURST if length is None else min(BURST, length))
            if not chunk:
                if length is None:
                    return
                raise asyncio.IncompleteReadError(b"", length)
            if length is not None:
                length -= len(chunk)
            self.bytes += len(chunk)
            await pacer.send(writer, chunk)

    async def _control(self, target: str, writer) -> None:
        url = urlsplit(target)
        status = "200 OK"
        if url.path == "/__reset":
            self.reset()
        elif url.path == "/__set":
            query = parse_qs(url.query)
            if "delay_ms" in query:
                self.delay = float(query["delay_ms"][0]) / 1000
            if "rate_mbps" in query:
                self.rate = float(query["rate_mbps"][0]) * 1e6
        elif url.path != "/__stats":
            status = "404 Not Found"
        body = json.dumps(self.stats()).encode()
        writer.write(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()


def proxy_main(upstream: str) -> None:
    """Serves on a free port of 127.0.0.1; prints the port (the parent reads it)."""
    parts = urlsplit(upstream)
    proxy = Proxy(parts.hostname, parts.port)

    async def run() -> None:
        server = await asyncio.start_server(proxy.serve, "127.0.0.1", 0, limit=1 << 16,
                                            backlog=1024)
        print(server.sockets[0].getsockname()[1], flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(run())


def start_proxy(upstream: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--proxy-serve",
                             "--upstream", upstream], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.strip().isdigit():
        proc.kill()
        sys.exit("the proxy did not start")
    return proc, int(line)


def proxy_call(port: int, path: str) -> dict:
    """One control request on a connection of its own (never counted as used)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


# --- the runs --------------------------------------------------------------------------------

def run_once(path: str, streaming: bool, workers: int | None, cache_root: str,
             port: int | None, server_pids: list[int], output: str = "full") -> dict:
    """One epoch with the defaults, from an empty shard cache; ``output``
    "bytes" reads the stored bytes undecoded (what the network alone allows)."""
    import fastdata

    cache = tempfile.mkdtemp(dir=cache_root)
    os.environ["FASTDATA_CACHE_DIR"] = cache
    if port:
        proxy_call(port, "/__reset")
    cpu = sum(cpu_seconds(pid) for pid in server_pids)
    opened = time.perf_counter()
    decode = fastdata.Decode(size=(224, 224)) if output == "full" else \
        fastdata.Decode(output="bytes")
    ds = fastdata.open_dataset(path, streaming=streaming, decode=decode,
                               order=fastdata.Order(shuffle=True, batch_size=64))
    # The batch size is the Order's: loader() refuses batch_size= (it names the Order).
    loader = fastdata.loader(ds, **({} if workers is None else {"num_workers": workers}))
    start = time.perf_counter()
    it = iter(loader)
    first = next(it)
    after_first = time.perf_counter()
    rest = sum(len(batch[1]) for batch in it)
    end = time.perf_counter()
    samples = rest + len(first[1])
    out = {"samples": samples, "rate": samples / (end - start),
           "rate_after_first": rest / (end - after_first) if rest else 0.0,
           "first_batch_s": after_first - start, "open_s": start - opened,
           "epoch_s": end - start, "choice": str(getattr(loader, "choice", "")),
           "server_cpu_s": sum(cpu_seconds(pid) for pid in server_pids) - cpu}
    if port:
        out["proxy"] = proxy_call(port, "/__stats")
    del it, first, loader, ds       # worker processes, open files, the cache's locks go
    gc.collect()
    shutil.rmtree(cache, ignore_errors=True)
    return out


def machine() -> str:
    with open("/proc/cpuinfo", encoding="utf-8") as f:     # Linux, as nginx's setup is
        model = next((line.split(":", 1)[1].strip() for line in f
                      if line.startswith("model name")), "unknown CPU")
    return f"{os.cpu_count()} cores, {model}"


def print_table(results: list[dict]) -> None:
    """Best epoch of the repeats per (setting, way), against local's."""
    best: dict[tuple[str, str], dict] = {}
    for r in results:
        key = (r["setting"], r["way"])
        if key not in best or r["rate"] > best[key]["rate"]:
            best[key] = r
    print(f"  {'setting':8} {'way':6} {'rows/s':>7} {'x local':>7} {'after 1st':>9} "
          f"{'1st batch':>9} {'open':>6} {'requests':>8} {'MB':>8} {'peak conn':>9} "
          f"{'server CPU':>10}")
    for (setting, way), r in best.items():
        local = best.get(("local", way))
        proxy = r.get("proxy")
        moved = (f"{proxy['requests']:8d} {proxy['bytes'] / 1e6:8.1f} "
                 f"{proxy['peak_connections']:9d} {r['server_cpu_s']:9.1f}s") if proxy else \
            f"{'-':>8} {'-':>8} {'-':>9} {'-':>10}"
        print(f"  {setting:8} {way:6} {r['rate']:7.0f} {r['rate'] / local['rate']:6.2f}x "
              f"{r['rate_after_first']:9.0f} {r['first_batch_s']:8.2f}s {r['open_s']:5.2f}s "
              f"{moved}")
    for way in ("stream", "map"):
        if ("local", way) in best:
            print(f"  {way}: {best[('local', way)]['choice']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=6144)
    parser.add_argument("--shards-of", type=int, default=128, help="records per shard")
    parser.add_argument("--delays", default="0,20,40,80", help="ms before each request")
    parser.add_argument("--rate", type=float, default=60.0,
                        help="MB/s per connection (0: unlimited)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--workers", type=int, default=None,
                        help="num_workers for fastdata.loader (default: its own choice)")
    parser.add_argument("--json", help="write every run's figures to this file")
    parser.add_argument("--decode", choices=("full", "bytes"), default="full",
                        help="full: decode to 224x224 (the defaults); bytes: the stored "
                             "bytes undecoded, so the network is the limit (use with "
                             "--workers 0)")
    parser.add_argument("--proxy-serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.proxy_serve:
        proxy_main(args.upstream)
        return
    delays = [float(d) for d in args.delays.split(",") if d.strip()]

    import fastdata
    from fastdata.demo import synthesize

    # The URL is on loopback: never through an HTTP_PROXY set for the outside.
    os.environ["NO_PROXY"] = ",".join(filter(None, (os.environ.get("NO_PROXY"), "127.0.0.1")))
    server_files = tempfile.TemporaryDirectory()
    tmp_root = tempfile.TemporaryDirectory()
    local = os.path.join(tmp_root.name, "local")
    os.makedirs(local)
    nginx, endpoint = start_nginx(local, server_files.name)
    proxy, port = start_proxy(endpoint)
    try:
        with tmp_root as tmp:
            synthesize(os.path.join(tmp, "src"), kind="photos", n=args.photos, seed=0)
            # Pack-time shuffled, as a dataset streamed by whole shards should be.
            summary = fastdata.pack(os.path.join(tmp, "src"), os.path.join(local, "d-%06d.tar"),
                                    options=fastdata.PackOptions(shard_size=args.shards_of,
                                                                 shuffle=0),
                                    progress=False)
            shutil.rmtree(os.path.join(tmp, "src"))
            files = os.listdir(local)
            on_disk = sum(os.path.getsize(os.path.join(local, n)) for n in files)
            shards = sum(n.endswith(".tar") for n in files)
            url = f"http://127.0.0.1:{port}/d.tar.fastdata.json"
            cache_root = os.path.join(tmp, "cache")
            # Imported now, so that the first row's open time is not torch's import.
            import torch  # noqa: F401
            for name in ("loader", "ShardedIterableDataset", "TarDataset", "open_dataset"):
                getattr(fastdata, name)
            os.makedirs(cache_root)
            print(f"machine: {machine()}")
            print(f"{args.photos} generated photos in {shards} tar shards of {args.shards_of} "
                  f"({on_disk / 1e6:.1f} MB on disk), 224x224, batch 64, shuffled, "
                  f"{'loader defaults' if args.workers is None else f'{args.workers} workers'}; "
                  f"{'' if args.decode == 'full' else 'stored bytes, not decoded; '}"
                  f"proxy: each request delayed, {args.rate:g} MB/s per connection"
                  f"{' (unlimited)' if not args.rate else ''}; best of {args.repeat}")
            results = []
            for r in range(args.repeat):
                # Local, then each delay, in every round: drift hits all rows alike.
                for delay in [None, *delays]:
                    if delay is not None:
                        proxy_call(port, f"/__set?delay_ms={delay}&rate_mbps={args.rate}")
                    setting = "local" if delay is None else f"{delay:g} ms"
                    for way in ("stream", "map"):
                        res = run_once(summary.output if delay is None else url,
                                       way == "stream", args.workers, cache_root,
                                       None if delay is None else port,
                                       [] if delay is None else [nginx.pid, proxy.pid],
                                       args.decode)
                        results.append({"round": r, "setting": setting, "delay_ms": delay,
                                        "way": way, **res})
                        print(f"    round {r} {setting:6} {way:6} {res['rate']:6.0f}/s",
                              flush=True)
            print_table(results)
            if args.json:
                with open(args.json, "w", encoding="utf-8") as f:
                    json.dump({"machine": machine(), "args": vars(args),
                               "dataset": {"photos": args.photos, "shards": shards,
                                           "bytes_on_disk": on_disk},
                               "runs": results}, f, indent=1)
    finally:
        for proc in (proxy, nginx):
            proc.kill()
            proc.wait()
        server_files.cleanup()


if __name__ == "__main__":
    main()
