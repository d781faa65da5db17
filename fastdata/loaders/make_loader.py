"""``fastdata.loader()``: a DataLoader with settings chosen for the dataset and
the machine, in the dataset's order, wrapped in a :class:`CUDAPrefetcher`."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch.utils.data import DataLoader

from fastdata.loaders.collate import collate
from fastdata.loaders.prefetch import CUDAPrefetcher
from fastdata.loaders.stream_batches import StreamBatches, batchable

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
    **dataloader_options: Any,
):
    """A DataLoader with sensible settings for ``dataset``, wrapped in a
    :class:`CUDAPrefetcher` when the batches go to a GPU.

    The batches come in the dataset's order (the :class:`fastdata.Order` it
    was opened with: shuffle, seed, batch_size, drop_last, ranks), so the order
    is given in one place. A map-style dataset is read in the order engine's
    batches (:class:`fastdata.EpochBatches`): one order per (seed, epoch)
    whatever the workers, equal batches on every torch.distributed rank, the
    next epoch after each pass, and a position a ``StatefulDataLoader`` saves
    and restores. A stream orders itself.

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
        **dataloader_options: anything else DataLoader takes; overrides ours.
            For one release the old ``batch_size``, ``shuffle``, ``seed`` and
            ``drop_last`` (now the dataset's ``order=``) and ``background``
            (now ``run_ahead``) still work, with a DeprecationWarning.

    Returns:
        (CUDAPrefetcher): The DataLoader (``.loader``) in a :class:`CUDAPrefetcher`,
        on ``device``. Its ``state_dict()`` is the training loop's point in the
        order (the batches handed to the loop), for a checkpoint;
        ``load_state_dict()`` on a new loader continues there, with any number
        of ranks and workers.
    """
    from torch.utils.data import IterableDataset

    from fastdata.machine import usable_cores

    from fastdata.deprecated import renamed

    iterable = isinstance(dataset, IterableDataset)
    if "background" in dataloader_options:
        renamed("loader", "background", "run_ahead=")
        run_ahead = dataloader_options.pop("background")
    if run_ahead < 0:
        raise ValueError(f"run_ahead must be 0 or more, not {run_ahead}")
    order = _loader_order(dataset, dataloader_options, iterable)
    from fastdata.loaders.choice import LoadingChoice, choose_loading

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
    own_sampler = {"sampler", "batch_sampler"} & set(dataloader_options)
    if iterable or own_sampler:
        if "batch_sampler" not in dataloader_options:
            options.update(batch_size=order.loader_batch, drop_last=order.drop_last)
        if not iterable and not own_sampler:
            options["shuffle"] = order.shuffle
    else:
        from fastdata.loaders.sampler import EpochBatches

        # One order for the job (ranks, workers, resume): the engine's batches.
        options["batch_sampler"] = EpochBatches(dataset, order)
    options.update(dataloader_options)
    _match_stream_batches(dataset, options.get("batch_size"))
    data_loader = DataLoader(_stream_in_batches(dataset, options), **options)
    if iterable and not isinstance(data_loader.dataset, StreamBatches):
        choice = replace(choice, background=0)  # per sample: its position must be the loop's
    prefetcher = CUDAPrefetcher(data_loader, device, mean=mean, std=std,
                                channels_last=channels_last, dtype=dtype,
                                background=choice.background if data_loader.num_workers == 0
                                else 0)
    prefetcher.choice = choice
    return prefetcher


def _loader_order(dataset, options: dict, iterable: bool):
    """The order ``loader()`` reads ``dataset`` in: the dataset's, changed by
    the loader's deprecated order keywords (popped from ``options``)."""
    from fastdata.deprecated import moved
    from fastdata.order.options import Order

    old = {k: options.pop(k) for k in ("batch_size", "shuffle", "seed", "drop_last")
           if k in options}
    if old.get("seed", 0) is None or old.get("shuffle", False) is None:
        old = {k: v for k, v in old.items() if v is not None}  # None meant "the default"
    mine = getattr(dataset, "order", None)
    base = mine if isinstance(mine, Order) else Order()
    given = isinstance(mine, Order) and getattr(dataset, "order_given", True)
    if old:
        moved("loader", old, "the dataset's order=fastdata.Order", stacklevel=4)
        if not given and not iterable and "shuffle" not in old:
            old["shuffle"] = True  # loader()'s old default for map-style datasets
        return base.changed(**old)
    if not given and not iterable:
        warnings.warn("fastdata.loader() shuffles a map-style dataset opened without order= "
                      "for one more release; from the next, the dataset's order decides: open "
                      "it with order=fastdata.Order(shuffle=True) (or shuffle=False)",
                      DeprecationWarning, stacklevel=3)
        return base.changed(shuffle=True)
    return base


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
    it knows the DataLoader's batch size: give it this loader's, or refuse a
    different one (the job's order would then depend on the worker count)."""
    from fastdata.loaders.iterable import ShardedIterableDataset

    if not isinstance(dataset, ShardedIterableDataset) or batch_size is None:
        return
    if dataset.batch_size is None:
        dataset.batch_size = int(batch_size)
    elif dataset.batch_size != batch_size:
        raise ValueError(f"the dataset was made with batch_size={dataset.batch_size} but the "
                         f"loader's batch_size is {batch_size}; give both the same value")
