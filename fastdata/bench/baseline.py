"""The baseline row: an image folder read the way torchvision's ImageFolder reads it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset


class ImageFolderBaseline(Dataset):
    """The plain image-folder pipeline: torchvision's ``ImageFolder`` with
    ``Resize((S, S))`` and ``PILToTensor()``, written out without torchvision.

    Each ``__getitem__`` opens one file, decodes it with PIL, converts it to
    RGB, resizes it to (S, S) with PIL's bilinear filter (what torchvision's
    Resize does on PIL images) and returns a uint8 CHW tensor. There is no
    ``__getitems__``: the DataLoader fetches sample by sample and collates
    with its default collate function, as it does for torchvision.

    Args:
        samples: (path, label) pairs, in the source's order: an
            ``ImageFolderSource``'s, which by default takes torchvision's
            extensions, so these are ``ImageFolder``'s samples and every packed
            row (packed from the same source) holds the same ones.
        size: (height, width) of the output.
    """

    def __init__(self, samples: Sequence[tuple[str, int]], size: tuple[int, int]) -> None:
        self.samples = list(samples)
        self.size = (int(size[0]), int(size[1]))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        path, label = self.samples[index]
        with open(path, "rb") as f:  # torchvision's pil_loader
            img = Image.open(f)
            img = img.convert("RGB")
        img = img.resize((self.size[1], self.size[0]), Image.Resampling.BILINEAR)
        array = np.array(img, copy=True)  # torchvision's PILToTensor copies too
        return torch.from_numpy(array).permute(2, 0, 1), label
