"""Built-in demo data: write a synthetic ImageFolder tree to try fastdata on.

Two kinds are available:

* ``"photos"`` -- photo-like JPEGs shaped like ImageNet (ILSVRC-2012 train):
  sides 300-640 px (mean about 470x385; many 500x375 / 500x333 and their
  portrait twins) and a mean file size of about 110 kB (~0.6 bytes/pixel).
  They are encoded the way most ImageNet JPEGs are: 70% at quality 88-95 and
  mostly without chroma subsampling (4:4:4), the rest at 75-87 and mostly
  4:2:0; baseline, standard Huffman tables. The content is built to compress
  and decode like camera photos rather than like flat colour or white noise:
  a lit, vignetted scene, shaded shapes and clusters of small objects (edges),
  textured regions (grass and hair streaks, foliage and gravel blobs, fabric,
  planks and tiles, fine grain) at several scales, out-of-focus patches, and
  sensor noise (luma, stronger in bright areas and the corners, plus weaker,
  blotchy chroma). JPEG decode time follows from bytes and pixels, and costs
  the same per byte on these images as on real photos, so decode benchmarks
  on them are meaningful; ``bench/synth_realism.py`` prints the figures next
  to real photos and the ImageNet reference.
* ``"tiny"`` -- 32x32 RGB PNGs like CIFAR: a small shape on a gradient.

Every image is drawn from its own random stream, seeded by
``(seed, kind, image index)``, so output is byte-identical for the same
arguments whatever the order of generation.

    from fastdata.demo import synthesize

    summary = synthesize("demo/", kind="photos", n=512)
    fastdata.pack("demo/", "demo.lmdb")

Modules: ``generate`` (the tree, written atomically), ``photos`` (sizes,
JPEG settings and pixels of the photos), ``objects`` (shapes and clutter
drawn on them), ``textures`` (random fields and surface textures),
``tiny`` (the 32x32 PNGs), ``palette`` (random streams, class colours).
"""

from fastdata.demo.generate import KINDS, SynthSummary, synthesize

__all__ = ["KINDS", "SynthSummary", "synthesize"]
