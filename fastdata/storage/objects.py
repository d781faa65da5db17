"""Reads, ranged reads, downloads, uploads and listings of one object, for a
remote URL (s3://, gs://, az:// through obstore; http(s):// through
fastdata.storage.http, which keeps to the URL's host) or a local path (through
the filesystem)."""

from __future__ import annotations

import os

from fastdata.errors import AccessDeniedError, MissingObjectError, StorageError
from fastdata.storage import http
from fastdata.storage.failures import translated
from fastdata.storage.forked import forked, via_helper
from fastdata.storage.partial import partial_name, replace_file
from fastdata.storage.stores import get_store, store_and_key
from fastdata.storage.urls import is_http, local_path, parse_url


def check_ranges(ranges, size: int, url: str) -> None:
    """Refuse a (start, length) range outside an object of ``size`` bytes.

    Raises:
        StorageError: naming the range and the object.
    """
    for start, length in ranges:
        if start < 0 or length < 0 or start + length > size:
            raise StorageError(f"byte range {start}+{length} is outside the object "
                               f"({size} bytes)", path=url, offset=start)


class RemoteObject:
    """One object at ``url``; its size is asked for once (or taken as given:
    ``size``, what a manifest says it holds)."""

    def __init__(self, url: str, storage_options: dict | None = None, *,
                 size: int | None = None) -> None:
        self.url = url
        self.storage_options = storage_options
        self._size: int | None = size
        self._local = local_path(url)
        self._http = is_http(url)

    def __repr__(self) -> str:
        return f"RemoteObject({self.url!r})"

    def _translated(self):
        return translated(self.url, self.storage_options)

    def size(self) -> int:
        if self._size is None:
            if self._local is not None:
                self._size = _local_call(self.url, os.path.getsize, self._local)
            elif self._http:
                self._size = http.size(self.url, self.storage_options)
            elif forked():
                self._size = via_helper("size", self.url, self.storage_options)
            else:
                import obstore
                store, key = store_and_key(self.url, self.storage_options)
                with self._translated():
                    self._size = int(obstore.head(store, key)["size"])
        return self._size

    def read(self, *, limit: int | None = None) -> bytes:
        """The whole object; one larger than ``limit`` bytes is refused without
        reading past the limit (a server may send anything)."""
        if self._local is not None:
            data = _local_call(self.url, _read_local, self._local, limit)
        elif self._http:
            return http.read(self.url, self.storage_options, limit=limit)
        elif forked():
            data = via_helper("read", self.url, self.storage_options, limit)
        else:
            data = b"".join(self._chunks(None if limit is None else limit + 1))
        if limit is not None and len(data) > limit:
            raise StorageError(f"the object holds more than the {limit:,} bytes it may here; "
                               f"the dataset is damaged or not what it claims", path=self.url)
        return data

    def first_bytes(self, size: int) -> bytes:
        """At most the object's first ``size`` bytes (the rest is not read)."""
        if self._local is None and not self._http and forked():
            return via_helper("first_bytes", self.url, self.storage_options, size)
        return b"".join(self._chunks(size))

    def read_range(self, start: int, length: int) -> bytes:
        return self.read_ranges([(start, length)])[0]

    def read_ranges(self, ranges: list[tuple[int, int]], *, coalesce: int | None = None
                    ) -> list[bytes]:
        """The bytes of each (start, length) range; remote ranges go out as one
        obstore get_ranges call, which merges near ones (1 MiB) into fewer
        requests. ``coalesce``: merge only ranges at most that many bytes
        apart instead (0: only touching ones), each merged span its own
        request, the requests run at once: for reads that must not fetch
        the bytes between ranges (a view's unselected records)."""
        ranges = list(ranges)
        if not ranges:
            return []
        check_ranges(ranges, self.size(), self.url)
        if self._local is not None:
            return _local_call(self.url, _read_local_ranges, self._local, ranges)
        if self._http:
            return http.read_ranges(self.url, ranges, self.storage_options,
                                    coalesce=http.COALESCE if coalesce is None else coalesce)
        if forked():
            return via_helper("read_ranges", self.url, self.storage_options, ranges, coalesce)
        import obstore
        store, key = store_and_key(self.url, self.storage_options)
        if coalesce is not None:
            def fetch(span):
                with self._translated():
                    return bytes(obstore.get_range(store, key, start=span[0],
                                                   length=span[1] - span[0]))

            return http.spans_read(ranges, coalesce, fetch)
        with self._translated():
            parts = obstore.get_ranges(store, key, starts=[s for s, _ in ranges],
                                       lengths=[n for _, n in ranges])
        return [bytes(part) for part in parts]

    def download(self, dest: str, *, limit: int | None = None,
                 size: int | None = None) -> None:
        """Copy the object to ``dest``, written in ``dest.partial-XXXX`` and
        renamed into place: ``dest`` is never a half-written file. ``limit``:
        copy at most that many bytes (a bound: a server that sends more is
        cut off there). ``size``: the bytes to copy, known exactly (what a
        manifest gives a shard): a remote object is then fetched in ranged
        parts at once, each written in place and checked for its length, so
        one connection's rate does not bound a large object."""
        if self._local is None and not self._http and forked():
            return via_helper("download", self.url, self.storage_options, dest, limit, size)
        tmp = partial_name(dest)
        try:
            if size is not None and self._local is None and size > self._gate().part_size():
                with open(tmp, "r+b") as out:
                    self._parts(out.fileno(), size)
                    if os.fstat(out.fileno()).st_size != size:  # every part landed whole
                        raise StorageError(f"the copy holds {os.fstat(out.fileno()).st_size} "
                                           f"of {size} bytes", path=self.url)
            elif self._http:
                with open(tmp, "wb") as out:
                    self._counted(out, limit)
            else:
                with open(tmp, "wb") as out:
                    out.writelines(self._chunks(limit))
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def _counted(self, out, limit: int | None) -> None:
        from fastdata.storage.transfers import counted_download

        counted_download(self, out, limit)

    def _gate(self):
        from fastdata.storage.transfers import gate_of

        return gate_of(self)

    def _parts(self, fd: int, size: int) -> None:
        from fastdata.storage.transfers import download_parts

        download_parts(self, fd, size)

    def _chunks(self, limit: int | None = None):
        """The object's bytes in chunks, the first ``limit`` of them (None: all)."""
        if self._http:
            yield from http.stream(self.url, self.storage_options, limit=limit)
            return
        left = limit
        for chunk in self._all_chunks():
            if left is not None:
                chunk = chunk[:left]
                left -= len(chunk)
            yield chunk
            if left == 0:
                return

    def _all_chunks(self):
        if self._local is not None:
            with _local_call(self.url, open, self._local, "rb") as f:
                while chunk := f.read(8 << 20):
                    yield chunk
            return
        import obstore
        store, key = store_and_key(self.url, self.storage_options)
        with self._translated():
            for chunk in obstore.get(store, key).stream(min_chunk_size=8 << 20):
                yield bytes(chunk)


