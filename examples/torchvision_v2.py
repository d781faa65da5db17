#!/usr/bin/env python3
"""torchvision.transforms.v2 on fastdata samples and batches.

    python -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > pin.txt
    pip install torchvision -c pin.txt   # keeps your torch (docs/examples.md says why)
    python examples/torchvision_v2.py train.lmdb --image-size 224

fastdata's samples are uint8 CHW tensors, which v2 transforms take as they are:

1. per sample: a v2 pipeline as the dataset's ``transform`` (crop, flip, colour,
   float conversion, normalisation), read by ``fastdata.loader()`` in worker
   processes, as any per-sample Python transform is;
2. per batch: fastdata decodes the random crops itself (only the crop's region
   of a JPEG), ``fastdata.loader()`` hands over float batches normalised on the
   GPU, and v2's CutMix/MixUp mix whole batches there.
"""

from __future__ import annotations

import argparse

import torch
from torchvision.transforms import v2

import fastdata

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="a fastdata pack (train.lmdb, train.h5, a tar manifest...)")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=2, help="batches to read from each")
    args = p.parse_args(argv)
    size = args.image_size
    order = fastdata.Order(shuffle=True, seed=0, batch_size=args.batch_size)

    # 1. A v2 pipeline per sample: uint8 (3, H, W) tensor in, normalised float out.
    per_sample = v2.Compose([
        v2.RandomResizedCrop(size, antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(MEAN, STD),
    ])
    ds = fastdata.open_dataset(args.data, transform=per_sample, order=order)
    for step, (images, labels) in enumerate(fastdata.loader(ds)):
        assert images.dtype == torch.float32 and images.shape[1:] == (3, size, size)
        print(f"per sample: {tuple(images.shape)} {images.dtype}, labels {labels[:8].tolist()}")
        if step + 1 == args.batches:
            break

    # 2. fastdata's crops, then v2 on whole batches (on the GPU when there is one).
    crops = fastdata.open_dataset(
        args.data, decode=fastdata.Decode(crop=fastdata.RandomResizedCrop(size, hflip=0.5)),
        order=order)
    classes = len(crops.classes)
    mix = v2.RandomChoice([v2.CutMix(num_classes=classes), v2.MixUp(num_classes=classes)])
    for step, (images, labels) in enumerate(fastdata.loader(crops, mean=MEAN, std=STD)):
        images, soft = mix(images, labels)   # soft labels: (batch, classes), rows sum to 1
        assert soft.shape == (len(labels), classes)
        assert torch.allclose(soft.sum(1), torch.ones(len(labels), device=soft.device))
        print(f"per batch: {tuple(images.shape)} on {images.device}, mixed labels "
              f"{tuple(soft.shape)}")
        if step + 1 == args.batches:
            break


if __name__ == "__main__":
    main()
