"""Running a job's pieces on an executor, journaled for ``--resume``.

A :class:`Job` is a plan of independent pieces: a top-level function
``fn(number, arg, work, *common)`` and one ``arg`` per piece, each piece
writing only files of its own in the job's work folder ``work`` and
returning a small JSON value. :func:`run_job` runs the pieces not
journaled yet on the executor, journals each result as it arrives (in any
order) and returns them all in piece order; the job's merge reads them.
Results pass through JSON whether fresh or resumed, so a merge sees the
same values whichever executor ran the pieces, and whether they ran now.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fastdata.errors import FastDataError
from fastdata.jobs.executor import ClusterLost, Executor
from fastdata.jobs.journal import JobJournal, work_folder
from fastdata.progress import progress_bar


class JobInterrupted(FastDataError):
    """The cluster went away during a job; its finished pieces are kept."""


@dataclass(frozen=True)
class Job:
    """A job's plan (see the module's docstring).

    Attributes:
        kind: its name ("dedup"), for the work folder and messages.
        fingerprint: its inputs and options (JSON): ``--resume`` continues
            only a job with the same.
        fn: the piece function, top-level (a worker imports it by name).
        args: one picklable argument per piece.
        common: arguments every piece gets after ``work``.
        sizes: units of work per piece (records), for the progress bar.
        writes_files: pieces write files into ``work`` (on a cluster it must
            then be a folder its workers share).
    """

    kind: str
    fingerprint: dict
    fn: Callable
    args: Sequence
    common: tuple = ()
    sizes: Sequence[int] = field(default_factory=tuple)
    writes_files: bool = True


@dataclass
class JobRun:
    """A job's results (in piece order) and its work folder, which
    :meth:`finish` removes once the merge is done."""

    results: list
    journal: JobJournal

    @property
    def work(self) -> str:
        return self.journal.folder

    def finish(self) -> None:
        self.journal.remove()

    @contextlib.contextmanager
    def merging(self, executor: Executor):
        """Around the work that follows the pieces (more pieces on
        ``executor``, a merge): a lost cluster keeps the folder for
        ``--resume`` (the pieces journaled are not run again), a failure
        removes it, as :func:`run_job` does for the pieces."""
        try:
            yield self
        except ClusterLost as lost:
            self.journal.release()
            count = len(self.results)
            raise _interrupted(lost, self.journal.kind, count, count) from None
        except FastDataError:
            executor.close()
            self.finish()
            raise
        except BaseException:
            self.journal.release()
            raise


def run_job(job: Job, executor: Executor, *, resume: bool = False,
            progress: bool | None = None,
            on_event: Callable[[str], None] | None = None) -> JobRun:
    """Run ``job``'s pieces not journaled yet on ``executor``.

    Raises:
        JobInterrupted: the cluster went away (the finished pieces are kept:
            the same call with ``resume=True`` continues).
        FastDataError: a piece failed (named), or see :class:`JobJournal`.
    """
    count = len(job.args)
    folder = work_folder(job.kind, job.fingerprint,
                         shared=job.writes_files and executor.remote)
    journal = JobJournal(folder, job.kind, job.fingerprint, count)
    done = journal.begin(resume=resume, on_event=on_event)
    sizes = list(job.sizes) or [1] * count
    todo = ((n, job.args[n]) for n in range(count) if n not in done)
    try:
        with progress_bar(sum(sizes), job.kind, enabled=progress) as bar:
            bar.update(sum(sizes[n] for n in done))
            for number, result in executor.results(job.fn, todo, (folder, *job.common),
                                                   in_order=False):
                result = json.loads(json.dumps(result))
                journal.record(number, result)
                done[number] = result
                bar.update(sizes[number])
    except ClusterLost as lost:
        journal.release()
        raise _interrupted(lost, job.kind, len(done), count) from None
    except FastDataError:
        # A piece's own failure: a rerun would meet it again. The pieces still
        # out are stopped first, or they write into the folder as it goes.
        executor.close()
        journal.remove()
        raise
    except BaseException:
        journal.release()  # Ctrl-C, a crash: the finished pieces stay for --resume
        raise
    return JobRun([done[n] for n in range(count)], journal)


def _interrupted(lost: ClusterLost, kind: str, kept: int, count: int) -> JobInterrupted:
    return JobInterrupted(
        f"{lost.message}; the {kept} finished piece{'s' if kept != 1 else ''} of {count} "
        f"{'are' if kept != 1 else 'is'} kept: the same command with --resume continues the {kind}, "
        "on the cluster or not")
