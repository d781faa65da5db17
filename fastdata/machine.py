"""Facts about the machine this process runs on, and byte sizes for people.

No third-party imports: the packer, the Datasets, the caches, DALI and the
benchmark all ask the same questions here.
"""

from __future__ import annotations

import os
import sys


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def meminfo(field: str) -> int | None:
    """A /proc/meminfo field ("MemTotal", "MemAvailable") in bytes, or None off Linux."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def human_bytes(n: float) -> str:
    """A byte count in decimal units: "512 B", "56.3 MB"."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def rank_and_world(rank: int | None = None, world: int | None = None) -> tuple[int, int]:
    """This process's torch.distributed (rank, world size), or (0, 1) outside a
    process group; ``rank`` or ``world``, when given, in place of the group's.
    Imports nothing: without torch loaded there is no group.

    Raises:
        ValueError: the rank is outside the world.
    """
    dist = sys.modules.get("torch.distributed")
    found = (dist.get_rank(), dist.get_world_size()) if dist is not None \
        and dist.is_available() and dist.is_initialized() else (0, 1)
    rank = found[0] if rank is None else rank
    world = found[1] if world is None else world
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of size {world}")
    return rank, world
