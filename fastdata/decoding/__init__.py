"""Image decoding and training crops, torch-free: the one set of decode options
(:class:`~fastdata.decoding.options.Decode`, ``CenterCrop``), the decoder registry and the
decoders, DCT-scaled and region decoding, restart-marker cuts, fused random
resized crops, and the strict JPEG checks. The pack side (pre-processing,
--verify-decode), the Datasets and DALI all use it; nothing here imports torch
or the layers above.

``Decode``, ``CenterCrop`` and ``RandomResizedCrop`` are attributes of this
package too (``fastdata.Decode`` and so on), imported on first use: importing
the package, or its light ``decoder_registry``, loads no numpy.
"""

from fastdata.lazy import exports

# Public name -> "module:attribute", imported on first access.
_LAZY = {
    "CenterCrop": "fastdata.decoding.options:CenterCrop",
    "Decode": "fastdata.decoding.options:Decode",
    "RandomResizedCrop": "fastdata.decoding.random_crop:RandomResizedCrop",
}
__all__ = sorted(_LAZY)
__getattr__, __dir__ = exports(globals(), _LAZY)
