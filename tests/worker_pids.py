"""Which processes did a test's work: pack workers, DataLoader workers.

A test that says N workers give what one gives proves nothing when the N
never ran. These record the id of the process that does each piece of work,
one line per piece, in a file of the test's folder, from any process (forked
or spawned): the module is importable wherever the tests run.

* :class:`PreparedIn`: a ``Preprocess`` that records the process preparing
  each image of a pack (``fastdata.packers.prepare.prepare`` asks every image's
  preprocess whether it has anything to do, in the pack's worker processes or,
  with one worker, in the packing process itself). It stores what the plain
  ``Preprocess`` with the same settings stores: the manifest holds neither its
  log nor its rendezvous.
* :class:`CollatedIn`: a ``collate_fn`` that records the process collating
  each batch (a DataLoader's worker, or the main process without workers).
* :class:`StartedIn`: a ``worker_init_fn`` that records each DataLoader worker
  as it starts, where a collate_fn of its own would change the loader's path.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

from fastdata.packers.preprocess import Preprocess

#: How long a pack worker waits at the rendezvous before going on alone (the
#: test then fails on the processes recorded); no test waits for it otherwise.
MEET_SECONDS = 120.0


def note(log: str) -> None:
    """Append this process's id to ``log`` (one short write: whole lines from
    concurrent processes)."""
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")


def pids(log) -> list[int]:
    """The process ids recorded in ``log``, one per piece of work, in order."""
    try:
        with open(log) as f:
            return [int(line) for line in f]
    except FileNotFoundError:
        return []


def assert_other_processes(log, count: int | None = None) -> set[int]:
    """The work recorded in ``log`` was done by processes other than this one:
    ``count`` of them, or at least 2. Returns their ids."""
    ran = set(pids(log))
    assert os.getpid() not in ran, f"this process did some of the work: {sorted(ran)}"
    if count is None:
        assert len(ran) >= 2, f"fewer than 2 processes did the work: {sorted(ran)}"
    else:
        assert len(ran) == count, f"not {count} processes did the work: {sorted(ran)}"
    return ran


def assert_this_process(log) -> None:
    """All the work recorded in ``log`` was done here, and some was."""
    ran = set(pids(log))
    assert ran == {os.getpid()}, f"work done elsewhere, or none: {sorted(ran)}"


def assert_workers_did_it(log, workers: int) -> None:
    """``workers`` worker processes did the work recorded in ``log``, none of
    it done here; 0: this process did it all."""
    if workers:
        assert_other_processes(log, count=workers)
    else:
        assert_this_process(log)


#: Logs whose rendezvous this process has passed.
_met: set[str] = set()


@dataclasses.dataclass(frozen=True)
class PreparedIn(Preprocess):
    """A ``Preprocess`` (same options, same output) that records in ``log``
    the process preparing each image.

    ``meet``: a worker process waits, at its first image, until that many
    worker processes have each taken an image (at most :data:`MEET_SECONDS`),
    so that every worker of the pool does some of the work instead of one
    fast starter taking every chunk. 1: no waiting. The process that made
    this object (the test's, packing) never waits.
    """

    log: str = ""
    meet: int = 1
    owner: int = dataclasses.field(default_factory=os.getpid)

    def to_dict(self) -> dict:
        out = super().to_dict()
        for name in ("log", "meet", "owner"):
            del out[name]
        return out

    @property
    def identity(self) -> bool:
        from fastdata.packers.prepare import prepare

        if sys._getframe(1).f_code is prepare.__code__:  # an image being prepared
            note(self.log)
            if os.getpid() != self.owner and self.meet > 1 and self.log not in _met:
                self._wait_for_the_others()
        return super().identity

    def _wait_for_the_others(self) -> None:
        end = time.monotonic() + MEET_SECONDS
        while len(set(pids(self.log)) - {self.owner}) < self.meet and time.monotonic() < end:
            time.sleep(0.005)
        _met.add(self.log)


class CollatedIn:
    """``collate_fn``: records the process in ``log`` (None: records nothing),
    then collates with ``collate``."""

    def __init__(self, log, collate) -> None:
        self.log, self.collate = (None if log is None else str(log)), collate

    def __call__(self, batch):
        if self.log is not None:
            note(self.log)
        return self.collate(batch)


class StartedIn:
    """``worker_init_fn``: records each DataLoader worker process as it starts."""

    def __init__(self, log) -> None:
        self.log = str(log)

    def __call__(self, worker_id: int) -> None:
        note(self.log)
