"""Packing on a cluster: ``fastdata pack SRC OUT --scheduler tcp://HOST:PORT``
(Dask) or ``--ray ADDRESS`` (Ray).

The client plans the pack as a local pack does (``plan.py``); the cluster's
workers do the pieces not journaled yet, one task per piece (the tasks are in
``cluster_tasks.py``; the executors in ``fastdata.jobs``):

- sharded formats (tar, TFRecord): a task writes its piece's shard into the
  partial output itself (a folder the workers share). The client checks and
  journals each piece as it arrives, in any order, then adopts them all in plan
  order and publishes (index, keys, manifest last): a local pack's files, byte
  for byte.
- single-file formats (LMDB, HDF5): a task returns its piece's prepared
  records; the client writes them in plan order, a bounded number of pieces in
  flight.

A task whose worker died is rerun (the same piece, the same bytes). A lost
cluster stops the pack with :class:`SchedulerLost`, and the journaled pieces
stay for ``--resume``. distributed and ray are imported only when a pack is
given a cluster: a local pack imports neither.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator

from fastdata.errors import BadImageError, FastDataError
from fastdata.formats.writer import PieceLost
from fastdata.jobs.choose import open_executor
from fastdata.jobs.executor import ClusterLost
from fastdata.packers.cluster_tasks import pack_shard_piece, prepare_piece
from fastdata.packers.journal import PackInterrupted, parse_outcomes
from fastdata.packers.pieces import entries_to_prepare, write_items, write_pieces
from fastdata.packers.plan import PackPlan, plan_entries

class SchedulerLost(PackInterrupted):
    """The cluster (a Dask scheduler, a Ray head) went away during a pack;
    journaled pieces are kept."""


def write_on_cluster(cluster: dict, writer, spec, src, plan: PackPlan | None, kept: dict,
                     journal, tally, options, writer_options: dict, source_root: str | None,
                     output: str, open_bar: Callable) -> None:
    """Prepare (and for sharded formats write) on the cluster that
    ``cluster`` names (``scheduler=`` or ``ray=``, as ``open_executor`` takes
    them) every piece of ``plan`` not in ``kept``, and write them all into
    ``writer`` as a local pack would. ``plan`` is None for a format that
    cannot resume; ``open_bar()`` gives the progress bar (opened once
    connected)."""
    try:
        with contextlib.closing(open_executor(**cluster, on_event=tally.on_event)) as executor:
            _write_with(executor, writer, spec, src, plan, kept, journal, tally, options,
                        writer_options, source_root, output, open_bar)
    except ClusterLost as lost:
        raise _lost(lost, journal if writer.resumable else None) from None
    if spec.sharded:
        # Every piece is in the partial output: adopt them in plan order and publish.
        done = journal.pieces()
        write_pieces(writer, plan, done.only(range(len(plan.pieces))), iter(()),
                     journal, tally, strict=options.strict, source_root=source_root,
                     adopted_already=False, on_entries=lambda n: None)


def _lost(lost: ClusterLost, journal) -> SchedulerLost:
    if journal is None:
        return SchedulerLost(f"{lost.message}; the pack stopped and nothing was written: "
                             "pack again")
    done = len(journal.pieces())
    return SchedulerLost(
        f"{lost.message}; the {done} finished piece{'s are' if done != 1 else ' is'} kept: "
        "the same command with --resume continues the pack, on the cluster or not")


def _write_with(cluster, writer, spec, src, plan: PackPlan | None, kept: dict, journal,
                tally, options, writer_options: dict, source_root: str | None,
                output: str, open_bar: Callable) -> None:
    prepare_options = (options.verify_decode, options.preprocess, options.max_pixels)
    strict = options.strict
    with open_bar() as bar:
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


def _write_shards(cluster, writer, plan: PackPlan, kept: dict, pieces, args,
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
                f"piece {number}, written by a worker of {cluster.where}, is not whole in the partial "
                "output here: the workers must write OUTPUT's folder at the same path as "
                "the machine running the pack (a shared file system)",
                path=writer.temp_path) from None
        journal.record(number, outcomes, state)
        on_entries(_size(plan, number))
        if first_bad is not None:
            first_bad.add(number, outcomes)


def _prepared(cluster, pieces, args) -> Iterator:
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


