"""Files a job's pieces write into its work folder: whole or absent (temp
name, fsync, rename), so a piece rerun after its worker died, or a job
resumed, never reads half a file."""

from __future__ import annotations

import os
import uuid

import numpy as np


def save_array(path: str, array: np.ndarray) -> str:
    """Write ``array`` to ``path`` as ``.npy`` (no pickle) atomically; returns ``path``."""
    temp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with open(temp, "wb") as f:
            np.save(f, np.ascontiguousarray(array), allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise
    return path


def load_array(path: str, *, mmap: bool = False) -> np.ndarray:
    """An array :func:`save_array` wrote (memory-mapped with ``mmap``)."""
    return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
