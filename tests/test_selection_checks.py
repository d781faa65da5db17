"""A view's stored selection checked before it is trusted
(fastdata.dataset.selection): a bitmap's padding bits, the size a compressed
selection may inflate to, and the length of its base64 text."""

from __future__ import annotations

import base64
import hashlib
import tracemalloc
import zlib

import numpy as np
import pytest
from conftest import no_hang

from fastdata.dataset.selection import Selection, SelectionError


@pytest.fixture(autouse=True)
def _time_limit():
    with no_hang(60):
        yield


def stored_as(encoding: str, raw: bytes, records: int, *, data: bytes | None = None) -> dict:
    """A stored selection holding ``raw`` (or the compressed ``data``), its
    digest matching: only the checks of the shape remain to refuse it."""
    data = zlib.compress(raw) if data is None else data
    return {"encoding": encoding, "records": records,
            "sha256": hashlib.sha256(raw).hexdigest(),
            "data": base64.b64encode(data).decode("ascii")}


def test_every_set_padding_bit_of_a_bitmap_is_refused():
    n = 5003  # 3 bits of the last byte are records, 5 are padding
    rng = np.random.default_rng(1)
    sel = Selection.from_mask_chunks(n, [rng.random(n) < 0.5])
    assert sel.encoding == "bitmap"
    raw = bytearray(sel.bits.tobytes())
    assert Selection.decode(sel.encode(), n).count == sel.count
    for bit in range(n % 8, 8):
        bad = bytearray(raw)
        bad[-1] |= 1 << bit  # record 8 * (len - 1) + bit: past the parent's last one
        with pytest.raises(SelectionError, match=rf"padding.*record {n - n % 8 + bit}\b"):
            Selection.decode(stored_as("bitmap", bytes(bad), sel.count + 1), n)
    for bit in range(n % 8):  # the record bits of the last byte stay free
        ok = bytearray(raw)
        ok[-1] ^= 1 << bit
        count = sel.count + (1 if ok[-1] & (1 << bit) else -1)
        assert Selection.decode(stored_as("bitmap", bytes(ok), count), n).count == count


def test_a_bitmap_of_whole_bytes_has_no_padding_to_check():
    n = 4096
    sel = Selection.from_mask_chunks(n, [np.arange(n) % 3 == 0])
    assert sel.encoding == "bitmap"
    assert Selection.decode(sel.encode(), n).count == sel.count


def test_a_selection_inflating_past_its_bound_is_refused_unread():
    """A zlib bomb short enough to pass the text check: refused once more
    bytes come out than a bitmap of the parent can hold, without inflating it."""
    n = 200_000  # a bitmap of 25,000 bytes
    bomb = zlib.compress(b"\0" * (20 << 20), 9)  # 20 MiB of zeros in ~20 KB
    stored = stored_as("bitmap", b"", 0, data=bomb)
    tracemalloc.start()
    try:
        with pytest.raises(SelectionError, match=r"more than 25,000 bytes"):
            Selection.decode(stored, n)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20, f"{peak:,} bytes taken: the selection was inflated whole"


def test_ranges_past_the_most_runs_a_parent_can_have_are_refused():
    n = 1000  # at most 500 runs apart from one another: 8,000 bytes
    pairs = np.stack([np.arange(0, 2 * 501, 2), np.arange(1, 2 * 501, 2)], axis=1)
    raw = pairs.astype("<i8").tobytes()
    with pytest.raises(SelectionError, match=r"more than 8,000 bytes"):
        Selection.decode(stored_as("ranges", raw, 501), n)
    full = pairs[:500].astype("<i8").tobytes()  # the most there can be: opens
    assert Selection.decode(stored_as("ranges", full, 500), n).count == 500


def test_base64_text_longer_than_any_selection_is_refused_before_decoding():
    n = 1000
    stored = dict(Selection.from_ranges(n, [(1, 5)]).encode(), data="A" * 100_000)
    with pytest.raises(SelectionError, match=r"100,000 characters.*at most"):
        Selection.decode(stored, n)


def test_trailing_bytes_after_the_compressed_selection_are_refused():
    n = 1000
    stored = Selection.from_ranges(n, [(1, 5)]).encode()
    data = base64.b64decode(stored["data"]) + b"junk"
    with pytest.raises(SelectionError, match="cannot be decoded"):
        Selection.decode(dict(stored, data=base64.b64encode(data).decode()), n)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 4095, 4097, 100_003])
def test_selections_of_every_shape_still_open(n):
    rng = np.random.default_rng(n)
    for mask in (np.zeros(n, bool), np.ones(n, bool), rng.random(n) < 0.5,
                 np.arange(n) % 2 == 0, np.arange(n) % 1000 == 7):
        sel = Selection.from_mask_chunks(n, [mask])
        back = Selection.decode(sel.encode(), n)
        assert back.encoding == sel.encoding and back.count == int(mask.sum())
        assert np.array_equal(back.parents(np.arange(back.count)), np.flatnonzero(mask))
    # Runs apart by one record each: the most a ranges encoding can hold.
    runs = [(k, k + 1) for k in range(0, n, 2)]
    sel = Selection.from_ranges(n, runs)
    assert Selection.decode(sel.encode(), n).count == len(runs)
