"""Checking a whole packed dataset against its stored checksums (``fastdata verify``).

What is checked, in order:

1. on open, the per-record arrays against their SHA-256 in the manifest and
   every label against the classes (a failure there is raised: nothing can be
   checked with a damaged index or label array; see fastdata.formats.integrity);
2. the tables that locate records (sharded formats: every piece of the index
   rows against its CRC-32, which reading checks only as pieces are used, and
   the rows in order, without overlap, inside their shards) and the keys'
   SHA-256;
3. every record's CRC32 (and with ``decode`` its decoding, JPEGs strictly:
   libjpeg's corrupt-data warnings count as damage, see
   ``fastdata.decoding.strict``); damage that stops a sequential read is
   reported for that record, and the records after it are read one at a time;
   in a dataset with per-sample metadata, every record's metadata JSON against
   its own CRC32 (the arrays of those against their SHA-256) and as JSON;
4. whole files against the manifest: the SHA-256 and size of every tar and
   TFRecord shard (headers, padding, ``.cls`` members and framing included;
   a shard of another pack shows up here) and each TFRecord ``.idx`` file
   against the dataset index.

Formats whose C library can die on a damaged file (``Reader.walk_in_child``:
LMDB) are checked in a child process; its death is reported as damage of the
file, never an abort of this process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from fastdata.decoding.strict import StrictDecoder
from fastdata.errors import CorruptDataError, DamagedImageError, exception_text
from fastdata.formats import salvage
from fastdata.progress import progress_bar

#: Unreadable records in a row after which the rest of a file is not tried
#: one by one (a truncated or missing file would otherwise list every record).
MAX_UNREADABLE_RUN = 64


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of ``verify_reader``: how many records were checked and what failed.

    ``problems`` holds dicts ``{"index", "key", "path", "reason"}``: ``index``
    is the record, or None for a problem with a whole file (a shard failing
    its SHA-256, a damaged ``.idx``).
    """

    path: str
    format: str
    count: int
    checked: int
    decoded: bool
    problems: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.checked == self.count

    @property
    def damaged(self) -> int:
        """Records with a problem."""
        return len({p["index"] for p in self.problems if p["index"] is not None})

    def to_dict(self) -> dict:
        return dict(asdict(self), ok=self.ok, damaged=self.damaged)


def verify_reader(reader, *, decode: bool = False, progress: bool | None = None
                  ) -> VerifyResult:
    """Check every record of the dataset ``reader`` reads, and every file its
    manifest covers (``fastdata.ops.verify.verify_dataset`` opens a path and calls
    this). Open the reader with ``verify=True``: formats with checks of their
    own framing (TFRecord's CRC32C of every record) run them too; the
    payload CRC32 is checked here. The reader is closed when done.

    Args:
        decode: also decode every image (JPEGs strictly: a JPEG that decodes
            only with libjpeg's corrupt-data warning is reported as damaged).
        progress: show a progress bar (None: only on a terminal).

    Returns:
        The result; damaged records and files are listed, not raised.
    """
    problems: list[dict] = []
    bar = progress_bar(len(reader), "verify", enabled=progress)
    try:
        if reader.walk_in_child:
            checked = _verify_in_child(reader, decode=decode, on_problem=problems.append,
                                       on_progress=bar.update)
        else:
            checked = check_dataset(reader, decode=decode, on_problem=problems.append,
                                    on_progress=bar.update, progress=progress)
    finally:
        bar.close()
        reader.close()
    return VerifyResult(reader.path, reader.format_name, len(reader), checked, decode, problems)


def _verify_in_child(reader, *, decode: bool, on_problem: Callable[[dict], None],
                     on_progress: Callable[[int], None]) -> int:
    """The checks of ``reader``'s dataset run in a child process (see
    fastdata.formats.isolate); the records checked. A death of the child is
    one more problem."""
    from fastdata.formats.isolate import ChildDied, NoChild, walk_in_child

    checked: list[int] = []

    def on_message(message: dict) -> None:
        if "problem" in message:
            on_problem(message["problem"])
        elif "result" in message:
            checked.append(message["result"]["checked"])

    try:
        done = walk_in_child(reader, f"{__name__}:_verify_task", {"decode": decode},
                             on_message, on_progress)
    except NoChild:
        return check_dataset(reader, decode=decode, on_problem=on_problem,
                             on_progress=on_progress)
    except ChildDied as died:
        on_problem({"index": None, "key": None, "path": reader.crash_path(),
                    "reason": died.reason})
        return died.done
    return checked[0] if checked else done


def _verify_task(reader, args: dict, out) -> None:
    """The child's side of :func:`_verify_in_child`."""
    checked = check_dataset(reader, decode=args["decode"],
                            on_problem=lambda p: out.send({"problem": p}),
                            on_progress=out.update)
    out.send({"result": {"checked": checked}})


def check_dataset(reader, *, decode: bool, on_problem: Callable[[dict], None],
                  on_progress: Callable[[int], None], progress: bool | None = False) -> int:
    """Run the checks 2-4 of the module doc on an open reader; the records checked."""
    located = check_index(reader, on_problem)
    # Records cannot be located through a damaged index: the walk would read
    # the wrong bytes (and report the damage again, record by record).
    checked = _check_records(reader, decode, on_problem, on_progress) if located else 0
    if located:
        check_metadata(reader, on_problem)
    bars = []

    def on_bytes(n: int) -> None:  # a bar only for formats that hash files
        if not bars:
            size = sum(int(s.get("bytes") or 0) for s in reader.manifest.shards)
            bars.append(progress_bar(size, "sha256", enabled=progress, unit="B"))
        bars[0].update(n)

    try:
        for problem in reader.check_files(on_bytes=on_bytes):
            on_problem(with_key(reader, problem))
    finally:
        for bar in bars:
            bar.close()
    return checked


