"""One line of advice from the stall meter's figures (``fastdata.stats(...)["advice"]``).

The rules, in order:

1. the loop waits less than 5% of its time: loading keeps up;
2. otherwise the stage with the largest share of the loading time is the
   bound, and its line names the documented options that shorten it;
3. but where that stage runs in the workers and they are less than 50%
   busy while the loop waits (or less than 80% with the stage's time per
   worker under half the loop's wait), no stage is the bound: the time goes between the workers and the loop
   (start-up, handing batches over), and the bound is ``"handover"``;
4. with every rank's figures (``ranks=True``), a rank that waits at least 10
   points more than the median rank, and twice as long, is named.
"""

from __future__ import annotations

import statistics

#: Below this share of the loop's time spent waiting for data, loading keeps up.
KEEPS_UP = 0.05
#: Workers at least this busy have no time to spare.
SATURATED = 0.8
#: Workers less busy than this, while the loop waits, are idle: the bound is
#: the hand-over ("handover")...
IDLE = 0.5
#: ...as it is for workers under SATURATED where the bound stage's time per
#: worker is under this share of the loop's wait.
HANDOVER_SHARE = 0.5
#: A rank is slow when it waits this many points more than the median rank...
SLOW_RANK_POINTS = 0.10
#: ...and this many times as long.
SLOW_RANK_RATIO = 2.0

#: Each stage's bound, and the options that shorten it.
ADVICE = {
    "fetch": ("fetch-bound: read further ahead (a stream: open_dataset(..., "
              "read_ahead=16), more shards downloaded at once) or from a local copy "
              "(fastdata convert URL copy.lmdb, once)"),
    "read": ("read-bound: keep the records in memory (open_dataset(..., cache='ram')) "
             "or move the dataset to a faster disk"),
    "decode": ("decode-bound: decode fewer pixels (fastdata pack --resize to the "
               "training size, or --encoding raw for tiny images), use more workers "
               "(fastdata.loader(..., num_workers=N)), or decode on the GPU "
               "(fastdata.DALILoader)"),
    "transform": ("transform-bound: the per-sample transform runs in Python for each "
                  "image; do it on the batch on the GPU, or at pack time (--resize)"),
    "collate": ("collate-bound: let fastdata stack uint8 images (no per-sample transform "
                "that makes floats) and pass mean/std to fastdata.loader(), which "
                "normalises whole batches"),
    "convert": ("bound by float conversion on the CPU: with a GPU, fastdata.loader() "
                "copies uint8 and converts there; on the CPU, pass dtype=torch.bfloat16"),
    "copy": ("copy-bound: copy uint8 and normalise on the GPU (mean/std to "
             "fastdata.loader(), no float transform in the Dataset), from pinned memory"),
}
KEEPS_UP_LINE = "loading keeps up: the training step is the bottleneck"
#: Stages run by the workers (the others run where the loop is).
WORKER_STAGES = ("fetch", "read", "decode", "transform", "collate")
#: The bound named when the workers idle while the loop waits.
HANDOVER = "handover"
IDLE_LINE = ("the workers idle {idle:.0%} of the time while the loop waits: the time goes "
             "between them and the loop (start-up, handing batches over); try "
             "num_workers=0 (decoding on threads in this process) or run_ahead=4")


def bound_stage(figures: dict) -> str | None:
    """The stage with the largest share of the loading time, or None."""
    stages = figures.get("stages") or {}
    if not stages:
        return None
    return max(stages, key=lambda s: stages[s]["seconds"])


def advise(figures: dict) -> tuple[str | None, str]:
    """(the bound stage or None, one line) for one rank's figures."""
    wait = figures.get("data_wait")
    head = "" if wait is None else f"data wait {wait:.0%} of the loop's time"
    ready = figures.get("batch_ready_ms")
    if head and ready:
        head += f" (p95 {ready['p95']:.1f} ms per batch)"
    if wait is not None and wait < KEEPS_UP:
        return None, f"{head}; {KEEPS_UP_LINE}"
    stage = bound_stage(figures)
    if stage is None:
        return None, head or "no batches measured yet"
    share = figures["stages"][stage]["share"]
    busy = (figures.get("workers") or {}).get("utilisation")
    where = f"{stage} {share:.0%} of the loading time"
    if busy is not None:
        where += f", workers {busy:.0%} busy"
    if stage in WORKER_STAGES and busy is not None and wait is not None and (
            busy < IDLE or (busy < SATURATED and _explains_little(figures, stage))):
        stage, line = HANDOVER, IDLE_LINE.format(idle=1 - busy)
    else:
        line = ADVICE[stage]
    return stage, "; ".join(p for p in (head, f"{where}: {line}") if p)


def _explains_little(figures: dict, stage: str) -> bool:
    """Whether ``stage``'s time per producer is under half the loop's wait: the
    wait is not that stage's (a producer blocked on a full queue between slow
    fetches is idle, yet the fetches are what the loop waits for)."""
    waited = figures.get("wait_s")
    producers = (figures.get("workers") or {}).get("count") or 1
    if not waited:
        return True
    return figures["stages"][stage]["seconds"] / producers < HANDOVER_SHARE * waited


def advise_ranks(everyone: list[dict]) -> tuple[int | None, str]:
    """(the rank that waits longest, a line naming it when it is slow, else "")."""
    waits = [(r.get("data_wait"), k) for k, r in enumerate(everyone)
             if r.get("data_wait") is not None]
    if not waits:
        return None, ""
    worst, rank = max(waits)
    if len(waits) < 2:
        return rank, ""
    others = [w for w, k in waits if k != rank]
    middle = statistics.median(others)
    if worst - middle < SLOW_RANK_POINTS or worst < SLOW_RANK_RATIO * middle:
        return rank, ""
    line = (f"rank {rank} waits {worst:.0%} of its time for data, the others "
            f"{min(others):.0%}-{max(others):.0%}")
    theirs = everyone[rank]
    if theirs.get("bound"):
        line += f"; on rank {rank}: " + theirs["advice"].split("; ", 1)[-1]
    return rank, line
