"""The RAM cache's fill in a child process, for readers whose C library can die
on a damaged file (``Reader.walk_in_child``; see fastdata.formats.isolate).

The child opens the shared-memory block the cache made and writes the
payloads straight into it; the parent learns which records were damaged.
"""

from __future__ import annotations

from fastdata.errors import CorruptDataError


def fill_in_child(cache, reader, bar, skip_damaged: bool) -> dict[int, str]:
    """Fill ``cache`` (a SharedPayloadCache) from a child process; the damaged records.

    Raises:
        CorruptDataError: a record is damaged (and not ``skip_damaged``), or
            reading the file killed the child.
    """
    from fastdata.formats.isolate import ChildDied, NoChild, walk_in_child

    result = {}

    def on_message(message: dict) -> None:
        if "result" in message:
            result.update(message["result"]["damaged"])

    args = {"cache": cache.__getstate__(), "skip_damaged": skip_damaged}
    try:
        walk_in_child(reader, f"{__name__}:fill_task", args, on_message, bar.update)
    except NoChild:
        cache._fill(reader, bar, skip_damaged)
        return cache.damaged
    except ChildDied as died:
        raise CorruptDataError(died.reason, path=reader.crash_path()) from None
    return {int(k): v for k, v in result.items()}


def fill_task(reader, args: dict, out) -> None:
    """The child's side of :func:`fill_in_child`."""
    from multiprocessing import resource_tracker

    from fastdata.loaders.cache import SharedPayloadCache

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
