"""The index files of a tar/TFRecord pack, written from the writer's spool
a block at a time (no torch).

The writer spools one :data:`SPOOLED_ROW` per record (see record_spool.py):
its index row and where its metadata JSON lies in its shard. At the end the
dataset index (``index.npy``), the metadata index (``metadata.npy``) and
their pieces' checksums (``-crc.npy``) are written from it, a block of
``record_spool.BLOCK`` rows at a time: the bytes ``np.save`` gives for the
whole arrays.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

import numpy as np

from fastdata.formats.record_spool import RowSpool
from fastdata.formats.sharded import index_rows
from fastdata.formats.sharded.index_file import save_blocks
from fastdata.formats.sharded.layout import INDEX_DTYPE
from fastdata.formats.sharded.metadata import metadata_rows

#: What the writer keeps of each record until the end (on disk): its index row
#: and where its metadata JSON lies in its shard ((0, 0): it has none).
SPOOLED_ROW = np.dtype(INDEX_DTYPE.descr + [("meta_offset", "<u8"), ("meta_size", "<u8")])


def save_index(folder: str, rows: RowSpool) -> None:
    """``index.npy`` and ``index-crc.npy`` in ``folder``, from the spooled rows."""
    _save_rows(folder, "index", len(rows), (_index_rows(block) for block in rows.blocks()))


def save_metadata_index(folder: str, rows: RowSpool, facts: Iterable[np.ndarray]) -> None:
    """``metadata.npy`` (the index's rows pointing at each record's metadata
    JSON, with its CRC32 from ``facts``, the writer's record facts a block at
    a time) and ``metadata-crc.npy`` in ``folder``."""
    def blocks() -> Iterator[np.ndarray]:
        for spooled, block_facts in zip(rows.blocks(), facts):
            places = np.stack([spooled["meta_offset"], spooled["meta_size"]], axis=1)
            yield metadata_rows(_index_rows(spooled), places, block_facts["metadata_crc32"])

    _save_rows(folder, "metadata", len(rows), blocks())


def _index_rows(spooled: np.ndarray) -> np.ndarray:
    out = np.empty(len(spooled), INDEX_DTYPE)
    for name in INDEX_DTYPE.names:
        out[name] = spooled[name]
    return out


def _save_rows(folder: str, name: str, count: int, blocks: Iterable[np.ndarray]) -> None:
    """``NAME.npy`` (``count`` index rows given a block at a time; every block
    but the last whole pieces) and ``NAME-crc.npy``, its pieces' checksums."""
    checksums = []

    def checked() -> Iterator[np.ndarray]:
        for block in blocks:
            checksums.append(index_rows.piece_checksums(block))
            yield block

    save_blocks(os.path.join(folder, f"{name}.npy"), INDEX_DTYPE, count, checked())
    np.save(os.path.join(folder, f"{name}-crc.npy"),
            np.concatenate(checksums) if checksums else np.zeros(0, index_rows.PIECE_DTYPE),
            allow_pickle=False)
