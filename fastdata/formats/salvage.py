"""Reading past damage: the fast way first, one record at a time where it fails.

Every part of fastdata that reads many records (streams, the RAM cache,
``verify``) wants the same two things: the fast read (a batch in one call, or
the container's sequential walk), and, where that read hits damage, every
record that can still be read, each damaged one named. The two ways are here,
once; what a damaged record means (raise, skip and count, report) stays with
the caller. No torch here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from fastdata.errors import CorruptDataError

#: Records read per batch before falling back to one at a time.
BATCH = 64


def read_batches(indices: Sequence[int], read_many: Callable[[list[int]], list],
                 read_one: Callable[[int], object], batch: int = BATCH
                 ) -> Iterator[tuple[int, object, CorruptDataError | None]]:
    """``(index, value, None)`` for each of ``indices`` in order, read ``batch``
    at a time with ``read_many``; a batch that raises CorruptDataError is read
    again with ``read_one``, and a record that still fails is given as
    ``(index, None, error)``."""
    for start in range(0, len(indices), batch):
        part = list(indices[start:start + batch])
        try:
            values = read_many(part)
        except CorruptDataError:
            values = None  # find the bad ones: one record at a time
        for k, index in enumerate(part):
            if values is not None:
                yield index, values[k], None
                continue
            try:
                yield index, read_one(index), None
            except CorruptDataError as exc:
                yield index, None, exc


def walk(reader) -> Iterator[tuple[int, object, CorruptDataError | None]]:
    """Every record of ``reader`` in stored order as ``(index, payload, None)``:
    the container's sequential walk (payloads not yet checked against their
    CRC32), and where the walk breaks on damage, ``(index, None, error)`` for
    the record it broke at and the rest read one at a time through the index
    (``reader.read``: checked), a record that fails given as its error."""
    next_index = 0
    try:
        for index, data, _label in reader.records(check=False):
            next_index = index + 1
            yield index, data, None
    except CorruptDataError as exc:
        yield next_index, None, exc
        for index in range(next_index + 1, len(reader)):
            try:
                yield index, reader.read(index), None
            except CorruptDataError as err:
                yield index, None, err
