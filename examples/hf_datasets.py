#!/usr/bin/env python3
"""Read a fastdata tar pack with Hugging Face ``datasets``.

    pip install datasets
    fastdata pack images/ train-%06d.tar --shard-size 10000
    python examples/hf_datasets.py train.tar.fastdata.json

fastdata's tar shards are webdataset shards (``KEY.jpg``/``KEY.png`` and
``KEY.cls``, plain USTAR headers), so the ``webdataset`` builder of
``datasets.load_dataset`` reads them as they are. The fastdata manifest
says which shards make the dataset and what the labels mean: the shard list
becomes ``data_files`` and the class names a ``ClassLabel`` feature. The rows
come in fastdata's record order, with the same labels.
"""

from __future__ import annotations

import argparse
import os

import datasets
import numpy as np
import torch

import fastdata
from fastdata.formats import read_manifest


def load(manifest_path: str, *, streaming: bool = False):
    """The tar pack at ``manifest_path`` as a Hugging Face dataset with columns
    ``image`` (PIL), ``label`` (a ClassLabel of the pack's classes) and ``__key__``."""
    manifest = read_manifest(manifest_path)
    if manifest.format != "tar":
        raise SystemExit(f"{manifest_path} is a {manifest.format} pack; datasets' webdataset "
                         "builder reads tar shards (fastdata convert IN out-%06d.tar)")
    folder = os.path.dirname(os.path.abspath(manifest_path))
    shards = [os.path.join(folder, shard["path"]) for shard in manifest.shards]
    # streaming=True reads the shards as they are; without it datasets first copies
    # every image into Arrow files in its cache (~/.cache/huggingface).
    ds = datasets.load_dataset("webdataset", data_files={"train": shards}, split="train",
                               streaming=streaming)
    # The image column is named after the members' extension: jpg, png, webp...
    features = ds.features
    image = next(name for name, f in features.items() if isinstance(f, datasets.Image))
    ds = ds.rename_columns({image: "image", "cls": "label"})
    return ds.cast_column("label", datasets.ClassLabel(names=manifest.classes))


def to_tensors(batch: dict) -> dict:
    """PIL images to uint8 CHW tensors, as fastdata's datasets give them."""
    batch["image"] = [torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1)
                      for im in batch["image"]]
    return batch


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("manifest", help="a fastdata tar pack's manifest (*.tar.fastdata.json)")
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args(argv)

    ds = load(args.manifest)
    print(ds)
    print(ds.features["label"])

    # The same records, in the same order, as fastdata reads them (decoded by PIL
    # on both sides here, so the pixels are equal too).
    packed = fastdata.open_dataset(args.manifest, decode=fastdata.Decode(decoder="pil"))
    assert len(ds) == len(packed) and ds["label"] == list(packed.targets)
    image, label = packed[0]
    assert torch.equal(to_tensors(ds[:1])["image"][0], image) and ds[0]["label"] == label
    print(f"{len(ds)} rows: the labels of fastdata's {len(packed)} records, in its order")

    # Into torch: decoded per sample by datasets, batched by a DataLoader.
    loader = torch.utils.data.DataLoader(ds.with_transform(to_tensors),
                                         batch_size=args.batch_size, shuffle=True,
                                         collate_fn=lambda rows: rows)
    rows = next(iter(loader))
    print(f"a batch of {len(rows)}: image {tuple(rows[0]['image'].shape)}, "
          f"label {ds.features['label'].int2str(rows[0]['label'])}")

    # Streaming: the shards read in place, a sample at a time.
    stream = load(args.manifest, streaming=True)
    first = next(iter(stream))
    print(f"streamed: key {first['__key__']}, label {first['label']}, image {first['image'].size}")


if __name__ == "__main__":
    main()
