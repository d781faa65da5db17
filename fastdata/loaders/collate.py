"""Batches built once: a batch of same-size images becomes one uint8 tensor.

``__getitems__`` of a fastdata map-style Dataset returns a :class:`Batch` when
every image of the batch has one shape: the images are stacked once into an
NHWC uint8 array and handed out as an NCHW view of it (channels-last memory,
which convolutions on the GPU prefer). ``fastdata.collate`` passes that tensor
through; torch's ``default_collate`` still works on a Batch (it sees a
sequence of ``(image, label)`` samples), at the cost of stacking again.
Per-sample metadata (dicts) is never stacked: ``fastdata.collate`` hands a
batch's dicts on as a list.
"""

from __future__ import annotations

from collections.abc import Sequence

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
            return self.images[i], int(self.labels[i]), self.metadata[i]
        return self.images[i], int(self.labels[i])

    def __repr__(self) -> str:
        return f"Batch(images={tuple(self.images.shape)}, labels={tuple(self.labels.shape)})"


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
        return out if batch.metadata is None else [*out, list(batch.metadata)]
    shapes = _image_shapes(batch)
    if len(set(shapes)) > 1:
        from fastdata.errors import FastDataError
        from fastdata.loaders.sizes import mixed_size_message

        raise FastDataError(mixed_size_message(shapes, "this batch"))
    if batch and all(isinstance(s, (tuple, list)) for s in batch) and \
            len({len(s) for s in batch}) == 1 and \
            any(all(isinstance(s[k], dict) for s in batch) for k in range(len(batch[0]))):
        # Per field: the dicts as a list, the rest as torch collates them.
        return [list(field) if all(isinstance(v, dict) for v in field)
                else default_collate(list(field)) for field in zip(*batch)]
    return default_collate(batch)


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
