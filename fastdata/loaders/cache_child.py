"""The child's side of the RAM cache's fill in a child process
(``SharedPayloadCache._fill_in_child``), for readers whose C library can die on
a damaged file (``Reader.walk_in_child``; see fastdata.formats.isolate).

The child opens the shared-memory block the cache made and writes the
payloads straight into it; the parent learns which records were damaged.
"""

from __future__ import annotations

from multiprocessing import resource_tracker

from fastdata.loaders.cache import SharedPayloadCache


def fill_task(reader, args: dict, out) -> None:
    """Fill the cache described by ``args`` from ``reader``; send the damaged records."""
    cache = SharedPayloadCache.__new__(SharedPayloadCache)
    cache.__setstate__(args["cache"])
    # Not a multiprocessing child: this process's own resource tracker would
    # unlink the block when it exits. The creator alone frees it.
    resource_tracker.unregister(cache._shm._name, "shared_memory")
    try:
        cache._fill(reader, out, args["skip_damaged"])
        out.send({"result": {"damaged": cache.damaged}})
    finally:
        cache.close()
