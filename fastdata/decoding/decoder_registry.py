"""The decoder registry: every decoder by name, and the order ``decoder="auto"`` tries them.

Light (no numpy, no decoding library): the CLI's ``--decoder`` choices and the
benchmark's read the names from here. A new decoder is one class (a
``fastdata.decoding.decoders.Decoder``) and one entry in ``DECODERS``.
"""

from __future__ import annotations

#: name -> "module:Class" of the decoder.
DECODERS: dict[str, str] = {
    "simplejpeg": "fastdata.decoding.decoders:SimpleJPEGDecoder",
    "jpeg4py": "fastdata.decoding.decoders:JPEG4PyDecoder",
    "opencv": "fastdata.decoding.decoders:OpenCVDecoder",
    "pil": "fastdata.decoding.decoders:PILDecoder",
}

#: Fastest first, per encoding (measured with `fastdata bench`, see bench/RESULTS.md).
AUTO_ORDER: dict[str, tuple[str, ...]] = {
    "jpeg": ("simplejpeg", "jpeg4py", "opencv", "pil"),
    "png": ("opencv", "pil"),
}
#: The order for every other encoding.
AUTO_DEFAULT: tuple[str, ...] = ("opencv", "pil")


def decoder_choices() -> list[str]:
    """What a ``decoder=`` option accepts: "auto" and every registered name."""
    return ["auto", *DECODERS]
