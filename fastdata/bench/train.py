"""Training rows (``fastdata bench --train``): random resized crops, whole decode or fused.

Each packed dataset gives two rows with the same output, ``(B, 3, S, S)``
uint8, the same boxes and flips (drawn from the run's ``seed``, the epoch
and the record index; the epoch is set before every epoch, so every epoch
crops anew, as in training):

* "train unfused": ``RandomResizedCrop(S, fused=False)``: the fastest full
  decoder (or ``--decoder``) decodes the whole image, then crop, resize, flip;
* "train fused": ``RandomResizedCrop(S)``: JPEGs with a restart marker after
  every MCU (``--variants jpeg90+restarts``, ``fastdata pack --jpeg-restarts``)
  have only the crop's MCUs decoded; other JPEGs are decoded in the crop
  region through TurboJPEG 3, when it is installed. The decoder must be
  "auto" and the records JPEGs; otherwise the fused row runs the unfused
  path, and the row's ``decode_path`` says so.

The folder baseline has no training row: its pipeline (PIL decode, PIL
resize) is not the crop, resize and flip the packed rows share, so a ratio to
it would mix two things. The summary compares fused with unfused per dataset,
each at its own best worker count, and, over several datasets, the best
fused row with the best unfused one (a dataset packed for fused crops
against the one the whole-image decode is fastest on).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from fastdata.bench.options import TRAIN_FUSED, TRAIN_PIPELINES, TRAIN_UNFUSED, BenchOptions
from fastdata.bench.results import BenchReport, best_of_all, train_summary
from fastdata.bench.targets import Target
from fastdata.decoding.fused_crop import FUSED_CUT, FUSED_REGION
from fastdata.decoding.random_crop import UNFUSED_DECODER, UNFUSED_ENCODING
from fastdata.errors import FastDataError

#: After region-decoded rows when no row had restart markers: the faster way.
RESTARTS_HINT = ("decoding only the crop's bytes needs JPEGs packed with --jpeg-restarts; "
                 "--variants jpeg90,jpeg90+restarts measures it on re-encoded copies")
#: RandomResizedCrop's reasons for a whole-image decode, in the CLI's words.
_CLI_REASONS = {UNFUSED_DECODER: "fused needs --decoder auto",
                UNFUSED_ENCODING: "the records are not JPEGs"}


def train_targets(targets: Sequence[Target]) -> list[Target]:
    """The two training rows of every packed target (folder targets have none).

    Raises:
        FastDataError: no packed target (only image folders were given).
    """
    out = [replace(t, name=f"{t.name} {pipeline}", pipeline=pipeline, base=t.name)
           for t in targets if t.kind == "packed" for pipeline in TRAIN_PIPELINES]
    if not out:
        raise FastDataError("--train measures packed datasets and none was given; pass an "
                            "image folder to pack (without --no-pack) or packed datasets")
    return out


def make_crop(target: Target, options: BenchOptions):
    """The ``RandomResizedCrop`` of a training row, or None for an evaluation row."""
    if target.pipeline not in TRAIN_PIPELINES:
        return None
    from fastdata.decoding.random_crop import RandomResizedCrop

    return RandomResizedCrop(options.size, fused=target.pipeline == TRAIN_FUSED)


def _full_decoder(encoding: str | None, decoder: str) -> str:
    """The decoder that decodes whole images of ``encoding`` under ``decoder``."""
    from fastdata.decoding.decode import is_available
    from fastdata.decoding.decoder_registry import AUTO_DEFAULT, AUTO_ORDER

    if decoder != "auto":
        return decoder
    names = AUTO_ORDER.get(encoding or "", AUTO_DEFAULT)
    return next((n for n in names if is_available(n)), names[-1])


def decode_path(ds: Any, target: Target, options: BenchOptions) -> str | None:
    """What a training row's Dataset really runs, in words (None for an eval row).

    Read from the Dataset and its first record: the conditions under which
    ``RandomResizedCrop.decode`` takes the fused path.
    """
    if target.pipeline not in TRAIN_PIPELINES:
        return None
    from fastdata.encodings import sniff_encoding

    inner = getattr(ds, "dataset", ds)  # a Subset under --limit
    if inner.decode.raw_shape is not None:
        return "raw pixels (no decode), then crop, resize, flip"
    first = target.indices[0] if target.indices else 0
    payload = inner.reader.read(first)
    encoding = sniff_encoding(payload)
    full = (f"full decode ({_full_decoder(encoding, options.decoder)}, "
            f"{encoding or 'unknown'}), then crop, resize, flip")
    if target.pipeline == TRAIN_UNFUSED:
        return full
    reason = inner.crop.unfused_reason(payload, inner.decode)
    if reason is None:
        from fastdata.decoding import fused_crop

        return fused_crop.path(payload)
    return f"{full}: {_CLI_REASONS.get(reason, reason)}"


def train_lines(report: BenchReport) -> list[str]:
    """The table's summary of the training rows: fused / unfused, best against best,
    and what each really ran."""
    rows = train_summary(report)
    if not rows:
        return []
    out = ["train fused / unfused, best against best (each at its best worker count):"]
    for row in rows:
        unfused, fused = row["unfused"], row["fused"]
        if row["ratio_fused_to_unfused"] is None:
            out.append(f"  {row['name']}: no ratio (a training row failed)")
        else:
            line = (f"  {row['name']}: {row['ratio_fused_to_unfused']:.2f}x "
                    f"(fused {fused['samples_per_s']:,.0f} samples/s at {fused['workers']} "
                    f"workers / unfused {unfused['samples_per_s']:,.0f} at "
                    f"{unfused['workers']})")
            if not row["fused_ran"]:
                line += ("; not a fused measurement: the fused rows ran the unfused path, "
                         "the ratio is only run-to-run noise")
            out.append(line)
        out.append(f"    fused ran: {row['fused_path'] or 'unknown'}")
        out.append(f"    unfused ran: {row['unfused_path'] or 'unknown'}")
    overall = best_of_all(report)
    if overall is not None:
        out.append(f"best fused / best unfused over all datasets: {overall['ratio']:.2f}x "
                   f"({overall['fused']} {overall['fused_rate']:,.0f} samples/s / "
                   f"{overall['unfused']} {overall['unfused_rate']:,.0f})")
    paths = {row["fused_path"] for row in rows}
    if FUSED_REGION in paths and FUSED_CUT not in paths:
        out.append(RESTARTS_HINT)
    return out
