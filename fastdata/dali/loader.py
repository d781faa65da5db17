"""DALILoader: a DALI pipeline wrapped in DALI's PyTorch iterator, epochs sized right."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

from fastdata.dali.device import import_dali
from fastdata.dali.options import DALIReader, Device, Layout, StartMethod, options_from
from fastdata.dali.pipeline import plan_and_build
from fastdata.dali.readers import READER_NAME
from fastdata.dataset.ref import DatasetRef
from fastdata.decoding.options import Decode
from fastdata.errors import FastDataError
from fastdata.keywords import explain_keywords
from fastdata.order.options import Order


class DALILoader:
    """Iterates ``(images, labels)`` torch tensors from a DALI pipeline over a dataset.

    Takes :func:`build_pipeline`'s arguments, with the same meaning
    (``decode=fastdata.Decode(...)``, ``order=fastdata.Order(...)``,
    ``run_ahead``, DALI's own settings). Images
    are ``[B, C, H, W]`` (``layout="CHW"``) uint8, or float32 with
    ``mean``/``std``; labels int64 ``[B]``; both on the GPU for device "gpu",
    else on the CPU. Each epoch holds exactly this shard's records: the last
    batch is partial unless ``Order(drop_last=True)``.

    The images of a batch must share one size: give ``Decode(size=(h, w))``,
    or a crop, unless the dataset is pre-decoded at a fixed shape.

    Attributes:
        pipeline: the DALI pipeline.
        plan: how it reads the dataset (:class:`PipelinePlan`).
    """

    @explain_keywords()
    def __init__(self, path: str | os.PathLike | Sequence[str | os.PathLike] | DatasetRef, *,
                 decode: Decode | None = None, order: Order | None = None,
                 run_ahead: int = 2, device: Device = "auto", device_id: int | None = None,
                 num_threads: int = 2, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, layout: Layout = "CHW",
                 reader: DALIReader = "auto", py_workers: int = 0,
                 py_start_method: StartMethod | None = None,
                 index_dir: str | os.PathLike | None = None) -> None:
        import_dali()  # before the options: without DALI, say how to install it first
        opts = options_from(locals())
        drop_last = opts.order.drop_last
        self.pipeline, self.plan = plan_and_build(path, opts)
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        if self.plan.reader == "external":
            # The source itself ends each epoch (and drops a partial batch if asked).
            policy = {"last_batch_policy": LastBatchPolicy.PARTIAL}
        else:
            policy = {"reader_name": READER_NAME, "last_batch_policy":
                      LastBatchPolicy.DROP if drop_last else LastBatchPolicy.PARTIAL}
        self._manifest = None
        from fastdata.meter.loop import Meter

        #: The stall meter (:func:`fastdata.stats`): the loop's waits; DALI's
        #: stages run inside its pipeline, unmeasured.
        self.meter = Meter()
        # The iterator runs the first batches as it is made.
        with self._explained():
            self._iter = DALIGenericIterator(self.pipeline, ["images", "labels"],
                                             auto_reset=True, **policy)

    def __len__(self) -> int:
        """Batches per epoch for this shard."""
        if self.plan.reader == "external":
            return self.plan.batches
        return len(self._iter)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        """One epoch of ``(images, labels)``. Left early, the next loop carries on
        with the rest of that epoch (DALI's iterators cannot restart one midway)."""
        with self._explained():
            for out in self.meter.loop.wrap(self._iter):
                batch = out[0]
                yield batch["images"], batch["labels"].view(-1)

    @contextlib.contextmanager
    def _explained(self) -> Iterator[None]:
        # DALI's own message about ragged batches names none of the options that fix it.
        try:
            yield
        except RuntimeError as exc:
            if "IsDenseTensor" not in str(exc):
                raise
            raise FastDataError(
                "the images of a batch differ in size, so they cannot be stacked into one "
                "tensor: give Decode(size=(height, width)), or a crop (an int size keeps each "
                "image's aspect ratio); build_pipeline gives ragged batches",
                path=self.plan.path if isinstance(self.plan.path, str) else None) from exc

    @property
    def manifest(self) -> Any:
        """The dataset's manifest (``fastdata.records.Manifest``), read on first use."""
        if self._manifest is None:
            from fastdata.dataset.resolve import read_manifest

            self._manifest = read_manifest(self.plan.path)
        return self._manifest

    @property
    def classes(self) -> list[str]:
        """Class names, by label."""
        return list(self.manifest.classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name to label, as torchvision's ImageFolder has it."""
        return self.manifest.class_to_idx

    def __repr__(self) -> str:
        p = self.plan
        return (f"DALILoader({p.path!r}, format={p.format}, reader={p.reader}, mode={p.mode}, "
                f"device={p.device}, shard {p.shard_id}/{p.num_shards}, batches={len(self)})")
