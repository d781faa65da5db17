#!/usr/bin/env python3
"""A Lightning DataModule over fastdata datasets, and a small model fitted with it.

    python -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > pin.txt
    pip install lightning -c pin.txt     # keeps your torch (docs/examples.md says why)
    python examples/lightning_datamodule.py train.lmdb --val val.lmdb --max-steps 100

The DataModule opens the packs with fastdata's decoding (random resized crops
for training, resize + centre crop for validation) and reads them with
``fastdata.loader()`` on the trainer's device: it copies uint8 batches (4x
fewer bytes than float ones) and normalises them there, so Lightning gets
batches already in place.

Lightning's own order machinery is turned off (``use_distributed_sampler=False``):
``fastdata.EpochBatches`` already gives each DDP rank an equal share of one
order. A small callback tells it Lightning's epoch, also after a resume.

Is loading the bottleneck? A second callback reads the loader's stall meter
at each training epoch's end (``fastdata.stats``), logs its figures with the
module's ``log_dict`` (``fastdata.log_stats``: ``fastdata/data_wait`` and the
rest, beside the loss in any Lightning logger) and prints its one line of
advice.

Checkpoint at epoch ends (Lightning's default): a run resumed from one reads
the next epoch's order, as an uninterrupted run does. A mid-epoch checkpoint
does not resume exactly: Lightning 2.6 iterates a restored loader more than
once (torchdata's StatefulDataLoader, whose state Lightning restores, starts
each new pass of the half-read epoch again at the restored point, so batches
repeat). ``examples/train_classifier.py`` resumes mid-epoch exactly.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

import fastdata

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class FastDataModule(L.LightningDataModule):
    def __init__(self, train: str, val: str | None = None, *, image_size: int = 224,
                 batch_size: int = 64, num_workers: int = 2, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        h = self.hparams
        self.train_set = fastdata.open_dataset(
            h.train, decode=fastdata.Decode(crop=fastdata.RandomResizedCrop(h.image_size,
                                                                            hflip=0.5)),
            order=fastdata.Order(shuffle=True, seed=h.seed, batch_size=h.batch_size,
                                 drop_last=True))
        # The usual evaluation transform: the shorter side to 256/224 of the crop.
        self.val_set = fastdata.open_dataset(
            h.val or h.train,
            decode=fastdata.Decode(size=round(h.image_size * 256 / 224),
                                   crop=fastdata.CenterCrop(h.image_size)),
            order=fastdata.Order(batch_size=h.batch_size))
        self.classes = self.train_set.classes

    def _loader(self, ds):
        # The dataset's order: this rank's batches of it (fastdata.EpochBatches),
        # copied as uint8 to the trainer's device and normalised there.
        return fastdata.loader(ds, device=self.trainer.strategy.root_device,
                               mean=MEAN, std=STD, num_workers=self.hparams.num_workers)

    def train_dataloader(self):
        return self._loader(self.train_set)

    def val_dataloader(self):
        return self._loader(self.val_set)


class FastDataEpochs(L.Callback):
    """Each training epoch, the epoch of its order (and of the random crops)."""

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        batches = trainer.train_dataloader.loader.batch_sampler   # EpochBatches
        batches.set_epoch(trainer.current_epoch)
        print(f"epoch {trainer.current_epoch}: {len(batches)} batches of its order")


class LoadingStats(L.Callback):
    """At each training epoch's end: how long the loop waited for data, the stage
    that limits loading, and what to try; logged, and the advice printed."""

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        figures = fastdata.stats(trainer.train_dataloader, reset=True)  # this epoch's
        fastdata.log_stats(figures, pl_module)   # pl_module.log_dict: fastdata/...
        print(f"epoch {trainer.current_epoch} loading: {figures['advice']}")


class Classifier(L.LightningModule):
    def __init__(self, classes: int, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes))

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = F.cross_entropy(self.net(images), labels)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        accuracy = (self.net(images).argmax(1) == labels).float().mean()
        self.log("val_acc", accuracy, prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="the training pack")
    p.add_argument("--val", help="the validation pack (default: the training pack)")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-steps", type=int, default=100)
    p.add_argument("--num-workers", type=int, default=2)
    args = p.parse_args(argv)

    data = FastDataModule(args.data, args.val, image_size=args.image_size,
                          batch_size=args.batch_size, num_workers=args.num_workers)
    data.setup("fit")   # for the class count; Lightning calls it again, which is cheap
    model = Classifier(len(data.classes))
    trainer = L.Trainer(max_steps=args.max_steps, use_distributed_sampler=False,
                        callbacks=[FastDataEpochs(), LoadingStats()],
                        accelerator="auto", devices="auto", logger=False,
                        enable_checkpointing=False)
    trainer.fit(model, datamodule=data)
    print(f"fitted {trainer.global_step} steps: {dict(trainer.callback_metrics)}")


if __name__ == "__main__":
    main()
