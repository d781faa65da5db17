"""A job's work folder: the files its pieces write (sorted runs), and the
journal of its finished pieces that ``--resume`` continues from.

The folder is named after the job's kind and a digest of its fingerprint
(its inputs and options), under ``$FASTDATA_STAGING_DIR`` (a folder a
cluster's workers share) or, for a job on this machine, the system's
temporary folder: the same command finds it again. ``job.json`` holds the
kind, the fingerprint and the piece count; ``journal.jsonl`` one line per
finished piece, appended and fsynced after the piece's files are durable
(a line cut short by a crash is ignored). A lock held while the job runs
keeps a second run of the same job out. The folder goes when the job ends
well.

What grows with the dataset: one journal line per piece (the pieces'
results are small: counts, file names), and the pieces' files.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile

from fastdata.errors import FastDataError

JOB_FILE = "job.json"
JOURNAL_FILE = "journal.jsonl"
LOCK_FILE = "lock"
#: The environment variable naming a folder every worker of a cluster sees.
STAGING_ENV = "FASTDATA_STAGING_DIR"


def work_folder(kind: str, fingerprint: dict, *, shared: bool) -> str:
    """The folder of the job ``kind`` with ``fingerprint``; ``shared``: its
    pieces run on a cluster and write files, so the folder must be one its
    workers see.

    Raises:
        FastDataError: ``shared`` without ``$FASTDATA_STAGING_DIR``.
    """
    base = os.environ.get(STAGING_ENV)
    if not base:
        if shared:
            raise FastDataError(f"{kind} on a cluster writes its pieces' files in a folder "
                                f"every worker sees: set {STAGING_ENV} to one (a shared "
                                "file system, at the same path everywhere)")
        base = tempfile.gettempdir()
    text = json.dumps(fingerprint, sort_keys=True, separators=(",", ":"))
    name = f"fastdata-{kind}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    return os.path.join(os.path.abspath(base), name)


class JobJournal:
    """The work folder of one run of a job (see the module's docstring)."""

    def __init__(self, folder: str, kind: str, fingerprint: dict, pieces: int) -> None:
        self.folder = folder
        self.kind, self._fingerprint, self._pieces = kind, fingerprint, pieces
        self._lock = None

    def begin(self, *, resume: bool, on_event=None) -> dict[int, object]:
        """Take the folder: the results kept (``resume``), else none (an
        earlier run's folder is cleared).

        Raises:
            FastDataError: the same job runs already, or the kept job is
                another's (inputs or options changed).
        """
        os.makedirs(self.folder, exist_ok=True)
        self._take_lock()
        saved = self._saved()
        if resume and saved is not None:
            if saved != self._description():
                raise FastDataError(
                    f"the interrupted {self.kind} kept in {self.folder} has other inputs or "
                    "options; run without --resume to start over", path=self.folder)
            return self._results()
        if resume and on_event is not None:
            on_event(f"no interrupted {self.kind} of these inputs to resume; starting from "
                     "the start")
        elif saved is not None and on_event is not None:
            on_event(f"an interrupted {self.kind} of these inputs was kept; starting over "
                     "(--resume would have continued it)")
        self._clear()
        _write_json(os.path.join(self.folder, JOB_FILE), self._description())
        return {}

    def record(self, number: int, result) -> None:
        """Journal piece ``number``'s result (after its files are durable)."""
        line = json.dumps({"piece": number, "result": result}, separators=(",", ":"))
        with open(os.path.join(self.folder, JOURNAL_FILE), "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def remove(self) -> None:
        """The job ended well: its folder goes."""
        self.release()
        shutil.rmtree(self.folder, ignore_errors=True)

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _take_lock(self) -> None:
        lock = open(os.path.join(self.folder, LOCK_FILE), "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            raise FastDataError(f"the same {self.kind} runs already (its work folder is "
                                "locked); wait for it to end", path=self.folder) from None
        self._lock = lock

    def _description(self) -> dict:
        return {"kind": self.kind, "pieces": self._pieces, "fingerprint": self._fingerprint}

    def _saved(self) -> dict | None:
        try:
            with open(os.path.join(self.folder, JOB_FILE), encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def _results(self) -> dict[int, object]:
        results: dict[int, object] = {}
        with contextlib.suppress(FileNotFoundError), \
                open(os.path.join(self.folder, JOURNAL_FILE), encoding="utf-8") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                    number = int(entry["piece"])
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut short by a crash
                if 0 <= number < self._pieces:
                    results[number] = entry["result"]
        return results

    def _clear(self) -> None:
        for name in os.listdir(self.folder):
            if name == LOCK_FILE:
                continue
            path = os.path.join(self.folder, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)


def _write_json(path: str, value) -> None:
    temp = f"{path}.tmp-{os.getpid()}"
    with open(temp, "w", encoding="utf-8") as f:
        json.dump(value, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)
