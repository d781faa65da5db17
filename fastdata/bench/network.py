"""What the network did while a remote row was measured, and what limited the row.

Ranged reads and downloads of shards over http(s), and downloads in ranged
parts from object stores, go through a per-origin gate that counts their
requests (:mod:`fastdata.storage.adaptive`); :class:`NetworkWatch` resets
those counts before a row's epochs and reads them at the warm-up's end and
after the last epoch. The open's requests (manifest, index) come before and
are not counted; nor are requests made in DataLoader worker processes, which
keep their own counts (a row with workers is marked "main process only"),
nor the ranged reads of s3://, gs:// and az:// objects, which obstore makes
without a gate (such a row is marked "part downloads only").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastdata.bench.measure import Measurement
from fastdata.formats.remote_files import is_remote
from fastdata.storage import adaptive
from fastdata.storage.urls import is_http

#: ``counted``: every request of the row passed this process's gates.
ALL = "all"
#: ``counted``: worker processes made (most of) the requests, and kept their counts.
MAIN_ONLY = "main process only"
#: ``counted``: an object store's URL, whose ranged reads pass no gate.
PARTS_ONLY = "part downloads only"

#: CPU use (of the usable cores) from which a row is decode-bound.
DECODE_BOUND = 0.85
#: Share of "requests at once x one connection's rate" from which a row is network-bound.
NETWORK_BOUND = 0.8

#: What a row with worker processes says to do for its network figures.
RERUN = "rerun with --workers 0"

#: Why a row's requests are not all counted, by its ``counted``.
NOT_COUNTED = {MAIN_ONLY: f"requests ran in worker processes; {RERUN}",
               PARTS_ONLY: "obstore's ranged reads of s3://, gs:// and az:// objects "
                           "are not counted"}

#: Counts that add up over a run, so that the warm-up's can be taken off.
_SUMMED = ("requests", "bytes", "throttled")


class NetworkWatch:
    """The gates' counts over one measurement of a remote target: create it
    just before ``measure_loader`` (it resets the counts), pass
    :meth:`on_epoch` as its ``on_epoch``, then call :meth:`figures`.

    For any other target it does nothing and :meth:`figures` gives None.
    """

    def __init__(self, path: str | None, *, warmup: int) -> None:
        self.remote = is_remote(path)
        self.http = is_http(path)
        self.warmup = warmup
        self._epochs = 0
        # A fresh gate per row also means each row's concurrency limit is found
        # anew, not inherited from the row before.
        if self.remote:
            adaptive.reset()
        self._after_warmup = adaptive.snapshot() if self.remote else None

    def on_epoch(self, then: Callable[[], None]) -> Callable[[], None]:
        """``then`` wrapped: the counts are also read when the warm-up ends."""
        def counted() -> None:
            self._epochs += 1
            if self.remote and self._epochs == self.warmup:
                self._after_warmup = adaptive.snapshot()
            then()
        return counted

    def figures(self, m: Measurement, workers: int) -> dict[str, Any] | None:
        """The snapshot over every epoch run, plus the measured epochs' own share
        (``workers``: the DataLoader worker processes the row ran with).

        The snapshot covers the warm-up and the measured epochs together
        (``epochs`` says how many). The per-epoch bytes and the rate are
        taken from the measured epochs only (counts at the warm-up's end
        subtracted), not as total / epochs: the warm-up fills the local shard
        cache, so it often makes most of the requests, or all of them.
        """
        if not self.remote:
            return None
        out: dict[str, Any] = adaptive.snapshot()
        measured = {k: out[k] - self._after_warmup[k] for k in _SUMMED}
        seconds = sum(m.epoch_seconds)
        epochs = len(m.epoch_seconds)
        out.update(
            counted=MAIN_ONLY if workers else ALL if self.http else PARTS_ONLY,
            epochs=self.warmup + epochs, warmup_epochs=self.warmup,
            **{f"measured_{k}": v for k, v in measured.items()},
            seconds=seconds, samples=m.samples * epochs,
            bytes_per_epoch=measured["bytes"] / epochs if epochs else None,
            network_mb_s=measured["bytes"] / seconds / 1e6 if seconds > 0 else None)
        return out


def verdict(network: dict[str, Any], cpu: float | None, cores: int) -> str:
    """What limited a row, from its CPU use (1.0 = one core busy) and its
    network figures; says "not measured here" rather than guess."""
    if cpu is not None and cpu >= DECODE_BOUND * cores:
        return "decode-bound"
    counted = network.get("counted")
    if counted != ALL:
        return f"not measured here ({NOT_COUNTED.get(counted, 'not every request counted')})"
    if not network.get("measured_requests"):
        return "not measured here (no requests counted in the measured epochs)"
    one, rate = network.get("connection_mb_s"), network.get("network_mb_s")
    if not one or rate is None:
        return ("not measured here (no answer was large enough to time one connection's "
                "rate)")
    if rate >= NETWORK_BOUND * max(1, network.get("peak") or 0) * one:
        return "network-bound"
    return "waiting on round trips (latency-bound): more requests at once would help"