def _read_only(url: str) -> StorageError:
    return StorageError("http(s) URLs are read only: write to a local folder or to s3://, "
                        "gs:// or az://", path=url)


def _read_local(path: str, limit: int | None) -> bytes:
    with open(path, "rb") as f:
        return f.read() if limit is None else f.read(limit + 1)


def _read_local_ranges(path: str, ranges) -> list[bytes]:
    with open(path, "rb") as f:
        out = []
        for start, length in ranges:
            f.seek(start)
            out.append(f.read(length))
        return out


def _local_call(url, fn, *args):
    try:
        return fn(*args)
    except FileNotFoundError:
        raise MissingObjectError("no such file", path=url) from None
    except PermissionError:
        raise AccessDeniedError("permission denied", path=url) from None


def open_remote(url: str, storage_options: dict | None = None, *,
                size: int | None = None) -> RemoteObject:
    """The object at ``url`` (a remote URL, a file:// URL or a local path);
    ``size``: its size as known (no request asks for it)."""
    return RemoteObject(os.fspath(url), storage_options, size=size)


def exists(url: str, storage_options: dict | None = None) -> bool:
    """Whether an object (or, locally, a file or folder) is at ``url``."""
    path = local_path(url)
    if path is not None:
        return os.path.exists(path)
    if is_http(url):
        return http.exists(url, storage_options)
    if forked():
        return via_helper("exists", url, storage_options)
    import obstore
    from obstore.exceptions import NotFoundError
    store, key = store_and_key(url, storage_options)
    with translated(url, storage_options):
        try:
            obstore.head(store, key)
        except (NotFoundError, FileNotFoundError):
            return False
    return True


def list_names(url_prefix_dir: str, storage_options: dict | None = None) -> list[str]:
    """Sorted names of the objects (files) directly under a "folder" URL."""
    path = local_path(url_prefix_dir)
    if path is not None:
        names = _local_call(url_prefix_dir, os.listdir, path)
        return sorted(n for n in names if os.path.isfile(os.path.join(path, n)))
    parsed = parse_url(url_prefix_dir)
    if parsed.scheme in ("http", "https"):
        raise StorageError("cannot list over HTTP; name the shards explicitly",
                           path=url_prefix_dir)
    if forked():
        return via_helper("list_names", url_prefix_dir, storage_options)
    import obstore
    store = get_store(parsed, storage_options)
    prefix = parsed.key.rstrip("/")
    with translated(url_prefix_dir, storage_options):
        listing = obstore.list_with_delimiter(store, prefix or None)
    return sorted(obj["path"].rsplit("/", 1)[-1] for obj in listing["objects"])


