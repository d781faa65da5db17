"""Large transfers of one object at a URL in parts at once, through the
server's gate (fastdata.storage.adaptive): a download of known size in
ranged parts written in place, a whole download counted, and an upload
whose parts at once the uploads' gate sets (no torch)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fastdata.errors import StorageError
from fastdata.storage import adaptive, http
from fastdata.storage.failures import translated
from fastdata.storage.forked import map_all
from fastdata.storage.stores import origin_of_store, store_and_key

#: The smallest part of a multipart upload S3 takes (all but the last).
MIN_PART = 5 << 20


def gate_of(obj) -> adaptive.Gate:
    """The gate of the server of ``obj`` (a remote ``RemoteObject``)."""
    if obj._http:
        return adaptive.gate(http.origin_of(obj.url))
    return adaptive.gate(origin_of_store(obj.url, obj.storage_options))


def upload_gate(url: str, storage_options: dict | None = None) -> adaptive.Gate:
    """The gate of uploads to ``url``'s store: its parts at once and what it
    has measured. Uploads and reads share the link but not their counts."""
    return adaptive.gate(origin_of_store(url, storage_options) + " (uploads)")


def counted_download(obj, out, limit: int | None) -> None:
    """``obj``'s bytes (at most ``limit``) streamed into ``out`` through its
    server's gate (a download ahead of use: it waits behind reads needed now)."""
    gate = gate_of(obj)
    with gate.slot(ahead=True):
        began = time.monotonic()
        chunks = obj._chunks(limit)
        first = next(chunks, b"")
        got = time.monotonic()
        out.write(first)
        total = len(first)
        for chunk in chunks:
            out.write(chunk)
            total += len(chunk)
        gate.record(total, got - began, time.monotonic() - got)


def download_parts(obj, fd: int, size: int) -> None:
    """``obj``'s first ``size`` bytes into the open file ``fd``, in ranged
    parts fetched at once, each written in place and checked for its length."""
    if obj._http:
        http.download(obj.url, fd, size, obj.storage_options)
        return
    import obstore

    store, key = store_and_key(obj.url, obj.storage_options)
    gate = gate_of(obj)

    def fetch(piece):
        with gate.slot(ahead=True):
            began = time.monotonic()
            with translated(obj.url, obj.storage_options):
                data = bytes(obstore.get_range(store, key, start=piece[0],
                                               length=piece[1] - piece[0]))
            took = time.monotonic() - began
            # obstore gives the body whole: its time counts as the first byte's.
            gate.record(len(data), took, 0.0)
        if len(data) != piece[1] - piece[0]:
            raise StorageError(f"a ranged read gave {len(data)} of {piece[1] - piece[0]} "
                               f"bytes", path=obj.url, offset=piece[0])
        os.pwrite(fd, data, piece[0])

    map_all("fastdata-parts", adaptive.HIGH, fetch, adaptive.split(0, size, gate.part_size()))


def upload_parts(local: str, url: str, storage_options: dict | None = None) -> None:
    """The local file ``local`` to the object store at ``url`` (obstore's
    multipart upload above a part), with as many parts at once as the
    uploads' gate allows; the upload counts as one window of its climb."""
    import obstore

    store, key = store_and_key(url, storage_options)
    gate = upload_gate(url, storage_options)
    size = os.path.getsize(local)
    chunk = max(MIN_PART, gate.part_size())
    concurrency = gate.limit
    with gate.uploading():
        began = time.monotonic()
        with translated(url, storage_options):
            obstore.put(store, key, Path(local), chunk_size=chunk,
                        max_concurrency=concurrency)
        gate.uploaded(size, time.monotonic() - began, max(1, -(-size // chunk)))
