"""What one benchmark run measures: storage variants, worker counts, formats, settings."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from fastdata.decoding.decoder_registry import decoder_choices
from fastdata.errors import FastDataError

#: Row name of the image-folder baseline.
BASELINE_NAME = "folder (PIL)"
#: What a pre-decoded row says in its name.
RAW_LABEL = "raw (pre-decoded)"
#: Pipeline of an evaluation row: decode, resize to S x S.
EVAL = "eval"
#: Training rows (``--train``): a RandomResizedCrop to S x S, the whole image
#: decoded first, or (fused) only the crop region of JPEGs through TurboJPEG 3.
TRAIN_UNFUSED = "train unfused"
TRAIN_FUSED = "train fused"
TRAIN_PIPELINES = (TRAIN_UNFUSED, TRAIN_FUSED)
#: Decoders a run may use for the fastdata rows: "auto" and every registered one.
DECODERS: tuple[str, ...] = tuple(decoder_choices())


@dataclass(frozen=True)
class Variant:
    """How the images are stored: original bytes, resized or re-encoded at
    pack time, or raw pixels, with JPEG restart markers when the name ends
    in "+restarts".

    Attributes:
        name: "keep", "resizeN", "jpegQ" or "raw", and optionally "+restarts".
        preprocess: the pack-time preprocessing it stands for.
    """

    name: str
    preprocess: Any

    @property
    def suffix(self) -> str:
        """What is appended to the format's name in a row name."""
        if self.name == "keep":
            return ""
        if self.name == "raw":
            return " " + RAW_LABEL
        return " " + self.name


def parse_variants(text: str | Sequence[str], size: int) -> list[Variant]:
    """Parse ``--variants`` ("keep,resize256,jpeg90,jpeg90+restarts,raw").

    Args:
        text: comma-separated names, or a sequence of them.
        size: the benchmark's output side S: ``raw`` stores S x S pixels.

    Raises:
        FastDataError: an unknown variant name.
    """
    from fastdata.packers.preprocess import Preprocess

    names = [t.strip().lower() for t in (text.split(",") if isinstance(text, str) else text)]
    out: list[Variant] = []
    for name in dict.fromkeys(n for n in names if n):
        base, plus, extra = name.partition("+")
        if plus and extra != "restarts":
            raise FastDataError(f"unknown variant {name!r} in --variants: the only suffix is "
                                f"+restarts (for example jpeg90+restarts)")
        options = _variant_options(base, name, size)
        if plus:
            if options.get("encoding") == "raw":
                raise FastDataError(f"--variants: {name!r}: raw pixels have no JPEG restart "
                                    f"markers")
            options["restarts"] = True
        out.append(Variant(name, Preprocess(**options)))
    if not out:
        raise FastDataError(f"--variants names no variant; use {_VARIANT_NAMES}")
    return out


_VARIANT_NAMES = ("keep, resizeN (for example resize256), jpegQ (re-encoded at quality Q, "
                  "for example jpeg90) or raw, each but raw optionally with +restarts")


def _variant_options(base: str, name: str, size: int) -> dict[str, Any]:
    """The ``Preprocess`` arguments of a variant name without its suffix."""
    if base == "keep":
        return {}
    if base == "raw":
        return {"resize": (size, size), "encoding": "raw"}
    if m := re.fullmatch(r"resize(\d+)", base):
        if int(m.group(1)) < 1:
            raise FastDataError(f"--variants: {name!r} needs a positive size")
        return {"resize": int(m.group(1)), "encoding": "keep"}
    if m := re.fullmatch(r"jpeg(\d+)", base):
        if not 1 <= int(m.group(1)) <= 100:
            raise FastDataError(f"--variants: {name!r} needs a JPEG quality of 1-100")
        return {"encoding": "jpeg", "quality": int(m.group(1))}
    raise FastDataError(f"unknown variant {name!r} in --variants; use {_VARIANT_NAMES}")


