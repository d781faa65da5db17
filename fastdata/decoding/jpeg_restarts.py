"""Cutting a crop's blocks out of a JPEG with a restart marker after every MCU (no torch).

A baseline JPEG's entropy-coded data can only be decoded from its start: each
block's DC coefficient is coded as a difference from the previous block's, and
codes are not byte-aligned. A restart marker (RSTn) resets both, so in a JPEG
written with a restart interval of one MCU (16x16 pixels at 4:2:0, 8x8 at
4:4:4 and in gray) every MCU is a self-contained run of bytes. The MCUs a crop
needs can then be copied into a smaller JPEG, with its own size and renumbered
markers, and decoded alone: entropy decoding, which is most of a decode
(bench/RESULTS.md, "Training crops"), is paid for the crop's area only.

``fastdata pack --jpeg-restarts`` writes such JPEGs, and :func:`add_index`
adds an index of their markers: an APP15 segment (``FDMCUIDX``) with each
MCU's byte length, which other decoders skip, so that finding the MCUs does
not mean reading every byte for 0xFF. :func:`restart_layout` checks the index
against the markers it points at, and reads the bytes itself when there is
none or it does not match. :meth:`fastdata.RandomResizedCrop.decode` uses
:func:`cut` when a record has restart markers. Anything else (progressive,
arithmetic, 12-bit, other intervals, markers that do not count up as they
should) gives ``None`` from :func:`restart_layout`, and the crop is decoded
the ordinary way.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from fastdata.image_header import SOF_MARKERS

_SOI, _EOI, _SOS, _DRI = 0xD8, 0xD9, 0xDA, 0xDD
_BASELINE_SOF = (0xC0, 0xC1)  # Huffman, sequential (baseline and extended)
_OTHER_SOF = SOF_MARKERS - set(_BASELINE_SOF)
_RST0, _EOI_MARKER = bytes((0xFF, 0xD0)), bytes((0xFF, _EOI))
#: The second byte of the n-th restart marker of a scan: RST0 ... RST7, RST0 ...
_RST_NUMBERS = (0xD0 + (np.arange(1 << 16) & 7)).astype(np.uint8)
_TWOS = np.arange(2, 2 * (1 << 16) + 1, 2, dtype=np.int64)
_APP15 = 0xEF
_INDEX_ID = b"FDMCUIDX\x01"  # name and version of the MCU index segment
#: An APP segment holds at most 65,533 bytes: indexes of up to this many MCUs
#: (a 2,900 x 2,900 image at 4:2:0); larger images are read without one.
_MAX_INDEXED = (65533 - len(_INDEX_ID) - 4) // 2
#: Chroma upsampling reads one chroma sample beyond a pixel (two full-size
#: pixels at 4:2:0): a cut keeps this many scaled pixels around the crop, so
#: its edge pixels equal a whole-image decode's.
_EDGE = 2


@dataclass(frozen=True)
class RestartLayout:
    """Where each MCU's bytes are in a JPEG with a restart interval of one MCU."""

    width: int
    height: int
    components: int  # 1 (gray) or 3
    mcu_w: int
    mcu_h: int
    cols: int
    rows: int
    sof: int  # offset of the SOF marker (its height and width are rewritten)
    scan: int  # offset of the first entropy-coded byte
    #: ``bounds[m + 1]``: one past MCU m's last byte (its RST marker, or EOI);
    #: ``bounds[0]`` is ``scan - 2``, so MCU m starts at ``bounds[m] + 2``.
    bounds: np.ndarray
    index: tuple[int, int] | None = None  # the index segment's (start, end), if any

    @property
    def starts(self) -> np.ndarray:
        """First byte of each MCU, in raster order."""
        return self.bounds[:-1] + 2

    @property
    def ends(self) -> np.ndarray:
        """One past each MCU's last byte (its RST marker, or EOI)."""
        return self.bounds[1:]


def _header(data: bytes):
    """``(sof, frame, interval, scan, components, index)`` from the segments
    up to the first SOS: the SOF's offset and payload, the restart interval,
    the first entropy-coded byte, the scan's number of components and the
    index segment's ``(offset, payload start, end)``; None for a frame other
    than baseline Huffman or a malformed header."""
    pos, n = 2, len(data)
    sof = frame = index = None
    interval = 0
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        (length,) = struct.unpack_from(">H", data, pos + 2)
        end = pos + 2 + length
        if length < 2 or end > n:
            return None
        if marker == _SOS:
            return sof, frame, interval, end, data[pos + 4], index
        if marker in _OTHER_SOF:
            return None
        if marker == _APP15 and data.startswith(_INDEX_ID, pos + 4):
            index = (pos, pos + 4 + len(_INDEX_ID), end)
        elif marker in _BASELINE_SOF:
            sof, frame = pos, data[pos + 4:end]
        elif marker == _DRI and length >= 4:
            (interval,) = struct.unpack_from(">H", data, pos + 4)
        pos = end
    return None


