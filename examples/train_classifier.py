#!/usr/bin/env python3
"""Train an image classifier on a fastdata pack: one process, torchrun DDP, GPU or CPU.

    fastdata synth --kind tiny -n 2048 images/ && fastdata pack images/ train.lmdb
    python examples/train_classifier.py train.lmdb --epochs 2 --image-size 32
    torchrun --standalone --nproc_per_node=2 examples/train_classifier.py train.lmdb \\
        --checkpoint ckpt.pt --checkpoint-every 100
    # killed? the same command again continues from ckpt.pt, mid-epoch, exactly

What it shows:

* reading: ``fastdata.open_dataset(path, decode=Decode(crop=RandomResizedCrop(...)),
  order=Order(...))`` and ``fastdata.loader()``, which hands over uint8 batches and
  normalises them on the GPU (its CUDAPrefetcher), or on the CPU without one;
* DDP: one order for the whole job, every rank the same number of batches
  (``fastdata.EpochBatches``), so no rank waits in an all-reduce for another;
* checkpoints: model, optimizer, LR schedule and the data position in one file,
  written by rank 0 atomically (a temporary file renamed), loaded by every rank;
* exact resume: the batches after a resume are those an uninterrupted run reads,
  random crops included (fastdata draws them from (seed, epoch, record));
* is loading the bottleneck? At each epoch's end ``fastdata.stats(loader)`` gives
  the share of the loop's time spent waiting for data and one line of advice,
  printed; ``--stats PATH.jsonl`` appends the figures (``fastdata.log_stats``).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import fastdata

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's, on the 0-1 scale


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="a fastdata pack: train.lmdb, train.h5, a tar or TFRecord "
                                "manifest (*.fastdata.json), or a URL")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64, help="per rank (default: 64)")
    p.add_argument("--lr", type=float, default=0.1, help="peak learning rate (cosine decay)")
    p.add_argument("--image-size", type=int, default=224, help="random crops of this size")
    p.add_argument("--model", choices=("auto", "cnn", "resnet18"), default="auto",
                   help="auto: torchvision's ResNet-18 where torchvision imports, else a small CNN")
    p.add_argument("--checkpoint", metavar="PATH",
                   help="save here; when PATH exists, resume from it first")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="save every N steps (0: only at the end)")
    p.add_argument("--max-steps", type=int, default=0,
                   help="stop after this many steps in all, resumed ones included (0: no limit)")
    p.add_argument("--seed", type=int, default=0, help="model init, data order and crops")
    p.add_argument("--log-batches", metavar="FILE",
                   help="append a JSON line per step: records, image digest, loss "
                        "(each rank its own file: steps.jsonl -> steps.rank0.jsonl)")
    p.add_argument("--log-every", type=int, default=20, metavar="N", help="print every N steps")
    p.add_argument("--stats", metavar="PATH.jsonl",
                   help="append the loader's figures at each epoch's end (data wait, "
                        "stages, advice; every rank's under 'ranks'), one JSON line each")
    return p.parse_args(argv)


def setup_distributed() -> tuple[int, int, torch.device]:
    """torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; without them this is one process."""
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    else:
        device = torch.device("cpu")
        # Ranks on one machine share its cores: one rank's threads per share.
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // local_world))
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return rank, world, device


class SmallCNN(nn.Sequential):
    """Three conv blocks and a linear head: enough to watch the loss fall."""

    def __init__(self, classes: int, width: int = 32) -> None:
        def block(cin, cout):
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                    nn.ReLU(inplace=True)]
        super().__init__(*block(3, width), nn.MaxPool2d(2), *block(width, 2 * width),
                         nn.MaxPool2d(2), *block(2 * width, 4 * width),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, classes))


def make_model(name: str, classes: int) -> nn.Module:
    if name in ("auto", "resnet18"):
        try:
            import torchvision
        # A torchvision built for another torch fails while loading its operators.
        except (ImportError, RuntimeError, OSError) as e:
            if name == "resnet18":
                raise SystemExit(f"--model resnet18 needs torchvision, which did not import: {e}")
        else:
            return torchvision.models.resnet18(num_classes=classes)
    return SmallCNN(classes)


def save_checkpoint(path: str, state: dict) -> None:
    """Write ``state`` to ``path`` so that a crash at any moment leaves the previous
    checkpoint or this one, never half a file: write a temporary file, then rename."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv=None) -> None:
    args = parse_args(argv)
    rank, world, device = setup_distributed()
    torch.manual_seed(args.seed)  # the same initial weights on every rank and every run

    # The data: random resized crops and flips decoded by fastdata, in one order
    # for the whole job (seed, shuffle, batch size); drop_last keeps every batch full.
    crop = fastdata.RandomResizedCrop(args.image_size, scale=(0.25, 1.0), hflip=0.5)
    ds = fastdata.open_dataset(
        args.data, decode=fastdata.Decode(crop=crop),
        order=fastdata.Order(shuffle=True, seed=args.seed, batch_size=args.batch_size,
                             drop_last=True))
    # uint8 batches in, float batches out: normalised on the GPU when there is one.
    train = fastdata.loader(ds, device=device, mean=MEAN, std=STD,
                            channels_last=device.type == "cuda")
    # It reads this rank's batches of that order (rank and world size from
    # torch.distributed): the same number on every rank, the next epoch after each pass.
    # It decodes batches ahead of the loop, but its state_dict() counts only the batches
    # it handed to the loop: that is the position a checkpoint keeps.
    steps_per_epoch = len(train)

    model = make_model(args.model, len(ds.classes)).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9,
                                weight_decay=5e-4)
    total = max(1, args.epochs * steps_per_epoch)  # the schedule ignores --max-steps
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))

    step = 0
    if args.checkpoint and rank == 0:  # what a write cut short by a crash left behind
        for stale in glob.glob(glob.escape(args.checkpoint) + ".tmp*"):
            os.remove(stale)
    if args.checkpoint and os.path.exists(args.checkpoint):
        # Every rank loads the same file; rank 0's weights are everyone's anyway.
        ckpt = torch.load(args.checkpoint, map_location=device, weights_only=True)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        schedule.load_state_dict(ckpt["scheduler"])
        train.load_state_dict(ckpt["data"])   # epoch and samples consumed: exact, also
        step = ckpt["step"]                   # with another number of ranks or workers
        if rank == 0:
            print(f"resumed from {args.checkpoint} at step {step}, "
                  f"epoch {ckpt['data']['epoch']}", flush=True)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.index is not None
                                  else None) if world > 1 else model

    saved_at = None  # the step of the last checkpoint written

    def checkpoint() -> None:
        nonlocal saved_at
        saved_at = step
        if rank == 0:
            save_checkpoint(args.checkpoint, {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": schedule.state_dict(), "data": train.state_dict(),
                "step": step, "world_size": world})
            print(f"checkpoint saved at step {step}", flush=True)

    log = None
    if args.log_batches:
        root, ext = os.path.splitext(args.log_batches)
        log = open(f"{root}.rank{rank}{ext}", "a", encoding="utf-8")
    if rank == 0:
        print(f"{world} rank(s) on {device}, {len(ds)} records, {len(ds.classes)} classes, "
              f"{steps_per_epoch} steps per epoch; loader: {train!r}", flush=True)

    done = bool(args.max_steps) and step >= args.max_steps
    epoch = train.state_dict()["epoch"]   # 0, or the checkpoint's
    while epoch < args.epochs and not done:
        # Only for --log-batches: the record indices of each step, from a copy of the
        # loader's order that reads no data, started at the loader's position.
        walk = None
        if log is not None:
            twin = fastdata.EpochBatches(len(ds), ds.order)
            twin.load_state_dict(train.state_dict())
            walk = iter(twin)
        for images, labels in train:       # one pass: the rest of this epoch
            records = next(walk) if walk is not None else None
            loss = F.cross_entropy(ddp(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()        # DDP averages the gradients over the ranks here
            optimizer.step()
            schedule.step()
            step += 1
            if log is not None:
                log.write(json.dumps({
                    "step": step, "epoch": epoch, "rank": rank, "world": world,
                    "pid": os.getpid(), "records": records, "labels": labels.tolist(),
                    "images": hashlib.sha256(images.cpu().numpy().tobytes()).hexdigest()[:16],
                    "loss": loss.item()}) + "\n")
                log.flush()
            if rank == 0 and step % args.log_every == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f} "
                      f"lr {schedule.get_last_lr()[0]:.4f}", flush=True)
            if args.checkpoint and args.checkpoint_every and step % args.checkpoint_every == 0:
                checkpoint()
            if args.max_steps and step >= args.max_steps:
                done = True
                break              # leaving the loop stops the loader's read-ahead
        # Is loading the bottleneck? This pass's figures (a collective: every rank
        # calls it here), then counted afresh for the next pass.
        figures = fastdata.stats(train, ranks=world > 1, reset=True)
        if rank == 0:
            print(f"epoch {epoch} loading: {figures['advice']}", flush=True)
            if args.stats:
                fastdata.log_stats({"epoch": epoch, **figures}, args.stats, step=step)
        if not done:
            epoch += 1             # the loader's next pass reads the next epoch
    if args.checkpoint and saved_at != step:  # the last step's, unless written already
        checkpoint()
    if log is not None:
        log.close()
    if world > 1:
        # Every rank past its last collective before any tears the group down:
        # a peer closing its connections mid-exchange aborts the other rank.
        dist.barrier()
        # DDP's reducer goes before the group it uses: torn down at interpreter
        # exit, after the group, it now and then aborts the process.
        del ddp
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
