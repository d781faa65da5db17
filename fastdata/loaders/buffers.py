"""Batch tensors: uint8 ones made in shared memory inside a DataLoader worker
(:func:`batch_tensor`), and float ones reused on the CPU once nothing else
holds them (:class:`FloatBuffers`).

A float32 batch of 64 224x224 images is 38 MB: above glibc's largest mmap
threshold, so every fresh one is new pages the kernel must fault in and zero
(30 ms of the 35 ms a CPU conversion took, 2 cores). A buffer goes back into
use only when the pool is its only holder: no Python reference left outside
the pool, no reference to the tensor itself (autograd keeps those of inputs it
needs for backward) and no other tensor on its memory (a view), so a batch a
caller or autograd kept is never written over.
"""

from __future__ import annotations

import sys

import torch
from torch.utils.data import get_worker_info

#: Buffers kept per shape: the batches in flight, and one.
KEEP = 4

_use_count = getattr(torch._C, "_storage_Use_Count", None)
if not hasattr(torch.Tensor, "_use_count"):  # autograd's saved tensors could not be seen
    _use_count = None


class FloatBuffers:
    """``take(like, dtype, nchw)``: an uninitialised tensor of ``like``'s shape
    (and memory layout, unless ``nchw``: contiguous), a free kept one when
    there is one."""

    def __init__(self) -> None:
        self._kept: dict[tuple, list[torch.Tensor]] = {}

    def take(self, like: torch.Tensor, dtype: torch.dtype, nchw: bool) -> torch.Tensor:
        def fresh() -> torch.Tensor:
            return torch.empty(like.shape, dtype=dtype) if nchw else \
                torch.empty_like(like, dtype=dtype)

        if _use_count is None:                     # no way to tell a free buffer
            return fresh()
        kept = self._kept.setdefault((tuple(like.shape), like.stride(), dtype, nchw), [])
        for k in range(len(kept)):
            # References: the list, ``buffer`` and getrefcount's argument; to
            # the tensor: none other (autograd saves tensors it needs for
            # backward there); on the memory: the buffer and the storage
            # object asked for here (no view).
            buffer = kept[k]
            if sys.getrefcount(buffer) == 3 and buffer._use_count() == 1 and \
                    _use_count(buffer.untyped_storage()._cdata) == 2:
                return buffer
            del buffer
        made = fresh()
        if len(kept) < KEEP:
            kept.append(made)
        return made


def batch_tensor(shape: tuple[int, ...]) -> torch.Tensor:
    """An empty uint8 batch tensor; in a DataLoader worker it is allocated in
    shared memory, so sending it to the main process copies nothing (what
    torch's default_collate does for the same reason)."""
    if get_worker_info() is not None:
        numel = 1
        for n in shape:
            numel *= n
        storage = torch.UntypedStorage._new_shared(numel)
        return torch.tensor([], dtype=torch.uint8).set_(storage).view(shape)
    return torch.empty(shape, dtype=torch.uint8)