def upload_file(local: str, url: str, storage_options: dict | None = None) -> None:
    """Copy the local file ``local`` to ``url`` (multipart above 5 MB); the object
    appears whole or not at all."""
    local = os.fspath(local)
    if not os.path.isfile(local):
        raise StorageError("no such file to upload", path=local)
    path = local_path(url)
    if path is not None:
        _copy_local(local, path)
        return
    if is_http(url):
        raise _read_only(url)
    if forked():
        return via_helper("upload_file", url, storage_options, local)
    from fastdata.storage.transfers import upload_parts

    upload_parts(local, url, storage_options)


def upload_bytes(data: bytes, url: str, storage_options: dict | None = None) -> None:
    """Write ``data`` as the object at ``url``."""
    path = local_path(url)
    if path is not None:
        replace_file(path, bytes(data))
        return
    if is_http(url):
        raise _read_only(url)
    if forked():
        return via_helper("upload_bytes", url, storage_options, bytes(data))
    import obstore
    store, key = store_and_key(url, storage_options)
    with translated(url, storage_options):
        obstore.put(store, key, bytes(data))


def _copy_local(src: str, dest: str) -> None:
    import shutil
    tmp = partial_name(dest)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def delete(url: str, storage_options: dict | None = None) -> None:
    """Remove the object at ``url`` (nothing happens when there is none)."""
    path = local_path(url)
    if path is not None:
        if os.path.exists(path):
            os.unlink(path)
        return
    if is_http(url):
        raise _read_only(url)
    if forked():
        return via_helper("delete", url, storage_options)
    import obstore
    store, key = store_and_key(url, storage_options)
    with translated(url, storage_options):
        obstore.delete(store, key)


def create_bytes(data: bytes, url: str, storage_options: dict | None = None) -> bool:
    """Write ``data`` as the object at ``url`` only if none is there: True when
    this call created it, False when one existed (its bytes untouched). The
    object appears whole or not at all.

    Locally the bytes go to a fresh temporary file, then are linked to the
    name (``link`` fails on any existing entry, a link included, and never
    follows one). At object stores it is a conditional write (S3 and Azure
    ``If-None-Match: *``, GCS ``ifGenerationMatch=0``)."""
    path = local_path(url)
    if path is not None:
        return _create_local(bytes(data), path)
    if is_http(url):
        raise _read_only(url)
    if forked():
        return via_helper("create_bytes", url, storage_options, bytes(data))
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError
    store, key = store_and_key(url, storage_options)
    with translated(url, storage_options):
        try:
            obstore.put(store, key, bytes(data), mode="create")
        except (AlreadyExistsError, PreconditionError):
            return False
    return True


def _create_local(data: bytes, path: str) -> bool:
    from fastdata.storage.partial import written_file

    tmp = written_file(path, data)
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        _sync_folder(os.path.dirname(os.path.abspath(path)))
        return True
    finally:
        os.unlink(tmp)


def _sync_folder(folder: str) -> None:
    """Make a new name in ``folder`` durable (where the platform allows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a folder; the name is written anyway
    finally:
        os.close(fd)


def list_tree(url_prefix_dir: str, storage_options: dict | None = None
              ) -> list[tuple[str, int, float, bool]]:
    """Every file under a "folder" URL or local folder, at any depth: ``(name
    relative to it with "/" separators, size, modified time as seconds since
    the epoch, is a link)``, sorted. Locally, links are listed, never
    followed; an absent folder lists nothing."""
    path = local_path(url_prefix_dir)
    if path is not None:
        return _local_tree(path)
    parsed = parse_url(url_prefix_dir)
    if parsed.scheme in ("http", "https"):
        raise StorageError("cannot list over HTTP", path=url_prefix_dir)
    if forked():
        return via_helper("list_tree", url_prefix_dir, storage_options)
    import obstore
    store = get_store(parsed, storage_options)
    prefix = parsed.key.rstrip("/")
    out = []
    with translated(url_prefix_dir, storage_options):
        for batch in obstore.list(store, prefix + "/" if prefix else None):
            for obj in batch:
                name = obj["path"][len(prefix) + 1:] if prefix else obj["path"]
                out.append((name, int(obj["size"]), obj["last_modified"].timestamp(), False))
    return sorted(out)


def _local_tree(root: str) -> list[tuple[str, int, float, bool]]:
    import stat

    out = []
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(root, rel) if rel else root))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            name = f"{rel}/{entry.name}" if rel else entry.name
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed since the folder was read (a writer's temporary file)
            if stat.S_ISDIR(info.st_mode):
                stack.append(name)
            else:
                out.append((name, info.st_size, info.st_mtime, stat.S_ISLNK(info.st_mode)))
    return sorted(out)