def restart_layout(data) -> RestartLayout | None:
    """The MCU layout of ``data``, or None when it is not a single-scan,
    8-bit Huffman JPEG with a restart marker after every MCU."""
    if not isinstance(data, bytes):
        data = bytes(data)
    if len(data) < 4 or data[0] != 0xFF or data[1] != _SOI:
        return None
    header = _header(data)
    if header is None:
        return None
    sof, frame, interval, scan, scan_components, index = header
    # No frame, another interval, not 8-bit, or not all components in one scan.
    if frame is None or interval != 1 or len(frame) < 6 or frame[0] != 8 \
            or scan_components != frame[5]:
        return None
    height, width, ncomp = struct.unpack_from(">HHB", frame, 1)
    if width == 0 or height == 0 or ncomp not in (1, 3) or len(frame) < 6 + 3 * ncomp:
        return None
    if ncomp == 1:  # a single-component scan's MCU is one block, whatever its sampling
        mcu_w = mcu_h = 8
    else:
        f0, f1, f2 = frame[7], frame[10], frame[13]
        mcu_w = 8 * max(f0 >> 4, f1 >> 4, f2 >> 4)
        mcu_h = 8 * max(f0 & 15, f1 & 15, f2 & 15)
    cols, rows = -(-width // mcu_w), -(-height // mcu_h)
    bounds = None if index is None else _indexed(data, index[1:], scan, cols * rows)
    if bounds is None:
        index = None
        bounds = _scanned(data, scan, cols * rows)
        if bounds is None:
            return None
    return RestartLayout(width, height, ncomp, mcu_w, mcu_h, cols, rows, sof, scan, bounds,
                         index=None if index is None else (index[0], index[2]))


def _indexed(data: bytes, span: tuple[int, int], scan: int, count: int):
    """The bounds (see :class:`RestartLayout`) from an index segment's payload
    at ``span``, or None when it is for another number of MCUs or its offsets
    miss the markers."""
    start, end = span
    if end - start != 4 + 2 * count or struct.unpack_from("<I", data, start)[0] != count:
        return None
    bounds = np.empty(count + 1, dtype=np.int64)
    bounds[0] = scan - 2
    ends = bounds[1:]
    # Each MCU's end is its start plus its length; the next starts 2 bytes on (its marker).
    np.add.accumulate(np.frombuffer(data, dtype="<u2", count=count, offset=start + 4),
                      dtype=np.int64, out=ends)
    ends += _twos(count)
    ends += scan - 2
    # Every offset must land on its marker, numbered as it should be, and on EOI last.
    if ends[-1] + 2 > len(data) or data[ends[-1] + 1] != _EOI:
        return None
    array = np.frombuffer(data, dtype=np.uint8)
    inner = ends[:-1]
    if array[inner].min(initial=0xFF) != 0xFF or \
            (array[inner + 1] != _rst_numbers(count - 1)).any():
        return None
    return bounds


def _twos(n: int) -> np.ndarray:
    """2, 4, ... 2n: the marker bytes before each MCU's end."""
    if n <= len(_TWOS):
        return _TWOS[:n]
    return np.arange(2, 2 * n + 1, 2, dtype=np.int64)


def _rst_numbers(n: int) -> np.ndarray:
    """The second bytes of a scan's first ``n`` restart markers."""
    if n <= len(_RST_NUMBERS):
        return _RST_NUMBERS[:n]
    return (0xD0 + (np.arange(n) & 7)).astype(np.uint8)


def _scanned(data: bytes, scan: int, count: int):
    """The bounds (see :class:`RestartLayout`) found by reading the
    entropy-coded bytes, or None."""
    eoi = data.rfind(bytes((0xFF, _EOI)), scan)  # trailing bytes after it are allowed
    if eoi < 0:
        return None
    markers = _restart_markers(data, scan, eoi)
    if markers is None or len(markers) != count - 1:
        return None
    bounds = np.empty(count + 1, dtype=np.int64)
    bounds[0], bounds[1:-1], bounds[-1] = scan - 2, markers, eoi
    return bounds


def add_index(data: bytes) -> bytes:
    """``data`` with an MCU index segment before its frame header, so that
    :func:`restart_layout` need not read the entropy-coded bytes.

    Raises:
        ValueError: ``data`` has no restart marker after every MCU.
    """
    layout = restart_layout(data)
    if layout is None:
        raise ValueError("not a baseline JPEG with a restart marker after every MCU")
    if layout.index is not None:
        return data
    lengths = layout.ends - layout.starts
    if len(lengths) > _MAX_INDEXED or int(lengths.max()) > 0xFFFF:
        return data  # too large for one segment: read by scanning
    payload = _INDEX_ID + struct.pack("<I", len(lengths)) + lengths.astype("<u2").tobytes()
    segment = bytes((0xFF, _APP15)) + struct.pack(">H", len(payload) + 2) + payload
    return data[:layout.sof] + segment + data[layout.sof:]


def _restart_markers(data: bytes, scan: int, eoi: int) -> np.ndarray | None:
    """Offsets of the RST markers between ``scan`` and ``eoi``; None when any
    other marker is there or they do not count RST0, RST1, ... RST7, RST0 ..."""
    entropy = np.frombuffer(data, dtype=np.uint8, count=eoi + 1 - scan, offset=scan)
    ff = np.flatnonzero(entropy[:-1] == 0xFF)
    following = entropy[ff + 1]
    kept = following != 0  # 0xFF 0x00 is a stuffed 0xFF byte, not a marker
    markers = ff[kept]
    numbers = following[kept].astype(np.int64) - 0xD0
    if not np.array_equal(numbers, np.arange(len(markers)) & 7):
        return None
    return markers.astype(np.int64) + scan


def cut_bounds(layout: RestartLayout, box: tuple[int, int, int, int],
               eighths: int = 8) -> tuple[int, int, int, int]:
    """``(col0, col1, row0, row1)``: the MCUs :func:`cut` keeps for ``box``
    (left, top, width, height) decoded at ``eighths``/8 scale."""
    left, top, width, height = box
    edge = _EDGE * 8 // eighths  # full-size pixels for _EDGE scaled ones
    col0 = max(0, (left - edge) // layout.mcu_w)
    row0 = max(0, (top - edge) // layout.mcu_h)
    col1 = min(layout.cols, -(-(left + width + edge) // layout.mcu_w))
    row1 = min(layout.rows, -(-(top + height + edge) // layout.mcu_h))
    return col0, col1, row0, row1


def cut(data: bytes, layout: RestartLayout, box: tuple[int, int, int, int],
        eighths: int = 8) -> tuple[bytearray, tuple[int, int, int, int]]:
    """A JPEG of the MCUs covering ``box`` (left, top, width, height), with a
    margin for chroma upsampling at ``eighths``/8 scale.

    Returns:
        ``(jpeg, (x, y, width, height))``: the smaller JPEG and the rectangle
        of the image it covers, in full-size pixels. Decoded, its pixels at
        ``box`` (shifted by ``x``, ``y``) equal those of the whole image's decode.
    """
    col0, col1, row0, row1 = cut_bounds(layout, box, eighths)
    cols, bounds = layout.cols, layout.bounds
    x, y = col0 * layout.mcu_w, row0 * layout.mcu_h
    width = (col1 - col0) * layout.mcu_w if col1 < cols else layout.width - x
    height = (row1 - row0) * layout.mcu_h if row1 < layout.rows else layout.height - y
    first, last = row0 * cols, (row1 - 1) * cols + 1
    # The header, without the index (it describes the whole image), with the cut's size.
    skip_from, skip_to = layout.index or (layout.sof, layout.sof)
    header = b"".join((data[:skip_from], data[skip_to:layout.sof + 5],
                       struct.pack(">HH", height, width), data[layout.sof + 9:layout.scan]))
    # Each MCU row of the cut is one run of bytes (its MCUs and the markers
    # between them), found by strided views of the bounds; runs are joined
    # by a marker, and every marker is then renumbered in the cut's own order.
    view = memoryview(data)
    parts, shifts = [header], []
    at = len(header)
    for start, end in zip((bounds[first + col0:last + col0:cols] + 2).tolist(),
                          bounds[first + col1:last + col1:cols].tolist()):
        parts.append(view[start:end])
        parts.append(_RST0)
        shifts.append(at - start)  # where this run's bytes move to
        at += end - start + 2
    parts[-1] = _EOI_MARKER
    out = bytearray().join(parts)
    # Marker positions: every MCU's end but the last (a view of the bounds,
    # one row per MCU row), moved to where its run landed.
    ends = bounds[1:].reshape(layout.rows, cols)[row0:row1, col0:col1]
    moved = (ends + np.array(shifts)[:, None]).ravel()[:-1]
    np.frombuffer(out, dtype=np.uint8)[moved + 1] = _rst_numbers(len(moved))
    return out, (x, y, width, height)

