"""Packing on a Dask cluster: ``fastdata pack SRC OUT --scheduler tcp://HOST:PORT``.

The client plans the pack as a local pack does (``plan.py``); the cluster's
workers do the pieces not journaled yet, one task per piece (the tasks are in
``cluster_tasks.py``):

- sharded formats (tar, TFRecord): a task writes its piece's shard into the
  partial output itself (a folder the workers share). The client checks and
  journals each piece as it arrives, in any order, then adopts them all in plan
  order and publishes (index, keys, manifest last): a local pack's files, byte
  for byte.
- single-file formats (LMDB, HDF5): a task returns its piece's prepared
  records; the client writes them in plan order, a bounded number of pieces in
  flight.

A task whose worker died is rerun by Dask (the same piece, the same bytes). A
lost scheduler stops the pack with :class:`SchedulerLost`, and the journaled
pieces stay for ``--resume``. distributed is imported (``cluster_connect.py``)
only when a pack is given a scheduler: a local pack never imports dask.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator

from fastdata.errors import BadImageError, FastDataError
from fastdata.formats.writer import PieceLost
from fastdata.packers.cluster_connect import (
    CONNECT_SECONDS,
    connect,
    import_distributed,
    quiet_distributed,
)
from fastdata.packers.cluster_tasks import known_keys, pack_shard_piece, prepare_piece
from fastdata.packers.journal import PackInterrupted, parse_outcomes
from fastdata.packers.pieces import entries_to_prepare, write_items, write_pieces
from fastdata.packers.plan import PackPlan, plan_entries

#: Reruns of a task that raised (a passing file-system error on a worker); a
#: task whose worker died is rerun by Dask whatever this says.
TASK_RETRIES = 2
#: Pieces in flight per worker thread: one running, one queued behind it.
PIECES_PER_THREAD = 2
#: How long a stopped pack waits for its tasks still running on workers.
DRAIN_SECONDS = 20.0


class SchedulerLost(PackInterrupted):
    """The Dask scheduler went away during a pack; journaled pieces are kept."""


def write_on_cluster(scheduler, writer, spec, src, plan: PackPlan | None, kept: dict, journal,
                     tally, options, writer_options: dict, source_root: str | None,
                     output: str, open_bar: Callable) -> None:
    """Prepare (and for sharded formats write) on the cluster at ``scheduler``
    every piece of ``plan`` not in ``kept``, and write them all into ``writer``
    as a local pack would. ``plan`` is None for a format that cannot resume;
    ``open_bar()`` gives the progress bar (opened once connected)."""
    prepare_options = (options.verify_decode, options.preprocess, options.max_pixels)
    strict = options.strict
    with _Cluster(scheduler, journal if writer.resumable else None, tally.on_event) as cluster, \
            open_bar() as bar:
        if not spec.sharded:
            pieces = plan or PackPlan.build(src, src.classes, {}, sharded=False,
                                            entries_path=plan_entries(writer))
            items = _prepared(cluster, _pieces_to_send(src, pieces, kept),
                              (prepare_options, source_root))
            if plan is None:
                write_items(writer, items, tally, strict=strict, source_root=source_root,
                            on_entries=bar.update)
            else:
                write_pieces(writer, plan, kept, items, journal, tally, strict=strict,
                             source_root=source_root, adopted_already=True,
                             on_entries=bar.update)
            return
        args = (prepare_options, spec.name, output, writer_options, writer.temp_path,
                source_root)
        _write_shards(cluster, writer, plan, kept, _pieces_to_send(src, plan, kept), args,
                      journal, strict=strict, source_root=source_root, on_entries=bar.update)
    # Every piece is in the partial output: adopt them in plan order and publish.
    done = journal.pieces()
    write_pieces(writer, plan, done.only(range(len(plan.pieces))), iter(()),
                 journal, tally, strict=strict, source_root=source_root,
                 adopted_already=False, on_entries=lambda n: None)


def _write_shards(cluster: "_Cluster", writer, plan: PackPlan, kept: dict, pieces, args,
                  journal, *, strict: bool, source_root: str | None,
                  on_entries: Callable[[int], None]) -> None:
    """Run a task per piece to send; check and journal each shard as it comes."""
    for number in kept:
        on_entries(_size(plan, number))
    first_bad = _FirstBad(kept, source_root) if strict else None
    for number, (outcomes, state) in cluster.results(pack_shard_piece, pieces, args,
                                                     in_order=False):
        records = parse_outcomes(outcomes)[0]
        try:
            writer.check_piece(number, state, records)
        except PieceLost:
            raise FastDataError(
                f"piece {number}, written by a Dask worker, is not whole in the partial "
                "output here: the workers must write OUTPUT's folder at the same path as "
                "the machine running the pack (a shared file system)",
                path=writer.temp_path) from None
        journal.record(number, outcomes, state)
        on_entries(_size(plan, number))
        if first_bad is not None:
            first_bad.add(number, outcomes)


def _prepared(cluster: "_Cluster", pieces, args) -> Iterator:
    """The prepared entries of ``pieces``, in plan order."""
    for _number, items in cluster.results(prepare_piece, pieces, args, in_order=True):
        yield from items


def _pieces_to_send(src, plan: PackPlan, kept: dict) -> Iterator[tuple[int, list]]:
    """(number, entries) of each piece not kept, in plan order, from a second
    pass over the source; relative paths made absolute (workers have their own
    working folder)."""
    entries = entries_to_prepare(src, plan, kept)
    for number, (start, end) in enumerate(plan.pieces):
        if number not in kept:
            yield number, [_absolute(next(entries)) for _ in range(start, end)]


def _absolute(entry):
    if entry.path is None or os.path.isabs(entry.path):
        return entry
    return dataclasses.replace(entry, path=os.path.abspath(entry.path))


def _size(plan: PackPlan, number: int) -> int:
    start, end = plan.pieces[number]
    return end - start


class _FirstBad:
    """Under ``strict``: raise for the first skipped image in plan order, once
    every piece before its own is done (pieces finish in any order)."""

    def __init__(self, kept: dict, source_root: str | None) -> None:
        self._done = set(kept)
        self._lowest_open = 0
        self._first: tuple[int, str, str] | None = None
        self._root = source_root

    def add(self, number: int, outcomes: list) -> None:
        self._done.add(number)
        skip = next((o for o in outcomes if len(o) == 2), None)
        if skip is not None and (self._first is None or number < self._first[0]):
            self._first = (number, skip[0], skip[1])
        while self._lowest_open in self._done:
            self._lowest_open += 1
        if self._first is not None and self._lowest_open > self._first[0]:
            _, key, reason = self._first
            raise BadImageError(reason + " (strict=True stops at the first bad image)",
                                path=os.path.join(self._root, key) if self._root else key,
                                key=key)


class _Cluster:
    """A connection to the scheduler, and the tasks of this pack on it."""

    def __init__(self, scheduler, journal, on_event: Callable[[str], None] | None) -> None:
        self._dd = import_distributed()
        self._journal = journal  # None: nothing is kept when the scheduler goes
        self._quiet = contextlib.ExitStack()
        if isinstance(scheduler, str):
            self.address, self._own = scheduler, True
            # Our own client: its connection trouble is ours to report, in one line.
            self._quiet.enter_context(quiet_distributed())
            try:
                self.client = connect(self._dd, scheduler)
            except BaseException:
                self._quiet.close()
                raise
        elif isinstance(scheduler, self._dd.Client):
            self.client, self._own = scheduler, False
            self.address = scheduler.scheduler.address
        else:
            raise FastDataError("scheduler= takes a Dask scheduler's address "
                                "('tcp://HOST:8786') or a distributed.Client, not a "
                                f"{type(scheduler).__name__}")
        self._prefix = f"fastdata-pack-{uuid.uuid4().hex[:12]}-piece"
        self._futures: dict[int, object] = {}
        self._threads, self._counted_at = 0, 0.0
        self._gone = False  # the scheduler was lost
        try:
            if on_event is not None and self._thread_count() == 0:
                on_event(f"the Dask scheduler at {self.address} has no workers yet; the "
                         "pack starts when they connect")
            self._check_workers()
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __enter__(self) -> "_Cluster":
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._futures and not self._gone and self.client.status == "running":
                self.client.cancel(list(self._futures.values()))
                self._drain()
        finally:
            self._futures.clear()
            try:
                if self._own:
                    self.client.close(timeout=2 if self._gone else CONNECT_SECONDS)
            except (OSError, TimeoutError):
                pass  # a client of a lost scheduler may not close cleanly; nothing is lost
            finally:
                self._quiet.close()

    def _drain(self) -> None:
        """Wait a while until no worker has this pack's tasks: Dask lets a
        running task end, a queued one may start before the cancel reaches its
        worker, and neither may write into a partial output that the failed
        pack is about to remove. Twice in a row, as a cancel and a task for the
        same worker can cross."""
        end = time.monotonic() + DRAIN_SECONDS
        clear = 0
        while time.monotonic() < end and clear < 2:
            try:
                known = self.client.run(known_keys, self._prefix, on_error="ignore")
            except Exception:  # noqa: BLE001 - the scheduler went too: nothing to ask
                return
            busy = any(isinstance(keys, list) and keys for keys in known.values())
            clear = 0 if busy else clear + 1
            time.sleep(0.05)

    def results(self, fn, pieces, args: tuple, *, in_order: bool):
        """``(number, fn(number, entries, *args))`` for each ``(number,
        entries)`` of ``pieces``, a few per worker thread in flight: in the
        order of ``pieces``, or as they finish."""
        pieces = iter(pieces)
        queue: deque[int] = deque()
        finished = None if in_order else self._dd.as_completed(loop=self.client.loop)

        def submit_more() -> None:
            while len(self._futures) < self._window():
                number, entries = next(pieces, (None, None))
                if number is None:
                    return
                future = self.client.submit(fn, number, entries, *args, pure=False,
                                            key=f"{self._prefix}-{number}",
                                            retries=TASK_RETRIES)
                self._futures[number] = future
                if finished is None:
                    queue.append(number)
                else:
                    finished.add(future)

        submit_more()
        while self._futures:
            if finished is None:
                future = self._futures[queue.popleft()]
            else:
                future = next(finished)
            number = self._number(future)
            result = self._result(future, number)
            del self._futures[number]  # the scheduler forgets it
            submit_more()
            yield number, result

    def _number(self, future) -> int:
        return int(str(future.key).rsplit("-", 1)[1])

    def _result(self, future, number: int):
        """The task's result, its error as one clear line, or SchedulerLost."""
        try:
            return future.result()
        except FastDataError:
            raise
        except Exception as exc:  # noqa: BLE001 - anything a task or the connection raised
            if future.status != "error" or self.client.status != "running":
                # Cancelled, or its result could not be fetched: the connection went.
                raise self._lost("the connection closed") from None
            cause = exc if isinstance(exc, ImportError) else exc.__cause__
            if isinstance(cause, ImportError) or "deserializ" in str(exc):
                raise FastDataError(
                    f"the Dask cluster at {self.address} cannot load fastdata's tasks ("
                    f"{cause if isinstance(cause, ImportError) else 'a deserialization error'}"
                    "): install fastdata, the same version, on the scheduler and on every "
                    "worker") from None
            if isinstance(exc, self._dd.KilledWorker):
                self._check_workers(f"piece {number}: ")
                raise FastDataError(
                    f"piece {number}: every Dask worker that ran it died (out of "
                    f"memory?): {exc}") from None
            if isinstance(exc, OSError):
                raise FastDataError(f"piece {number} failed on a Dask worker: "
                                    f"{exc}") from exc
            raise

    def _check_workers(self, prefix: str = "") -> None:
        """Refuse workers that cannot import fastdata: they would die
        unpacking its tasks (a worker that joins later is asked when one dies).

        Raises:
            FastDataError: naming them and what to install.
        """
        lacking = self._workers_without_fastdata()
        if lacking:
            raise FastDataError(
                f"{prefix}the Dask worker(s) at {', '.join(lacking[:3])}"
                f"{' ...' if len(lacking) > 3 else ''} cannot import fastdata, so they die "
                f"unpacking its tasks: install fastdata, the same version, on every worker "
                f"and on the scheduler")

    def _workers_without_fastdata(self) -> list[str]:
        """The workers where fastdata cannot be imported (asked with a function
        that needs only the standard library, so it runs where fastdata does
        not); none when they cannot be asked."""
        def has_fastdata() -> bool:
            return __import__("importlib.util").util.find_spec("fastdata") is not None

        try:
            found = self.client.run(has_fastdata, on_error="ignore")
        except Exception:  # noqa: BLE001 - only a better message is at stake
            return []
        return sorted(w for w, ok in found.items() if ok is False)

    def _window(self) -> int:
        """Pieces in flight: bounded, so memory is, and enough to keep every
        worker thread busy (counted again every few seconds: workers come and go)."""
        if time.monotonic() - self._counted_at > 2.0:
            self._threads = self._thread_count()
        return max(2, PIECES_PER_THREAD * self._threads)

    def _thread_count(self) -> int:
        self._counted_at = time.monotonic()
        if self.client.status != "running":
            return self._threads  # lost: the next result says so
        try:
            return sum(self.client.nthreads().values())
        except (OSError, TimeoutError):
            raise self._lost("it does not answer") from None

    def _lost(self, why: str) -> SchedulerLost:
        self._gone = True
        if self._journal is None:
            return SchedulerLost(f"lost the Dask scheduler at {self.address} ({why}); the "
                                 "pack stopped and nothing was written: pack again")
        done = len(self._journal.pieces())
        return SchedulerLost(
            f"lost the Dask scheduler at {self.address} ({why}); the {done} finished "
            f"piece{'s are' if done != 1 else ' is'} kept: the same command with --resume "
            "continues the pack, with or without --scheduler")
