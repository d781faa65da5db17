"""``fastdata.loader()``: a DataLoader with settings chosen for the dataset and
the machine, in the dataset's order, wrapped in a :class:`CUDAPrefetcher`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler, default_collate

from fastdata.keywords import check_read_values, explain_keywords
from fastdata.loaders.collate import collate
from fastdata.loaders.meter_setup import TimedCollate, share_table
from fastdata.loaders.prefetch import CUDAPrefetcher
from fastdata.loaders.stream_batches import StreamBatches, batchable
from fastdata.order.options import Order

#: loader()'s keywords that name an order option -> where it is given.
_ORDER_HOME = ("order=fastdata.Order({0}=...) where the dataset is opened "
               "(open_dataset(path, order=...))")
LOADER_HOMES = {**{name: _ORDER_HOME.format(name)
                   for name in ("batch_size", "shuffle", "seed", "drop_last")},
                "background": "run_ahead="}


@explain_keywords(LOADER_HOMES)
def loader(
    dataset,
    *,
    device: str | torch.device | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    channels_last: bool = False,
    dtype: torch.dtype = torch.float32,
    num_workers: int | None = None,
    run_ahead: int = 2,
    order: Order | None = None,
    sampler: Sampler | Iterable | None = None,
    batch_sampler: Sampler | Iterable | None = None,
    collate_fn: Callable | None = None,
    pin_memory: bool | None = None,
    persistent_workers: bool | None = None,
    multiprocessing_context: str | Any | None = None,
    worker_init_fn: Callable | None = None,
    timeout: float = 0,
    generator: torch.Generator | None = None,
    advise: bool = False,
):
    """A DataLoader with sensible settings for ``dataset``, wrapped in a
    :class:`CUDAPrefetcher` when the batches go to a GPU.

    The batches come in the dataset's order (the :class:`fastdata.Order` it
    was opened with: shuffle, seed, batch_size, drop_last, ranks), so the order
    is given in one place. A dataset opened without ``order=`` is read in
    ``Order()``: its own order, not shuffled. A map-style dataset is read in
    the order engine's batches (:class:`fastdata.EpochBatches`): one order per
    (seed, epoch) whatever the workers, equal batches on every
    torch.distributed rank, the next epoch after each pass, and a position a
    ``StatefulDataLoader`` saves and restores. A stream orders itself.

    Args:
        dataset (torch.utils.data.Dataset): a fastdata Dataset (map-style or
            streaming) or any torch Dataset.
        device: "cuda", "cuda:1", "cpu"; default: "cuda" when available, else
            "cpu". Either way batches come out the same kind: float ``dtype``,
            normalised with ``mean``/``std`` (on the CPU when there is no GPU).
        mean: passed to the prefetcher (:class:`CUDAPrefetcher`).
        std: passed to the prefetcher.
        channels_last: passed to the prefetcher.
        dtype: passed to the prefetcher.
        num_workers: default: chosen from the dataset and the usable cores
            (:mod:`fastdata.loaders.choice`): fastdata's own decoding runs on
            threads in this process with a background thread, up to 8 cores
            (one more worker process per 8 cores beyond); a stream, one
            worker per 8 cores; per-sample Python (a transform, PIL output,
            a foreign dataset), one worker per core up to 8. The choice is
            the returned object's ``choice`` (in its repr, and logged at debug
            level on the "fastdata" logger).
        run_ahead: batches made ahead of the training loop by each producer:
            each DataLoader worker (``prefetch_factor``), or, with
            ``num_workers=0``, a background thread (fastdata decodes with the
            GIL released); 0: each batch made when asked for. A stream read
            so still gives the loop's position: its ``state_dict()`` counts
            the batches handed to the loop, not those made ahead (a stream
            with a per-sample transform is not run ahead).
        order: for a torch Dataset that fastdata did not open, the order to
            read it in (None: ``Order()``); a fastdata dataset has its own,
            given where it is opened (refused here).
        sampler: DataLoader's, replacing fastdata's order (then ``order``'s
            batch size and drop_last still make the batches).
        batch_sampler: DataLoader's, replacing fastdata's batches.
        collate_fn: DataLoader's; default: :func:`fastdata.collate`.
        pin_memory: DataLoader's; default: True when the batches go to a GPU.
        persistent_workers: DataLoader's; default: True with worker processes.
        multiprocessing_context: DataLoader's.
        worker_init_fn: DataLoader's.
        timeout: DataLoader's.
        generator: DataLoader's.
        advise: print one line at the end of each pass: the share of the
            loop's time spent waiting for data, the stage that limits loading
            and what to try (:func:`fastdata.stats` reads the same meter at
            any time).

    Returns:
        (CUDAPrefetcher): The DataLoader (``.loader``) in a :class:`CUDAPrefetcher`,
        on ``device``. Its ``state_dict()`` is the training loop's point in the
        order (the batches handed to the loop), for a checkpoint;
        ``load_state_dict()`` on a new loader continues there, with any number
        of ranks and workers.
    """
    from torch.utils.data import IterableDataset

    from fastdata.loaders.choice import LoadingChoice, choose_loading
    from fastdata.machine import usable_cores

    iterable = isinstance(dataset, IterableDataset)
    if run_ahead < 0:
        raise ValueError(f"run_ahead must be 0 or more, not {run_ahead}")
    order = _loader_order(dataset, order)
    if num_workers is None:
        choice = choose_loading(dataset, usable_cores(), run_ahead, iterable)
    else:
        # A stream read per sample is not run ahead: see below.
        choice = LoadingChoice(int(num_workers), 0 if num_workers else run_ahead,
                               "num_workers given")
    num_workers = choice.num_workers
    logging.getLogger("fastdata").debug("fastdata.loader(%s): %s", type(dataset).__name__,
                                        choice)
    if device is None:
        # The same call gives the same kind of batch on every machine.
        device = "cuda" if torch.cuda.is_available() else "cpu"
    on_gpu = torch.device(device).type == "cuda"
    options: dict[str, Any] = dict(
        num_workers=num_workers,
        # Pinned host memory makes the prefetcher's copies asynchronous.
        pin_memory=on_gpu and torch.cuda.is_available(),
        # Keep workers (and their open files and decoder pools) between epochs.
        persistent_workers=num_workers > 0,
    )
    if num_workers > 0 and run_ahead > 0:
        options["prefetch_factor"] = run_ahead
    if not iterable or getattr(dataset, "with_metadata", False):
        # Batches stacked once by __getitems__; metadata dicts kept as lists.
        options["collate_fn"] = collate
    given = {"sampler": sampler, "batch_sampler": batch_sampler, "collate_fn": collate_fn,
             "pin_memory": pin_memory, "persistent_workers": persistent_workers,
             "multiprocessing_context": multiprocessing_context,
             "worker_init_fn": worker_init_fn, "generator": generator}
    theirs = {name: value for name, value in given.items() if value is not None}
    if timeout:
        theirs["timeout"] = timeout
    own_sampler = sampler is not None or batch_sampler is not None
    if iterable or own_sampler:
        if batch_sampler is None:
            options.update(batch_size=order.loader_batch, drop_last=order.drop_last)
    else:
        from fastdata.loaders.sampler import EpochBatches

        # One order for the job (ranks, workers, resume): the engine's batches.
        options["batch_sampler"] = EpochBatches(dataset, order)
    options.update(theirs)
    _match_stream_batches(dataset, options.get("batch_size"))
    source = _stream_in_batches(dataset, options)
    # The stall meter's table, in shared memory before the workers start.
    table = share_table(dataset, num_workers)
    batched = options.get("batch_size") is not None or options.get("batch_sampler") is not None
    if options.get("collate_fn") is not None or batched:
        options["collate_fn"] = TimedCollate(options.get("collate_fn") or default_collate,
                                             table)
    data_loader = DataLoader(source, **options)
    if iterable and not isinstance(data_loader.dataset, StreamBatches):
        choice = replace(choice, run_ahead=0)  # per sample: its position must be the loop's
    prefetcher = CUDAPrefetcher(data_loader, device, mean=mean, std=std,
                                channels_last=channels_last, dtype=dtype,
                                run_ahead=choice.run_ahead if data_loader.num_workers == 0
                                else 0, advise=advise)
    prefetcher.choice = choice
    return prefetcher


def _loader_order(dataset, order: Order | None) -> Order:
    """The order ``loader()`` reads ``dataset`` in: the dataset's own, or
    ``order`` for a dataset fastdata did not open."""
    check_read_values(None, order)
    mine = getattr(dataset, "order", None)
    if isinstance(mine, Order):
        if order is not None and order != mine:
            raise ValueError("this dataset was opened with its order: give order= where it is "
                             "opened (open_dataset(path, order=...)), not to loader()")
        return mine
    return Order() if order is None else order


def _stream_in_batches(dataset, options: dict):
    """What the DataLoader reads: a fastdata stream of tensors makes its batches
    itself (``stream.batches()``), decoded into one tensor, instead of the
    DataLoader asking for and stacking each sample: the same batches, since
    its workers take whole batches of the order in turn."""
    from fastdata.loaders.iterable import ShardedIterableDataset

    if not isinstance(dataset, ShardedIterableDataset) or not batchable(dataset) or \
            options.get("batch_size") is None or options.get("collate_fn", collate) is not collate:
        return dataset
    options.update(batch_size=None, drop_last=False, collate_fn=collate)
    # In this process batches may be made ahead: the loop's takes are counted.
    return dataset.batches(count_taken=not options.get("num_workers"))


def _match_stream_batches(dataset, batch_size) -> None:
    """A ShardedIterableDataset hands whole batches to its workers in turn when
    it knows the DataLoader's batch size: a stream opened without one gets this
    loader's (the loader's comes from the stream's own order otherwise, so the
    two cannot differ)."""
    from fastdata.loaders.iterable import ShardedIterableDataset

    if isinstance(dataset, ShardedIterableDataset) and batch_size is not None \
            and dataset.batch_size is None:
        dataset.batch_size = int(batch_size)
