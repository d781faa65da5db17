"""Datasets as a job's pieces open them: described once by the machine
that plans the job (:func:`describe`: the version read now, so every piece
reads the same records), opened once per worker process (:func:`piece_reader`)."""

from __future__ import annotations

import os

#: Readers this process opened for pieces, by (process, dataset): a worker
#: running many pieces opens each dataset once; the least recently used of
#: more than ``OPEN_READERS`` is closed.
_READERS: dict = {}
OPEN_READERS = 4


def describe(paths: list[str], allow_outside: bool) -> tuple[list[dict], list[int]]:
    """How a piece opens each dataset of ``paths`` (path, the version read
    now, ``allow_outside``; the manifest's ``created_at`` too, so that a job
    resumed over a re-packed dataset is another job), and their record
    counts. The readers are closed again before pieces run: none is open
    across a fork."""
    from fastdata.dataset.resolve import open_reader

    datasets, counts = [], []
    for where in paths:
        reader = open_reader(where, allow_outside=allow_outside)
        try:
            record = getattr(reader, "record", None)
            view = record is not None and record.kind == "view"  # its file is one version
            datasets.append({"path": where,
                             "version": None if view else getattr(reader, "version", None),
                             "allow_outside": allow_outside,
                             "created_at": reader.manifest.created_at})
            counts.append(len(reader))
        finally:
            reader.close()
    return datasets, counts


def piece_reader(spec: dict):
    """The reader of the dataset ``spec`` (from :func:`describe`; a
    ``verify`` entry opens it with that setting) in this process."""
    from fastdata.dataset.resolve import open_reader

    # created_at: a dataset packed again at the same path is another dataset.
    key = (os.getpid(), spec["path"], spec.get("version"), spec.get("allow_outside"),
           spec.get("verify"), spec.get("created_at"))
    reader = _READERS.pop(key, None)
    if reader is None:
        for old in [k for k in _READERS if k[0] != os.getpid()]:
            del _READERS[old]  # a forked parent's: never used across fork
        while len(_READERS) >= OPEN_READERS:  # a long-lived worker of many jobs
            _READERS.pop(next(iter(_READERS))).close()
        reader = open_reader(spec["path"], version=spec.get("version"),
                             allow_outside=spec.get("allow_outside"),
                             verify=spec.get("verify"))
    _READERS[key] = reader  # the most recent last
    return reader
