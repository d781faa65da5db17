"""The stall meter's counters: the time each stage of making batches took, per process.

Every process that makes batches (the training process, each DataLoader
worker) adds to its own row of one small table: seconds per stage, seconds
busy, batches and samples made, cache and request counts. ``fastdata.loader()``
puts the table in shared memory before its workers start, so the training
process reads every worker's row when asked, without a message to the workers
and without a collective. A Dataset used without ``loader()`` keeps a table of
its own process only.

The stages, in the order a record passes them:

* ``fetch``: obtaining records of a dataset at a URL (its requests, and reads of
  the local copies the cache keeps of it);
* ``read``: reading records from a local file, or from the RAM cache;
* ``decode``: decoding (and cropping) a batch on the decode threads;
* ``transform``: a per-sample ``transform`` / ``target_transform``;
* ``collate``: the DataLoader's ``collate_fn`` (in the worker);
* ``convert``: uint8 to float and normalisation on the CPU (``CUDAPrefetcher``
  without a GPU);
* ``copy``: host to GPU, with the conversion there (only where CUDA runs).

A few ``perf_counter`` calls per batch, never per sample. What it holds does
not grow with the dataset: (workers + 1) rows of 17 numbers.
"""

from __future__ import annotations

import os
import time

import numpy as np

from fastdata.storage.shared_block import SharedBlock

STAGES = ("fetch", "read", "decode", "transform", "collate", "convert", "copy")
#: Columns of a row: the stages' seconds, then these.
COUNTS = ("busy", "batches", "samples", "first", "last", "ram_records", "shard_hits",
          "shard_downloads", "bytes", "requests")
COLUMNS = {name: i for i, name in enumerate(STAGES + COUNTS)}
WIDTH = len(COLUMNS)
#: Rows of a shared table beyond the training process's: one per worker, and
#: room for a DataLoader made later with more workers than the first.
MIN_WORKER_ROWS = 32

clock = time.perf_counter


class StageTable:
    """Rows of stage times: row 0 the process that made the table (or the
    training process), row ``k + 1`` DataLoader worker ``k``.

    Args:
        workers: worker rows to make room for (a shared table has at least 32).
        shared: in shared memory, readable by the process that made it after
            its workers added to it (else this process's alone).
    """

    def __init__(self, workers: int = 0, *, shared: bool = False) -> None:
        rows = 1 + (max(int(workers), MIN_WORKER_ROWS) if shared else 0)
        self.shared = bool(shared)
        self._pid = os.getpid()
        self._row_index: int | None = None
        if shared:
            self._block = _MeterBlock(rows)
            self.values = self._block.values
        else:
            self._block = None
            self.values = np.zeros((rows, WIDTH), dtype=np.float64)

    def __getstate__(self):
        # A worker gets the shared rows, or a table of its own.
        return {"shared": self.shared, "block": self._block, "rows": len(self.values)}

    def __setstate__(self, state) -> None:
        self.shared = state["shared"]
        self._pid = os.getpid()
        self._row_index = None
        self._block = state["block"]
        self.values = self._block.values if self._block is not None else \
            np.zeros((state["rows"], WIDTH), dtype=np.float64)

    def row(self) -> np.ndarray:
        """This process's row (a DataLoader worker's own, else row 0)."""
        if self._row_index is None or self._pid != os.getpid():
            self._pid = os.getpid()
            self._row_index = _worker_row(len(self.values)) if self.shared else 0
            if self._row_index is None:
                # More workers than rows: this worker's figures stay its own.
                self.values = np.zeros((1, WIDTH), dtype=np.float64)
                self._block, self.shared, self._row_index = None, False, 0
        return self.values[self._row_index]

    def add(self, stage: str, seconds: float, *, busy: bool = False) -> None:
        """Add ``seconds`` to ``stage`` in this process's row (and to its busy
        time: a stage run outside the making of a batch, such as collating)."""
        row = self.row()
        row[COLUMNS[stage]] += seconds
        if busy:
            row[_BUSY] += seconds
            row[_LAST] = clock()

    def made(self, start: float, samples: int, *, batch: bool = True,
             remote: bool = False) -> None:
        """``samples`` made from ``start`` (a :data:`clock` time) to now: a
        batch, or (``batch`` False) a group of a stream read per sample; read
        from a URL (``remote``): the process's request counts are copied too."""
        if remote:
            self.note_requests()
        now = clock()
        row = self.row()
        row[_BUSY] += now - start
        row[_BATCHES] += batch
        row[_SAMPLES] += samples
        if row[_FIRST] == 0.0:
            row[_FIRST] = start
        row[_LAST] = now

    def count(self, name: str, n: float = 1) -> None:
        self.row()[COLUMNS[name]] += n

    def note_requests(self) -> None:
        """Copy this process's request counts (the storage layer's) into its row."""
        from fastdata.storage import adaptive
        from fastdata.storage.cache import cache_counts

        figures = adaptive.snapshot()
        row = self.row()
        row[COLUMNS["bytes"]] = figures["bytes"]
        row[COLUMNS["requests"]] = figures["requests"]
        hits, downloads = cache_counts()
        row[COLUMNS["shard_hits"]] = hits
        row[COLUMNS["shard_downloads"]] = downloads

    def snapshot(self) -> np.ndarray:
        """A copy of every row now."""
        return np.array(self.values, copy=True)

    def close(self) -> None:
        if self._block is not None:
            self._block.close()


_BUSY, _BATCHES, _SAMPLES, _FIRST, _LAST = (COLUMNS[n] for n in
                                            ("busy", "batches", "samples", "first", "last"))


def _worker_row(rows: int) -> int | None:
    import sys

    # A DataLoader worker has torch loaded; this package does not import it.
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    if info is None:
        return 0
    return info.id + 1 if info.id + 1 < rows else None


class _MeterBlock(SharedBlock):
    """The table's rows in one POSIX shared-memory block."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self._create(rows * WIDTH * 8)

    def _views(self, shm) -> None:
        self.values = np.ndarray((self.rows, WIDTH), dtype=np.float64, buffer=shm.buf)

    def _state(self) -> dict:
        return {"rows": self.rows}

    def close(self) -> None:
        self.__dict__.pop("values", None)
        super().close()
