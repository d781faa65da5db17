"""Batches built once: a batch of same-size images becomes one uint8 tensor.

``__getitems__`` of a fastdata map-style Dataset returns a :class:`Batch` when
every image of the batch has one shape: the images are stacked once into an
NHWC uint8 array and handed out as an NCHW view of it (channels-last memory,
which convolutions on the GPU prefer). ``fastdata.collate`` passes that tensor
through; torch's ``default_collate`` still works on a Batch (it sees a
sequence of ``(image, label)`` samples) and gives what it always gives
(contiguous NCHW images, int64 labels, metadata collated as torch collates
dicts), made from the Batch's tensors in one copy instead of sample by
sample: a plain ``DataLoader`` gets most of ``fastdata.collate``'s speed.
Per-sample metadata (dicts) is never stacked: ``fastdata.collate`` hands a
batch's dicts on as a list (a :class:`MetadataBatch`, whose ``columns``
stack the values that are numeric in every dict).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import default_collate


class Batch(Sequence):
    """A sequence of ``(image, label)`` samples backed by two batch tensors
    (``(image, label, metadata)`` when the dataset gives metadata).

    Attributes:
        images: uint8 tensor [B, C, H, W] (a view of NHWC memory).
        labels: int64 tensor [B].
        metadata: a list of B dicts, or None.
    """

    __slots__ = ("images", "labels", "metadata")

    def __init__(self, images: torch.Tensor, labels: torch.Tensor,
                 metadata: list[dict] | None = None) -> None:
        self.images = images
        self.labels = labels
        self.metadata = metadata

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if self.metadata is not None:
            return _Row((self.images[i], int(self.labels[i]), self.metadata[i]))
        return _Row((self.images[i], int(self.labels[i])))

    def __repr__(self) -> str:
        return f"Batch(images={tuple(self.images.shape)}, labels={tuple(self.labels.shape)})"


class _Row(tuple):
    """One sample of a :class:`Batch`: a plain tuple, whose type tells torch's
    ``default_collate`` that the batch it came from is already stacked."""

    __slots__ = ()


def _default_collate_batch(batch, *, collate_fn_map=None):
    """torch's ``default_collate`` of a :class:`Batch`: what it gives for the
    samples (contiguous images in a worker's shared memory, int64 labels,
    metadata collated), from the batch tensors in one copy. Rows that are not
    a whole Batch go the usual way, as plain tuples."""
    from torch.utils.data._utils.collate import collate as torch_collate

    if not isinstance(batch, Batch):
        return torch_collate([tuple(row) for row in batch], collate_fn_map=collate_fn_map)
    images = _stacked_like_torch(batch.images)
    out = [images, batch.labels.clone()]
    if batch.metadata is not None:
        out.append(torch_collate(list(batch.metadata), collate_fn_map=collate_fn_map))
    return out


def _stacked_like_torch(images: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``images``, in shared memory in a DataLoader worker
    (as torch's stack of the samples would be)."""
    from torch.utils.data import get_worker_info

    if get_worker_info() is not None:
        storage = torch.UntypedStorage._new_shared(images.numel() * images.element_size())
        out = torch.tensor([], dtype=images.dtype).set_(storage).view(images.shape)
    else:
        out = torch.empty(images.shape, dtype=images.dtype)
    return out.copy_(images)


def _register_with_default_collate() -> None:
    # torch's documented extension point: default_collate dispatches on the
    # type of a batch's first element through default_collate_fn_map.
    try:
        from torch.utils.data._utils.collate import default_collate_fn_map
    except ImportError:  # another torch: the samples are collated one by one
        return
    default_collate_fn_map.setdefault(_Row, _default_collate_batch)


_register_with_default_collate()


def collate(batch):
    """DataLoader ``collate_fn``: a :class:`Batch` becomes ``[images, labels]``
    (``[images, labels, metadata]``) without another copy; anything else goes
    to torch's ``default_collate``, except that a field of the samples that
    holds dicts (per-sample metadata: boxes, captions, of any length) is kept
    as a list of those dicts instead of being stacked.

    Raises:
        FastDataError: the batch's images differ in size (the message says
            how to get one size, or to keep a list).
    """
    if isinstance(batch, Batch):
        out = [batch.images, batch.labels]
        return out if batch.metadata is None else [*out, MetadataBatch(batch.metadata)]
    shapes = _image_shapes(batch)
    if len(set(shapes)) > 1:
        from fastdata.errors import FastDataError
        from fastdata.loaders.sizes import mixed_size_message

        raise FastDataError(mixed_size_message(shapes, "this batch"))
    if batch and all(isinstance(s, (tuple, list)) for s in batch) and \
            len({len(s) for s in batch}) == 1 and \
            any(all(isinstance(s[k], dict) for s in batch) for k in range(len(batch[0]))):
        # Per field: the dicts as a list, the rest as torch collates them.
        return [MetadataBatch(field) if all(isinstance(v, dict) for v in field)
                else default_collate(list(field)) for field in zip(*batch)]
    return default_collate(batch)


class MetadataBatch(list):
    """A batch's metadata: the list of its dicts, and in ``columns`` the
    values that are numeric in every dict, stacked (a joined embedding:
    ``metas.columns["emb"]``, float32 [B, 512]; a score: [B])."""

    def __init__(self, dicts) -> None:
        super().__init__(dicts)
        self.columns: dict[str, torch.Tensor] = {}
        if not self or not all(isinstance(d, dict) for d in self):
            return
        for name in self[0]:
            values = [d.get(name) for d in self]
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                self.columns[name] = torch.tensor(values)
            elif all(hasattr(v, "dtype") and hasattr(v, "shape") for v in values) and \
                    len({tuple(v.shape) for v in values}) == 1:
                self.columns[name] = torch.as_tensor(np.stack(values))

    def __reduce__(self):
        return (MetadataBatch, (list(self),))


def _image_shapes(batch) -> list[tuple]:
    """Shapes of the first element of each ``(image, ...)`` sample that is a
    tensor or an array; empty when the samples are something else."""
    shapes = []
    for sample in batch:
        image = sample[0] if isinstance(sample, (tuple, list)) and sample else None
        shape = getattr(image, "shape", None)
        if shape is None:
            return []
        shapes.append(tuple(shape))
    return shapes
