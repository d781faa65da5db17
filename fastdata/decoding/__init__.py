"""Image decoding and training crops, torch-free: the one set of decode options
(:class:`~fastdata.decoding.options.Decode`, ``CenterCrop``), the decoder registry and the
decoders, DCT-scaled and region decoding, restart-marker cuts, fused random
resized crops, and the strict JPEG checks. The pack side (pre-processing,
--verify-decode), the Datasets and DALI all use it; nothing here imports torch
or the layers above.
"""