def check_index(reader, on_problem: Callable[[dict], None], *,
                streamed: bool = False) -> bool:
    """Check 2 of the module doc: the tables that locate records and the
    keys; whether the records can be located (no layout problem).
    ``streamed``: read the keys file in pieces where the format can, not
    every key into memory (a job's machine, at any record count)."""
    layout = [with_key(reader, p) for p in reader.check_layout()]
    for problem in layout:
        on_problem(problem)
    try:
        streamer = getattr(reader, "check_keys_streamed", None) if streamed else None
        if streamer is not None and streamer():
            return not layout
        reader.keys  # noqa: B018 (loading them checks their SHA-256)
        check_pieces = getattr(reader, "check_key_pieces", None)
        if check_pieces is not None:
            check_pieces()
    except CorruptDataError as exc:
        on_problem(_error_problem(reader, None, exc))
    return not layout


def _check_records(reader, decode: bool, on_problem, on_progress) -> int:
    # The walk, and past damage every readable record one at a time.
    return _check_walk(reader, salvage.walk(reader), len(reader), decode, on_problem,
                       on_progress)


def check_record_range(reader, start: int, end: int, *, decode: bool,
                       on_problem: Callable[[dict], None],
                       on_progress: Callable[[int], None]) -> int:
    """Check 3 of the module doc for records ``start``..``end - 1`` (a piece
    of a verify job, see fastdata.ops.verify_pieces): read in batches, past
    damage one at a time; the records checked."""
    def read_many(batch: list[int]) -> list:
        return reader.read_many(batch, check=False)

    items = salvage.read_batches(range(start, end), read_many,
                                 lambda i: read_many([i])[0])
    return _check_walk(reader, items, end, decode, on_problem, on_progress)


def _check_walk(reader, items, end: int, decode: bool, on_problem, on_progress) -> int:
    """Check each ``(index, data, error)`` of ``items`` (records before ``end``)."""
    # Raw records are pixels of the manifest's shape, not an encoded image.
    decode_one = StrictDecoder(raw_shape=reader.manifest.raw_shape) if decode else None
    checked = run = 0
    for index, data, exc in items:
        on_progress(1)
        if exc is not None:
            on_problem(_error_problem(reader, index, exc))
            run += 1
            if run >= MAX_UNREADABLE_RUN and index + 1 < end:
                on_problem({"index": None, "key": None, "path": exc.path or reader.path,
                            "reason": f"{run} records in a row are damaged: records "
                                      f"{index + 1}.. were not checked; re-pack the dataset"})
                break
            continue
        run = 0
        checked += 1
        _check_one(reader, index, data, decode_one, on_problem)
    return checked


def check_metadata(reader, on_problem) -> None:
    """Each record's metadata against its CRC32, and as JSON."""
    try:
        if not reader.has_metadata:
            return
        reader.metadata_crcs()  # the array itself first: its SHA-256
    except CorruptDataError as exc:
        on_problem(_error_problem(reader, None, exc))
        return
    read_many = lambda batch: reader.metadata_bytes_many(batch, check=False)  # noqa: E731
    for index, data, exc in salvage.read_batches(range(len(reader)), read_many,
                                                 lambda i: read_many([i])[0],
                                                 batch=_METADATA_BATCH):
        try:
            if exc is not None:
                raise exc
            reader.check_metadata(index, data)
            reader.parse_metadata(index, data)
        except CorruptDataError as err:
            on_problem(_error_problem(reader, index, err))


#: Records whose metadata is read at a time by verify.
_METADATA_BATCH = 256


def _check_one(reader, index: int, data, decode_one, on_problem) -> None:
    try:
        reader.check(index, data)
        if decode_one is not None:
            decode_one(data)
    except (CorruptDataError, DamagedImageError) as exc:
        on_problem(_problem(reader, index, exc.message))
    except Exception as exc:  # any decoder failure is a finding, not a crash
        on_problem(_problem(reader, index, f"cannot be decoded: {exception_text(exc)}"))


def _problem(reader, index: int | None, reason: str, path: str | None = None) -> dict:
    key = reader.key_of(index) if index is not None else None
    return {"index": index, "key": key, "path": path or reader.path, "reason": reason}


def _error_problem(reader, index: int | None, exc: CorruptDataError) -> dict:
    """A problem from an error: its file named when it is another one (a shard),
    and the record and its byte offset when the message does not say them
    already (a read by index names the offset only)."""
    reason = exc.message
    where = os.path.basename(exc.path) if exc.path and exc.path != reader.path else ""
    if exc.offset is not None and f"byte offset {exc.offset}" not in reason:
        record = f" record {index}" if index is not None and \
            f"record {index}" not in reason else ""
        where = f"{where}{record} at byte offset {exc.offset}".strip()
    return _problem(reader, index, f"{where}: {reason}" if where else reason, exc.path)


def with_key(reader, problem: dict) -> dict:
    index = problem.get("index")
    return {"index": index, "key": reader.key_of(index) if index is not None else None,
            "path": problem.get("path") or reader.path, "reason": problem["reason"]}