def parse_workers(text: str | int | Sequence[int]) -> tuple[int, ...]:
    """Parse ``--workers`` ("0,1,2,4") into a tuple of distinct worker counts.

    Raises:
        FastDataError: not a list of non-negative integers.
    """
    if isinstance(text, int):
        items: Iterable = [text]
    elif isinstance(text, str):
        items = [t for t in text.replace(" ", "").split(",") if t]
    else:
        items = text
    try:
        counts = tuple(dict.fromkeys(int(x) for x in items))
    except ValueError:
        raise FastDataError(f"--workers must be comma-separated integers such as 0,1,2,4, "
                            f"not {text!r}") from None
    if not counts or min(counts) < 0:
        raise FastDataError(f"--workers needs counts of 0 or more, not {text!r}")
    return counts


def parse_formats(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """Parse ``--formats`` (default: every registered format).

    Raises:
        UnknownFormatError: a name that is not registered.
    """
    from fastdata.formats import FORMATS, get_format

    if text is None or text == "" or text == "all":
        return tuple(FORMATS)
    names = text.split(",") if isinstance(text, str) else list(text)
    return tuple(dict.fromkeys(get_format(n.strip()).name for n in names if n.strip()))


@dataclass(frozen=True)
class BenchOptions:
    """Settings shared by every row of one benchmark run.

    Attributes:
        size: output side S; every row returns S x S images.
        batch_size: DataLoader batch size.
        workers: DataLoader worker counts to sweep.
        epochs: measured epochs (the median is reported).
        warmup: epochs run first and discarded.
        decoder: decoder of the fastdata rows (the baseline always uses PIL).
        cold: drop the page cache before every measured epoch.
        seed: shuffling seed (every row sees the same order) and ``limit`` selection.
        limit: use only this many samples (a seeded random selection).
        timeout: seconds a DataLoader worker may take for one batch before the
            row fails instead of hanging.
        ram_cache: fastdata rows hold their payloads in the shared RAM cache
            (``cache="ram"``); the baseline reads its files as before.
        persistent_workers: keep DataLoader workers between epochs (every row alike).
        train: the rows are training pipelines (random crops, a new one per
            epoch from ``seed``) instead of evaluation ones (``--train``).
        step_ms: simulated training steps, in milliseconds (``--step-ms``): each
            training row is measured again per step, the loop sleeping that
            long after each batch (see :mod:`fastdata.bench.step`).
    """

    size: int = 224
    batch_size: int = 64
    workers: tuple[int, ...] = (2,)
    epochs: int = 3
    warmup: int = 1
    decoder: str = "auto"
    cold: bool = False
    seed: int = 0
    limit: int | None = None
    timeout: float = 600.0
    ram_cache: bool = False
    persistent_workers: bool = True
    train: bool = False
    step_ms: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.size < 1:
            raise FastDataError(f"--size must be positive, not {self.size}")
        if self.batch_size < 1:
            raise FastDataError(f"--batch-size must be positive, not {self.batch_size}")
        if self.epochs < 1:
            raise FastDataError(f"--epochs must be at least 1, not {self.epochs}")
        if self.warmup < 0:
            raise FastDataError(f"warm-up epochs cannot be negative, not {self.warmup}")
        if self.limit is not None and self.limit < 1:
            raise FastDataError(f"--limit must be positive, not {self.limit}")
        if self.decoder not in DECODERS:
            raise FastDataError(f"unknown decoder {self.decoder!r}; choose one of "
                                f"{', '.join(DECODERS)}")
        if self.step_ms and not self.train:
            raise FastDataError("--step-ms simulates a training step: it needs --train")
        if any(not s >= 0 for s in self.step_ms):
            raise FastDataError(f"--step-ms needs steps of 0 ms or more, not {self.step_ms}")

    def to_dict(self) -> dict[str, Any]:
        """The options as JSON-ready values (``--json``'s ``options``)."""
        data = asdict(self)
        data["workers"] = list(self.workers)
        if self.step_ms:
            data["step_ms"] = list(self.step_ms)
        else:  # a run without steps writes what it wrote before they existed
            del data["step_ms"]
        return data
