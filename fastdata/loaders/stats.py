"""``fastdata.stats(loader)``: is data loading the training loop's bottleneck?

One plain dict from a loader's stall meter (:mod:`fastdata.meter.table`,
:mod:`fastdata.meter.loop`): the share of the loop's time spent
waiting for data, the batch-ready latency percentiles, the seconds and share
of each stage that made the batches, how busy the workers were, the requests
and cache use, and one line of advice (:mod:`fastdata.meter.advice`).
Every rank's figures are gathered only when asked (``ranks=True``, a
collective every rank must call), never behind the caller's back.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastdata.meter.table import COLUMNS, STAGES, StageTable

#: Stages that run only on a GPU: absent from a run without one, not zero.
GPU_STAGES = ("copy",)


def meter_of(loader):
    """The :class:`~fastdata.meter.loop.Meter` of ``loader`` (a
    ``fastdata.loader()``, CUDAPrefetcher, BackgroundBatches or DALILoader),
    or None for a Dataset or a DataLoader (their producers' figures only)."""
    return getattr(loader, "meter", None)


def _table_of(loader) -> StageTable | None:
    for obj in (loader, getattr(loader, "dataset", None)):
        table = getattr(obj, "_meter", None)
        if isinstance(table, StageTable):
            return table
    return None


def stats(loader, *, ranks: bool = False, reset: bool = False) -> dict[str, Any]:
    """How the batches of ``loader`` were made and how long the loop waited for them.

    Args:
        loader (object): what ``fastdata.loader()`` returned (or a CUDAPrefetcher,
            BackgroundBatches, DALILoader); a fastdata Dataset or a DataLoader
            over one gives the stage figures only (no loop to time).
        ranks: also gather every torch.distributed rank's figures (under
            ``"ranks"``): a collective, so call it on every rank at the same
            point (e.g. at each epoch's end). Without a process group, this
            rank's alone.
        reset: start counting again after this reading (per-epoch figures).

    Returns:
        (dict): ``batches``, ``data_wait`` (the share of the loop's time spent
        waiting for batches, None before a batch was taken), ``wait_s``,
        ``step_s``, ``elapsed_s``, ``batch_ready_ms`` (``p50``, ``p95``,
        ``p99``: each batch's wait, over the last 8,192 batches), ``stages``
        (name -> ``seconds``, ``share``: summed over this rank's workers; a
        stage that did not run is absent; ``copy`` only with a GPU),
        ``workers`` (``count``, ``utilisation``: the mean of each worker's
        busy share, ``each``), ``samples``, ``requests`` (``count``,
        ``bytes``), ``cache`` (``ram_records``, ``shard_hits``,
        ``shard_downloads``), ``rank``, ``world``, ``bound`` (the stage that
        limits loading, or None) and ``advice`` (one line). With ``ranks``:
        ``ranks``, a list of every rank's dict, and ``slowest_rank``.
    """
    from fastdata.meter.advice import advise, advise_ranks

    meter = meter_of(loader)
    if meter is not None:
        now, since = meter.rows()
        out = meter.loop.figures()
        gpu = meter.gpu
        # The time the loop spent in its passes: workers make batches only then.
        in_passes = out["wait_s"] + out["step_s"]
    else:
        table = _table_of(loader)
        now = table.snapshot() if table is not None else np.zeros((1, len(COLUMNS)))
        since = np.zeros_like(now)
        out = {"batches": None, "wait_s": None, "step_s": None, "data_wait": None,
               "elapsed_s": None, "batch_ready_ms": None}
        gpu = False
        in_passes = 0.0
    out.update(_producers(now, since, gpu, in_passes))
    out["rank"], out["world"] = _rank_world()
    out["bound"], out["advice"] = advise(out)
    if ranks:
        everyone = _gather(out)
        out["ranks"] = everyone
        out["slowest_rank"], line = advise_ranks(everyone)
        if line:
            out["advice"] = line
    if reset and meter is not None:
        meter.reset()
    return out


def _producers(now: np.ndarray, since: np.ndarray, gpu: bool,
               in_passes: float = 0.0) -> dict[str, Any]:
    """The producers' side: stages, workers, requests, cache, from the rows
    (each worker's busy share of its span, at most ``in_passes``, the loop's
    time in its passes when measured: a pause between passes is no idle time)."""
    delta = now - since
    total = delta.sum(axis=0)
    seconds = {s: float(total[COLUMNS[s]]) for s in STAGES
               if (gpu or s not in GPU_STAGES) and total[COLUMNS[s]] > 0}
    whole = sum(seconds.values())
    stages = {s: {"seconds": v, "share": v / whole} for s, v in seconds.items()}
    each = []
    for r in range(len(now)):
        if delta[r, COLUMNS["batches"]] <= 0 and delta[r, COLUMNS["samples"]] <= 0:
            # not a producer (the loop's own thread converting, say), or none
            # since the last reset
            continue
        start = now[r, COLUMNS["first"]]
        if since[r, COLUMNS["last"]] > 0:
            start = max(start, since[r, COLUMNS["last"]])
        span = now[r, COLUMNS["last"]] - start
        if in_passes > 0:
            span = min(span, in_passes)
        busy = delta[r, COLUMNS["busy"]]
        each.append(min(1.0, busy / span) if span > 0 else 1.0)
    return {
        "stages": stages,
        "samples": int(total[COLUMNS["samples"]]),
        "workers": {"count": len(each),
                    "utilisation": float(np.mean(each)) if each else None,
                    "each": [float(u) for u in each]},
        # Absolute per process (the storage layer counts since the process began).
        "requests": {"count": int(now[:, COLUMNS["requests"]].sum()),
                     "bytes": int(now[:, COLUMNS["bytes"]].sum())},
        "cache": {"ram_records": int(total[COLUMNS["ram_records"]]),
                  "shard_hits": int(now[:, COLUMNS["shard_hits"]].sum()),
                  "shard_downloads": int(now[:, COLUMNS["shard_downloads"]].sum())},
    }


def _rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _gather(mine: dict) -> list[dict]:
    """Every rank's figures, in rank order (this rank's alone without a group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [mine]
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def print_advice(loader) -> None:
    """Print the meter's line for the pass that ended to stderr (``advise=True``),
    then start its counts again."""
    import sys

    figures = stats(loader, reset=True)
    who = f"rank {figures['rank']}: " if figures["world"] > 1 else ""
    print(f"fastdata: {who}{figures['advice']}", file=sys.stderr, flush=True)
