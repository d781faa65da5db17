"""Checking a whole packed dataset against its stored checksums (``fastdata verify``)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from fastdata.errors import CorruptDataError
from fastdata.loaders.decode import DecoderChain
from fastdata.formats import open_reader
from fastdata.progress import progress_bar


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of ``verify_dataset``: how many records were checked and which failed."""

    path: str
    format: str
    count: int
    checked: int
    decoded: bool
    problems: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.checked == self.count

    def to_dict(self) -> dict:
        return dict(asdict(self), ok=self.ok)


def verify_dataset(path: str | os.PathLike, *, decode: bool = False,
                   progress: bool | None = None) -> VerifyResult:
    """Read every record of ``path`` in storage order and check its CRC32.

    Args:
        path: a packed dataset.
        decode: also decode every image.
        progress: show a progress bar (None: only on a terminal).

    Returns:
        The result; damaged records are listed, not raised.
    """
    reader = open_reader(path, verify=False)
    # Raw records are pixels of the manifest's shape, not an encoded image.
    decode_one = DecoderChain(raw_shape=reader.manifest.raw_shape) if decode else None
    problems: list[dict] = []
    checked = 0
    bar = progress_bar(len(reader), "verify", enabled=progress)
    try:
        try:
            for index, data, _label in reader:
                bar.update(1)
                checked += 1
                try:
                    reader.check(index, data)
                    if decode_one is not None:
                        decode_one(data)
                except CorruptDataError as exc:
                    problems.append(_problem(reader, index, exc.message))
                except Exception as exc:  # any decoder failure is a finding, not a crash
                    problems.append(_problem(reader, index, f"cannot be decoded: {exc}"))
        except CorruptDataError as exc:
            # The container itself is damaged past this point; report and stop.
            problems.append({"index": exc.offset, "key": exc.key, "reason": exc.message})
    finally:
        bar.close()
        reader.close()
    return VerifyResult(reader.path, reader.format_name, len(reader), checked, decode, problems)


def _problem(reader, index: int, reason: str) -> dict:
    return {"index": index, "key": reader.key_of(index), "reason": reason}
