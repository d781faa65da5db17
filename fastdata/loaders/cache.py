"""A RAM cache of a dataset's stored payloads, shared by every DataLoader worker.

The payloads (encoded bytes or raw pixels) are copied once, up front, into one
POSIX shared-memory block (``/dev/shm``) together with their offsets. Workers
use that block: forked workers inherit the mapping, spawned workers attach to
it by name. So N workers hold one copy, not N (the pitfall of per-worker
caches). The block is freed when the Dataset that made it is garbage collected
or the process exits; one left behind by a killed process is removed when the
next cache is made (see ``remove_stale_blocks``). No torch here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from fastdata.errors import CorruptDataError, FastDataError, exception_text
from fastdata.formats import salvage
from fastdata.machine import human_bytes, meminfo
from fastdata.progress import progress_bar
from fastdata.storage.shared_block import SharedBlock


def available_memory() -> int | None:
    """Bytes of memory available for new allocations (Linux MemAvailable), or None."""
    return meminfo("MemAvailable")


def shm_free() -> int | None:
    """Free bytes in /dev/shm, where the shared block lives, or None."""
    try:
        st = os.statvfs("/dev/shm")
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def check_fits(needed: int, *, path: str | None = None, margin: float = 1.1) -> None:
    """Refuse a cache that would not fit in memory (needed vs available)."""
    avail = available_memory()
    if avail is not None and needed * margin > avail:
        raise FastDataError(
            f"the cache needs {human_bytes(needed)} but only {human_bytes(avail)} of memory is "
            f"available; use cache=None, or pack a smaller dataset (resize= at pack time)", path=path)
    shm = shm_free()
    if shm is not None and needed > shm:
        raise FastDataError(
            f"the cache needs {human_bytes(needed)} in /dev/shm but only {human_bytes(shm)} is free "
            f"there; enlarge /dev/shm (docker: --shm-size) or use cache=None", path=path)


class SharedPayloadCache(SharedBlock):
    """All stored payloads of a reader, in one shared-memory block.

    Args:
        reader: any fastdata Reader; every record is read (and checksummed) once.
        progress: show a progress bar while filling (None: only on a terminal).
        skip_damaged: a record that cannot be read or fails its checksum is left
            out of the cache (reading it later raises CorruptDataError, which a
            Dataset with ``on_error="skip"`` skips) instead of stopping the fill.
    """

    kind = "ram"

    def __init__(self, reader, *, progress: bool | None = None,
                 skip_damaged: bool = False) -> None:
        n = len(reader)
        payload = int(reader.manifest.bytes.get("payload", 0))
        self.nbytes = payload
        self.count = n
        self.path = reader.path
        check_fits(payload + 8 * (n + 1), path=reader.path)
        self._create(payload + 8 * (n + 1))
        self.damaged: dict[int, str] = {}
        bar = progress_bar(n, "cache", enabled=progress)
        try:
            if reader.walk_in_child:  # its C library may abort on a damaged file
                self._fill_in_child(reader, bar, skip_damaged)
            else:
                self._fill(reader, bar, skip_damaged)
        except BaseException:
            self._finalizer()
            raise
        finally:
            bar.close()

    def _fill_in_child(self, reader, bar, skip_damaged: bool) -> None:
        """:meth:`_fill` in a child process (fastdata.loaders.cache_child), which
        writes straight into the block; here only which records were damaged.

        Raises:
            CorruptDataError: a record is damaged (and not ``skip_damaged``), or
                reading the file killed the child.
        """
        from fastdata.formats.isolate import ChildDied, NoChild, walk_in_child

        damaged = {}

        def on_message(message: dict) -> None:
            if "result" in message:
                damaged.update(message["result"]["damaged"])

        args = {"cache": self.__getstate__(), "skip_damaged": skip_damaged}
        try:
            walk_in_child(reader, "fastdata.loaders.cache_child:fill_task", args, on_message,
                          bar.update)
        except NoChild:
            self._fill(reader, bar, skip_damaged)
            return
        except ChildDied as died:
            raise CorruptDataError(died.reason, path=reader.crash_path()) from None
        self.damaged = {int(k): v for k, v in damaged.items()}

    def _fill(self, reader, bar, skip_damaged: bool) -> None:
        n, payload = self.count, self.nbytes
        pos = 0

        def put(index: int, data) -> None:
            nonlocal pos
            size = len(data)
            if pos + size > payload:
                raise FastDataError("payloads are larger than the manifest says; re-pack",
                                    path=reader.path)
            self._data[pos: pos + size] = np.frombuffer(data, dtype=np.uint8)
            self._offsets[index] = pos
            pos += size

        def damaged(index: int, exc: CorruptDataError) -> None:
            self.damaged[index] = exc.message
            self._offsets[index] = pos  # an empty slot: never returned

        # Sequential first, the fastest way through a file; past damage, every
        # readable record one at a time.
        for index, data, exc in salvage.walk(reader):
            bar.update(1)
            try:
                if exc is not None:
                    raise exc
                if reader.verify:
                    reader.check(index, data)
            except CorruptDataError as err:
                if not skip_damaged:
                    raise
                damaged(index, err)
                continue
            put(index, data)
        self._offsets[n] = pos
        if self.damaged:
            # Offsets must not decrease for the slots after an empty one.
            np.maximum.accumulate(self._offsets, out=self._offsets)

    def _views(self, shm) -> None:
        n = self.count
        self._offsets = np.ndarray((n + 1,), dtype=np.int64, buffer=shm.buf, offset=0)
        self._data = np.ndarray((self.nbytes,), dtype=np.uint8, buffer=shm.buf,
                                offset=8 * (n + 1))

    def _state(self) -> dict:
        return {"nbytes": self.nbytes, "count": self.count, "path": self.path,
                "damaged": self.damaged}

    def read_many(self, indices: Sequence[int]) -> list[bytes]:
        """Payloads of the given (already range-checked) records.

        Raises:
            CorruptDataError: a record was damaged when the cache was filled.
        """
        off = self._offsets
        data = self._data
        if self.damaged:
            for i in indices:
                if i in self.damaged:
                    # "record 3 fails its CRC32 check" -> "it fails ...": named once.
                    why = self.damaged[i].removeprefix(f"record {i} ")
                    why = f"it {why}" if why != self.damaged[i] else why
                    raise CorruptDataError(f"record {i} was left out of the RAM cache: {why}",
                                           path=self.path, record=i)
        return [data[off[i]: off[i + 1]].tobytes() for i in indices]

    def __len__(self) -> int:
        return self.count


class SharedPixelCache(SharedBlock):
    """Every record decoded (and resized) once into one shared uint8 array
    ``pixels`` of shape (N, H, W, 3): no decoding after the fill.

    Args:
        reader: any fastdata Reader.
        decode: the Dataset's decoder chain; it must give one shape for every
            record (``size=(h, w)``, or raw records of one shape).
        threads: decode threads used while filling.
        progress: show a progress bar while filling.
    """

    kind = "decoded"

    def __init__(self, reader, decode, *, threads: int = 1,
                 progress: bool | None = None) -> None:
        from fastdata.decoding.decode import target_size

        n = len(reader)
        if decode.keep_gray:
            raise FastDataError("cache='decoded' stores 3-channel pixels; drop keep_gray",
                                path=reader.path)
        raw = decode.raw_shape
        hw = decode.size if isinstance(decode.size, tuple) else None
        if hw is None and raw is not None:
            hw = target_size(raw[0], raw[1], decode.size) or tuple(raw[:2])
        if hw is None:
            raise FastDataError(
                "cache='decoded' needs one image size: pass size=(h, w) (or pack with "
                "encoding='raw')", path=reader.path)
        self.shape = (n, int(hw[0]), int(hw[1]), 3)
        self.nbytes = int(np.prod(self.shape))
        self.count = n
        self.path = reader.path
        check_fits(self.nbytes, path=reader.path)
        self._create(self.nbytes)
        bar = progress_bar(n, "decode into cache", enabled=progress)
        pool = None
        if threads > 1:
            from concurrent.futures import ThreadPoolExecutor

            pool = ThreadPoolExecutor(threads, thread_name_prefix="fastdata-cache")
        try:
            chunk: list[tuple[int, bytes]] = []
            for item in _payloads(reader):
                chunk.append(item)
                if len(chunk) >= 256:
                    self._fill(chunk, decode, pool)
                    bar.update(len(chunk))
                    chunk = []
            if chunk:
                self._fill(chunk, decode, pool)
                bar.update(len(chunk))
        except BaseException:
            self._finalizer()
            raise
        finally:
            bar.close()
            if pool is not None:
                pool.shutdown()

    def _fill(self, chunk, decode, pool) -> None:
        def one(item):
            index, data = item
            try:
                array = decode(data)
            except Exception as exc:  # name the record: the cache cannot skip it
                raise FastDataError(f"record {index} cannot be decoded into the cache "
                                    f"({exception_text(exc)})",
                                    path=self.path, record=index) from exc
            if array.shape != self.shape[1:]:
                raise FastDataError(f"record {index} decodes to {array.shape}, not "
                                    f"{self.shape[1:]}", path=self.path, record=index)
            self.pixels[index] = array

        list(pool.map(one, chunk)) if pool is not None else [one(x) for x in chunk]

    def _views(self, shm) -> None:
        self.pixels = np.ndarray(self.shape, dtype=np.uint8, buffer=shm.buf)

    def _state(self) -> dict:
        return {"shape": self.shape, "nbytes": self.nbytes, "count": self.count,
                "path": self.path}

    def __len__(self) -> int:
        return self.count


def _payloads(reader):
    """(index, payload) of every record, checked as the reader checks them; for a
    reader whose walks run in a child (``walk_in_child``) through a payload
    cache that the child fills, freed at the end."""
    if not reader.walk_in_child:
        for index, data, _label in reader:
            yield index, data
        return
    payloads = SharedPayloadCache(reader, progress=False)
    try:
        for index in range(len(payloads)):
            yield index, payloads.read_many([index])[0]
    finally:
        payloads.close()
