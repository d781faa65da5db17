"""Random streams and per-class colour tendencies of the demo images.

Every image is drawn from its own stream, seeded by ``(seed, kind, index)``,
and every class from its own, so the output never depends on the order in
which images are generated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Mixed into every seed so that "photos" and "tiny" never share a stream.
KIND_TAG: dict[str, int] = {"photos": 1, "tiny": 2}
# Separates per-class palette streams from per-image streams.
_CLASS_TAG = 0xC1A55


@dataclass(frozen=True)
class Palette:
    """A class's colour tendency: a dominant and a secondary RGB colour (0-1).

    Attributes:
        main: the dominant colour, float32 RGB in 0-1.
        second: the secondary colour, float32 RGB in 0-1.
        shape_kind: the class's typical object shape (0-3).
    """

    main: np.ndarray
    second: np.ndarray
    shape_kind: int


def image_rng(seed: int, kind: str, index: int) -> np.random.Generator:
    """The random stream of image number ``index`` of a ``synthesize`` run."""
    return np.random.default_rng(np.random.SeedSequence([seed, KIND_TAG[kind], index]))


def class_palette(seed: int, kind: str, c: int) -> Palette:
    """The colour tendency of class ``c``, from its own random stream."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, KIND_TAG[kind], _CLASS_TAG, c]))
    # Spread hues around the wheel (golden-ratio steps) so neighbouring
    # classes differ, then jitter so the seed matters.
    hue = (c * 0.618034 + rng.uniform(0, 1)) % 1.0
    main = _hsv_to_rgb(hue, rng.uniform(0.35, 0.7), rng.uniform(0.45, 0.8))
    second = _hsv_to_rgb((hue + rng.uniform(0.25, 0.75)) % 1.0, rng.uniform(0.2, 0.6),
                         rng.uniform(0.3, 0.9))
    return Palette(main=main, second=second, shape_kind=int(rng.integers(0, 4)))


def jitter(rng: np.random.Generator, colour: np.ndarray, amount: float) -> np.ndarray:
    """``colour`` with Gaussian noise of ``amount`` per channel, kept inside 0.02-0.98."""
    return np.clip(colour + rng.normal(0.0, amount, 3).astype(np.float32), 0.02, 0.98)


def _hsv_to_rgb(h: float, s: float, v: float) -> np.ndarray:
    i = int(h * 6.0) % 6
    f = h * 6.0 - int(h * 6.0)
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    return np.array([(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][i], np.float32)
