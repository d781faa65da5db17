"""How many requests go to one server at once, found by measuring (no torch).

A link to an object store is a pipe of some bandwidth and delay: a request
waits a round trip (time to first byte) before its body streams at one
connection's rate. Keeping the pipe full takes about bandwidth x delay of
bytes in flight, more than one connection gives at 20-80 ms. The number is
measured, never configured: every ranged part and download of a process goes
through its origin's :class:`Gate`, a first-come-first-served limit on
requests at once. While requests queue for it, the gate raises the limit a
step at a time and keeps a step only when the bytes per second rose with it
(a hill climb, as the AWS CRT client and s5cmd do); it halves the limit on a
throttling answer (429, 503 SlowDown). Requests never queued (the reader
asks for less than the link gives) leave the limit alone.

The gates also keep what :func:`snapshot` reports: requests, bytes, time to
first byte, one connection's rate, the limit reached and throttled answers.
What grows: a fixed window of recent samples per origin, nothing per record.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
import threading
import time
from collections import deque

#: Requests at once to one origin before anything is measured: a batch's
#: ranges over a few dozen shards go out in one round trip.
START = 32
#: The limit never goes below this (a throttled store still gets a pipeline)...
LOW = 2
#: ... nor above this (threads per process wait on the gate, not sockets).
HIGH = 128
#: A step is kept when the rate rose by at least this share.
GAIN = 0.05
#: A window's decision needs this long and at least ``limit`` finished requests.
WINDOW_S = 0.3
#: Bodies of at least this many bytes tell one connection's rate.
RATE_BODY = 256 << 10
#: A ranged part: about this many round trips of one connection's bytes,
#: and at least what it carries in PART_SECONDS (a near server: parts would
#: only cost requests)...
PART_TRIPS = 2
PART_SECONDS = 0.05
#: ... within these bounds (bytes).
PART_MIN, PART_MAX = 2 << 20, 16 << 20
#: Recent samples kept per origin for the medians.
SAMPLES = 256


class Gate:
    """Requests at once to one origin: first come, first served, with a limit
    that follows the measured rate (see the module's docstring)."""

    def __init__(self, name: str = "", start: int = START, low: int = LOW,
                 high: int = HIGH) -> None:
        self.name = name
        self.limit, self.low, self.high = start, low, high
        self._cond = threading.Condition()
        self._active = 0
        self._tickets: list[tuple[int, int]] = []    # a heap: (ahead, serial)
        self._serial = 0
        self.requests = self.bytes = self.throttled = 0
        self.uploads = self.upload_bytes = self._uploading = 0
        self.upload_seconds = self._busy_since = 0.0
        self.peak = 0
        self.ttfb: deque[float] = deque(maxlen=SAMPLES)
        self.rates: deque[float] = deque(maxlen=SAMPLES)
        self._window_reset(time.monotonic())
        self._last_rate: float | None = None
        self._last_step = 0      # +1: the limit was raised at the last decision
        self._hold = 0           # decisions to skip after a throttle or a kept step

    def _window_reset(self, now: float) -> None:
        self._win_start, self._win_bytes, self._win_done, self._queued = now, 0, 0, False

    @contextlib.contextmanager
    def slot(self, *, ahead: bool = False):
        """Wait for a turn, then hold one request's place. Turns go in order
        of asking, reads needed now (a batch's records) before reads
        ``ahead`` of use (whole-shard downloads), so that downloads under
        way never hold up the batch being read."""
        with self._cond:
            self._serial += 1
            ticket = (int(ahead), self._serial)
            heapq.heappush(self._tickets, ticket)
            while self._tickets[0] != ticket or self._active >= self.limit:
                self._queued = True
                self._cond.wait()
            heapq.heappop(self._tickets)
            self._active += 1
            self.peak = max(self.peak, self._active)
            self._cond.notify_all()      # the next ticket may fit too
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def record(self, nbytes: int, ttfb: float, body_s: float) -> None:
        """One finished request: its body's bytes, its time to first byte and
        the time its body took."""
        with self._cond:
            self.requests += 1
            self.bytes += nbytes
            self.ttfb.append(ttfb)
            if nbytes >= RATE_BODY and body_s > 0:
                self.rates.append(nbytes / body_s)
            self._win_bytes += nbytes
            self._win_done += 1
            now = time.monotonic()
            if now - self._win_start >= WINDOW_S and self._win_done >= self.limit:
                self._decide(self._win_bytes / (now - self._win_start))
                self._window_reset(now)
                self._cond.notify_all()      # a raised limit lets waiting requests go

    def _decide(self, rate: float) -> None:
        if self._hold > 0:
            self._hold -= 1
        elif not self._queued:
            pass                  # the reader asked for less than the limit: no evidence
        elif self._last_step > 0 and self._last_rate and rate < self._last_rate * (1 + GAIN):
            self.limit = max(self.low, self.limit - max(1, self.limit // 5))  # no gain: back
            self._last_step, self._hold = 0, 8
        else:
            self.limit = min(self.high, self.limit + max(1, self.limit // 4))
            self._last_step = 1
        self._last_rate = rate

    def throttle(self, status: int) -> None:
        """A 429 or 503 answer: half the requests at once, and a pause in
        growth; the first one is logged (the request itself is retried)."""
        with self._cond:
            self.throttled += 1
            self.limit = max(self.low, self.limit // 2)
            self._last_step, self._hold, self._last_rate = 0, 4, None
            first, limit = self.throttled == 1, self.limit
        if first:
            logging.getLogger("fastdata").warning(
                "%s answered %d (slow down): retried with backoff, with fewer requests "
                "at once to it (now %d; fastdata.storage.adaptive)", self.name, status,
                limit)

    @contextlib.contextmanager
    def uploading(self):
        """Around one upload: ``upload_seconds`` counts the time at least one
        upload was under way (uploads at once overlap: their wall time, not
        the sum of theirs)."""
        with self._cond:
            if self._uploading == 0:
                self._busy_since = time.monotonic()
            self._uploading += 1
        try:
            yield
        finally:
            with self._cond:
                self._uploading -= 1
                if self._uploading == 0:
                    self.upload_seconds += time.monotonic() - self._busy_since

    def uploaded(self, nbytes: int, seconds: float, parts: int) -> None:
        """One upload of ``parts`` parts sent at most ``limit`` at once
        (obstore's multipart upload): counted, and taken as one window of
        the hill climb when it kept every place busy (``parts`` at least the
        limit). A single-part upload times one connection."""
        with self._cond:
            self.requests += parts
            self.bytes += nbytes
            self.uploads += 1
            self.upload_bytes += nbytes
            if parts == 1 and nbytes >= RATE_BODY and seconds > 0:
                self.rates.append(nbytes / seconds)
            if parts >= self.limit and seconds > 0:
                self._queued = True
                self._decide(nbytes / seconds)
                self._window_reset(time.monotonic())

    def part_size(self) -> int:
        """Bytes per ranged part of a large read: a few round trips of one
        connection's bytes, so a part's wait for its first byte is a small
        share of its time, and at least 50 ms of them, so a near server is
        not asked for parts it sends as fast whole (4 MiB before anything
        is measured)."""
        with self._cond:
            if len(self.ttfb) < 4 or not self.rates:
                return 4 << 20
            ttfb, rate = _median(self.ttfb), _median(self.rates)
        return int(min(PART_MAX, max(PART_MIN, PART_TRIPS * ttfb * rate, PART_SECONDS * rate)))

    def stats(self) -> dict:
        with self._cond:
            return {"requests": self.requests, "bytes": self.bytes,
                    "uploads": self.uploads, "upload_bytes": self.upload_bytes,
                    "upload_seconds": self.upload_seconds,
                    "ttfb_ms": _median(self.ttfb) * 1000 if self.ttfb else None,
                    "connection_mb_s": _median(self.rates) / 1e6 if self.rates else None,
                    "limit": self.limit, "peak": self.peak, "throttled": self.throttled}


def _median(values) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


_gates: dict[str, Gate] = {}
_gates_pid: int | None = None
_gates_lock = threading.Lock()


def gate(origin: str) -> Gate:
    """This process's gate for ``origin`` (scheme, host and port, or a
    bucket's endpoint); a forked child starts its own."""
    global _gates, _gates_pid
    with _gates_lock:
        if _gates_pid != os.getpid():
            _gates, _gates_pid = {}, os.getpid()
        found = _gates.get(origin)
        if found is None:
            found = _gates[origin] = Gate(origin)
        return found


def snapshot() -> dict:
    """This process's requests to every origin since it started (or since
    :func:`reset`): ``requests``, ``bytes``, ``throttled``, the median time
    to first byte (``ttfb_ms``) and one connection's rate
    (``connection_mb_s``), and the most requests at once (``peak``), summed
    or taken over the origins."""
    with _gates_lock:
        gates = list(_gates.values()) if _gates_pid == os.getpid() else []
    rows = [g.stats() for g in gates]
    out = {"origins": len(rows), "requests": sum(r["requests"] for r in rows),
           "bytes": sum(r["bytes"] for r in rows),
           "throttled": sum(r["throttled"] for r in rows),
           "peak": max((r["peak"] for r in rows), default=0),
           "uploads": sum(r["uploads"] for r in rows),
           "upload_bytes": sum(r["upload_bytes"] for r in rows),
           "upload_seconds": sum(r["upload_seconds"] for r in rows),
           "limit": max((r["limit"] for r in rows), default=0)}
    ttfb = [r["ttfb_ms"] for r in rows if r["ttfb_ms"] is not None]
    rates = [r["connection_mb_s"] for r in rows if r["connection_mb_s"] is not None]
    out["ttfb_ms"] = _median(ttfb) if ttfb else None
    out["connection_mb_s"] = _median(rates) if rates else None
    return out


def reset() -> None:
    """Forget this process's gates (limits and counts start again)."""
    global _gates
    with _gates_lock:
        _gates = {}


def split(start: int, end: int, part: int) -> list[tuple[int, int]]:
    """``[start, end)`` cut into about equal pieces of at most ``part`` bytes."""
    count = max(1, -(-(end - start) // part))
    step = -(-(end - start) // count)
    return [(s, min(end, s + step)) for s in range(start, end, step)]
