"""The options of a pack (``fastdata.PackOptions``), recorded in the manifest."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fastdata.errors import FastDataError, UnknownFormatError
from fastdata.image_header import DEFAULT_MAX_PIXELS
from fastdata.packers.preprocess import Preprocess


@dataclass(frozen=True)
class PackOptions:
    """Options of a pack, recorded in the manifest.

    Attributes:
        format: container format name for an output without a known extension,
            or None to choose from the output extension (an extension of
            another format is refused).
        overwrite: replace an existing output.
        strict: stop at the first bad image instead of skipping it.
        verify_decode: decode every image fully at pack time (JPEGs strictly:
            one that decodes only with libjpeg's corrupt-data warning is bad).
        max_pixels: skip (or under ``strict`` refuse) an image whose header
            declares more pixels, before decoding it; None: no limit. Default
            178,956,970, where Pillow refuses decompression bombs. Not recorded
            in the manifest.
        shard_size: for sharded formats (tar, tfrecord): records per shard ("10000")
            or bytes per shard ("256MB"); None writes one file.
        preprocess: pack-time resize/crop/re-encode (default: store original bytes).
        workers: processes reading, checking and preprocessing images; None uses
            the usable cores. Every value gives the same files byte for byte,
            except the manifest's ``created_at`` (and LMDB's ``lock.mdb``).
        writer_options: further format options passed to the writer (tar:
            ``split``, ``source_extensions``, ``write_json``; see each format's
            writer); one its writer does not take is refused. Recorded in
            ``pack_options``, as given.
        extensions: for a folder source: the file extensions to pack, as
            ``ImageFolderSource(extensions=...)`` takes them (``"+gif"`` adds GIFs
            to torchvision's); None: torchvision's ``IMG_EXTENSIONS``. Recorded
            in ``pack_options``; the set used is in the manifest's ``source``.
        shuffle: a seed (a whole number >= 0): the records in the seeded random
            order of :mod:`fastdata.packers.shuffle`, labels and keys with them;
            None: source order. Recorded as ``pack_options.shuffle``.
        resume: continue the interrupted pack to this output: pieces already
            written (and checked whole) are kept, the rest is packed; refused
            when the source or the options (workers aside) changed. Not recorded.
        keep_source_path: record the source's absolute path (a URL without its
            credentials) as the manifest's ``source.root``; by default only its
            name is recorded (``images``, ``train.csv``), so the packing
            machine's folders do not travel with every copy. Not recorded.
    """

    format: str | None = None
    overwrite: bool = False
    strict: bool = False
    verify_decode: bool = False
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    shard_size: str | int | None = None
    preprocess: Preprocess = field(default_factory=Preprocess)
    workers: int | None = None
    writer_options: dict[str, Any] = field(default_factory=dict)
    extensions: Iterable[str] | str | None = None
    shuffle: int | None = None
    resume: bool = False
    keep_source_path: bool = False


def writer_options_for(spec, writer_cls, options: PackOptions, output: str) -> dict[str, Any]:
    """The keyword options for ``writer_cls``: ``options.writer_options`` with
    the shard size; an option the format's writer does not take (``split=``
    for an LMDB output) is refused, by name, before anything is written."""
    from fastdata.formats import sharded_formats

    writer_options = dict(options.writer_options)
    if options.shard_size not in (None, ""):
        if not spec.sharded:
            raise UnknownFormatError(
                f"shard_size= applies to sharded formats ({', '.join(sharded_formats())}), "
                f"not {spec.name}", path=output)
        size = options.shard_size
        # "10000" from the command line and 10000 from Python are one option.
        writer_options["shard_size"] = int(size) if isinstance(size, str) and \
            size.strip().isdigit() else size
    params = inspect.signature(writer_cls.__init__).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(writer_options) - set(params) - {"self"})
        if unknown:
            raise FastDataError(f"{', '.join(unknown)}: not an option of {spec.name} "
                                f"outputs (another format's); leave it out, or write that "
                                f"format", path=output)
    return writer_options
