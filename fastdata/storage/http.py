"""Reads and ranged reads of objects at http(s) URLs, which are read only (the
requests themselves, with their redirect and retry rules: fastdata.storage.http_client).

Bodies are read to the size asked for and no further: a range is its length, a
whole object at most ``limit`` bytes, whatever the server sends. Ranges of one
object nearer than ``COALESCE`` bytes go out as one request, and the requests
of one call run in parallel, a long span cut into parts fetched at once; the
requests to one server at once are as many as its measured rate rewards
(fastdata.storage.adaptive).
"""

from __future__ import annotations

import time

from fastdata.errors import StorageError
from fastdata.storage import adaptive
from fastdata.storage.forked import map_all, process_threads
from fastdata.storage.http_client import origin_of, refused, request

#: Ranges of one object nearer than this are fetched in one request (as obstore does).
COALESCE = 1 << 20


def size(url: str, options: dict | None = None) -> int:
    """The object's size in bytes (a HEAD request)."""
    answer = request("HEAD", url, options)
    if answer.status != 200:
        raise refused(answer, url)
    length = answer.header("Content-Length")
    answer.finish()
    if length is None or not length.isdigit():
        raise StorageError("the server gives no Content-Length for the object", path=url)
    return int(length)


def exists(url: str, options: dict | None = None) -> bool:
    answer = request("HEAD", url, options)
    answer.finish()
    if answer.status in (404, 410):
        return False
    if answer.status != 200:
        raise refused(answer, url)
    return True


def read(url: str, options: dict | None = None, limit: int | None = None) -> bytes:
    """The whole object; more than ``limit`` bytes is refused, unread."""
    return b"".join(stream(url, options, limit=limit, refuse_larger=True))


def stream(url: str, options: dict | None = None, *, limit: int | None = None,
           refuse_larger: bool = False):
    """The object's bytes in chunks, cut off after ``limit`` bytes; with
    ``refuse_larger``, an object larger than ``limit`` is refused instead."""
    answer = request("GET", url, options)
    if answer.status != 200:
        raise refused(answer, url)
    length = answer.header("Content-Length")
    declared = int(length) if length and length.isdigit() else None
    refuse = refuse_larger and limit is not None
    if refuse and declared is not None and declared > limit:
        answer.close()
        raise _too_large(url, limit)
    total = 0
    # One byte past the limit tells a body larger than it says apart from one that fits.
    for chunk in answer.chunks(limit + 1 if refuse else limit, url):
        total += len(chunk)
        if refuse and total > limit:
            answer.close()
            raise _too_large(url, limit)
        yield chunk
    expected = declared if limit is None or declared is None else min(declared, limit)
    if expected is not None and total < expected:
        answer.close()
        raise StorageError("connection dropped mid-transfer", path=url)
    answer.finish()  # a body cut off at the limit closes its connection


def _too_large(url: str, limit: int) -> StorageError:
    return StorageError(f"the object holds more than the {limit:,} bytes it may here; the "
                        f"server sends other data than the dataset describes", path=url)


def read_range(url: str, start: int, length: int, options: dict | None = None, *,
               ahead: bool = False) -> bytes:
    """``length`` bytes at ``start``: exactly those, from a 206 answer;
    ``ahead``: read ahead of use (it waits behind reads needed now)."""
    if length == 0:
        return b""
    gate = adaptive.gate(origin_of(url))
    with gate.slot(ahead=ahead):
        began = time.monotonic()
        answer = request("GET", url, options,
                         headers={"Range": f"bytes={start}-{start + length - 1}"})
        first = time.monotonic()
        data = _range_body(answer, url, start, length)
        gate.record(len(data), first - began, time.monotonic() - first)
    return data


def _range_body(answer, url: str, start: int, length: int) -> bytes:
    if answer.status == 200:
        answer.close()
        raise StorageError("the server does not honour Range requests (it answered 200 "
                           "with the whole object)", path=url, offset=start)
    if answer.status != 206:
        raise refused(answer, url)
    got = answer.header("Content-Range") or ""
    if not got.startswith(f"bytes {start}-"):
        answer.close()
        raise StorageError(f"the server answered another range ({got or 'none'}) than "
                           f"bytes {start}-{start + length - 1}", path=url, offset=start)
    end, _, total = got[len(f"bytes {start}-"):].partition("/")
    if end.isdigit() and int(end) < start + length - 1:
        answer.close()
        raise StorageError(f"the object is shorter ({total} bytes) than the range asked for "
                           f"(bytes {start}-{start + length - 1}): it is not the one the "
                           f"dataset describes", path=url, offset=start)
    data = answer.read(length, url)
    if len(data) < length:
        answer.close()
        raise StorageError("connection dropped mid-transfer", path=url, offset=start)
    answer.finish()
    return data


def read_ranges(url: str, ranges: list[tuple[int, int]], options: dict | None = None, *,
                coalesce: int = COALESCE) -> list[bytes]:
    """The bytes of each (start, length): ranges at most ``coalesce`` bytes
    apart go out as one request, and the requests run in parallel."""
    return spans_read(ranges, coalesce,
                      lambda span: read_range(url, span[0], span[1] - span[0], options),
                      part=adaptive.gate(origin_of(url)).part_size())


def download(url: str, fd: int, size: int, options: dict | None = None) -> None:
    """The object's first ``size`` bytes written to the open file ``fd`` in
    place, in ranged parts fetched at once (each exactly its length)."""
    import os

    part = adaptive.gate(origin_of(url)).part_size()

    def fetch(piece):
        data = read_range(url, piece[0], piece[1] - piece[0], options, ahead=True)
        os.pwrite(fd, data, piece[0])

    map_all("fastdata-parts", adaptive.HIGH, fetch, adaptive.split(0, size, part))


def spans_read(ranges: list[tuple[int, int]], coalesce: int, fetch, *,
               part: int | None = None) -> list[bytes]:
    """Each (start, length) range's bytes, ranges at most ``coalesce`` bytes
    apart merged into one span, ``fetch((start, end))`` called once per span
    or, for a span longer than ``part`` bytes, once per part of it (all in
    parallel when there are several)."""
    order = sorted(range(len(ranges)), key=lambda k: ranges[k][0])
    spans: list[list] = []  # [start, end, [k ...]]
    for k in order:
        start, length = ranges[k]
        if spans and start - spans[-1][1] <= coalesce:
            spans[-1][1] = max(spans[-1][1], start + length)
            spans[-1][2].append(k)
        else:
            spans.append([start, start + length, [k]])
    pieces = [adaptive.split(s, e, part) if part else [(s, e)] for s, e, _ in spans]
    flat = [p for ps in pieces for p in ps]
    got = list(_threads().map(fetch, flat)) if len(flat) > 1 else [fetch(flat[0])]
    bodies, k = [], 0
    for ps in pieces:
        bodies.append(got[k] if len(ps) == 1 else b"".join(got[k:k + len(ps)]))
        k += len(ps)
    out: list[bytes] = [b""] * len(ranges)
    for (first, _end, ks), body in zip(spans, bodies):
        view = memoryview(body)
        for k in ks:
            start, length = ranges[k]
            out[k] = bytes(view[start - first:start - first + length])
    return out


def _threads(name: str = "fastdata-http"):
    # As many threads as a gate may let through: the gate, not the pool, limits.
    return process_threads(name, adaptive.HIGH)
