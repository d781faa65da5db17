#!/usr/bin/env python3
"""timm's transforms and a timm model on a fastdata Dataset.

    python -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > pin.txt
    pip install timm -c pin.txt    # keeps your torch (docs/examples.md says why)
    python examples/timm_transforms.py train.lmdb --model resnet18 --image-size 224

timm's ``create_transform`` builds its training pipeline (random resized crop,
flip, RandAugment, random erasing) and its evaluation one (resize, centre crop)
from the model's data config. Its transforms start from PIL images (they refuse
uint8 tensors), so the datasets are opened with ``Decode(output="pil")``: fastdata
reads and decodes, timm transforms, ``fastdata.loader()`` batches in worker processes.
"""

from __future__ import annotations

import argparse

import timm
import torch
import torch.nn.functional as F
from timm.data import create_transform, resolve_model_data_config

import fastdata


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="a fastdata pack (train.lmdb, train.h5, a tar manifest...)")
    p.add_argument("--val", help="the pack to evaluate on (default: DATA)")
    p.add_argument("--model", default="resnet18", help="any timm model name")
    p.add_argument("--image-size", type=int, default=None,
                   help="default: the model's input size")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=2, help="training steps to take")
    args = p.parse_args(argv)

    classes = fastdata.open_dataset(args.data).classes
    model = timm.create_model(args.model, pretrained=False, num_classes=len(classes))
    config = resolve_model_data_config(model)   # input size, interpolation, mean, std
    if args.image_size:
        config["input_size"] = (3, args.image_size, args.image_size)
    train_tf = create_transform(**config, is_training=True, auto_augment="rand-m9-mstd0.5",
                                re_prob=0.25)
    eval_tf = create_transform(**config, is_training=False)
    print("train:", train_tf, "\neval:", eval_tf, sep="\n")

    pil = fastdata.Decode(output="pil")
    train = fastdata.open_dataset(args.data, decode=pil, transform=train_tf,
                                  order=fastdata.Order(shuffle=True, seed=0,
                                                       batch_size=args.batch_size))
    val = fastdata.open_dataset(args.val or args.data, decode=pil, transform=eval_tf,
                                order=fastdata.Order(batch_size=args.batch_size))

    # timm's transforms already give normalised float tensors: the loader only
    # batches them (and moves them to the GPU when there is one).
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, (images, labels) in enumerate(fastdata.loader(train, device=device)):
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step + 1}: images {tuple(images.shape)} {images.dtype}, "
              f"loss {loss.item():.4f}")
        if step + 1 == args.steps:
            break

    model.eval()
    correct = seen = 0
    with torch.no_grad():
        for images, labels in fastdata.loader(val, device=device):
            correct += (model(images).argmax(1) == labels).sum().item()
            seen += len(labels)
    print(f"eval: {seen} images of {tuple(images.shape[1:])}, accuracy {correct / seen:.2f}")


if __name__ == "__main__":
    main()
