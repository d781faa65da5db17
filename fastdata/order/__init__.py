"""The one sample-order engine (torch-free): for (seed, epoch) one global order
of a dataset's records (:mod:`~fastdata.order.epochs`), each rank's and
worker's equal slice of it (:mod:`~fastdata.order.slices`), and a position in
it that is the whole resume state (:mod:`~fastdata.order.state`), all from
one :class:`~fastdata.order.options.Order` value (``fastdata.Order``). Streams,
map-style batches, ``fastdata.loader()``, DALI's external source and the
pack-time shuffle take their order from here.

``fastdata.order.batch_records`` answers which records a rank reads in a
step of an epoch, without torch or data (:mod:`fastdata.order.plan`).
``fastdata.order.Order`` is ``fastdata.Order``; both are imported on first use.
"""

from fastdata.lazy import exports

# Public name -> "module:attribute", imported on first access.
_LAZY = {"Order": "fastdata.order.options:Order",
         "batch_records": "fastdata.order.plan:batch_records",
         "rank_slice": "fastdata.order.plan:rank_slice"}
__all__ = sorted(_LAZY)
__getattr__, __dir__ = exports(globals(), _LAZY)
