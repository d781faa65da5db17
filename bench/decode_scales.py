"""Per-image JPEG decode cost on one core: DCT scales and crop-region decoding.

Prints, for the demo photos (ImageNet-like sizes and qualities), the median
milliseconds per image of:

- a full decode with simplejpeg and with TurboJPEG 3;
- TurboJPEG decodes at every DCT scale M/8 (1/8 is almost all entropy
  decoding: its share of the full decode is the part no region or scale
  choice can remove, unless the file has restart markers);
- a random-resized crop to SIZE: the whole image decoded then cropped,
  resized and flipped (``fused=False``), against the crop region decoded
  alone (``fused=True``), with the same boxes;
- the same crop on the photos re-encoded at quality 90, without and with a
  restart marker per MCU (``fastdata pack --encoding jpeg --jpeg-restarts``):
  whole decode, region decode, and the restart-marker cut, which decodes the
  crop's MCUs only; with a libjpeg-turbo of 3.1 or later, also the original
  photos given restart markers losslessly (``--jpeg-restarts`` alone).

    python bench/decode_scales.py [--photos 300] [--size 224] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _photos(n: int) -> list[bytes]:
    from fastdata.demo.palette import class_palette, image_rng
    from fastdata.demo.photos import make_photo

    return [make_photo(image_rng(0, "photos", i), class_palette(0, "photos", i % 8))[0]
            for i in range(n)]


def _ms_per_image(fn, items, repeat: int) -> float:
    """Median over ``repeat`` passes of the mean milliseconds per item."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for i, item in enumerate(items):
            fn(i, item)
        times.append((time.perf_counter() - start) / len(items) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=300)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    import dataclasses

    import simplejpeg

    from fastdata.decoding import turbojpeg
    from fastdata.decoding.decode import DecoderChain
    from fastdata.decoding.random_crop import RandomResizedCrop
    from fastdata.bench.report import machine_info, machine_line

    if not turbojpeg.available():
        raise SystemExit(f"TurboJPEG 3 is not installed: {turbojpeg.INSTALL_HINT}")
    data = _photos(args.photos)
    infos = [turbojpeg.read_header(d) for d in data]
    print(machine_line(machine_info()))
    print(f"{len(data)} demo photos, {np.mean([len(d) for d in data]) / 1e3:.0f} kB and "
          f"{np.mean([i.width * i.height for i in infos]) / 1e3:.0f} kpixels on average; "
          f"TurboJPEG: {turbojpeg.library_path()}")

    def whole(i, d, eighths=8):
        info = infos[i]
        return turbojpeg.decode_region(d, info, (0, 0, info.width, info.height), eighths)

    full = _ms_per_image(lambda i, d: simplejpeg.decode_jpeg(d), data, args.repeat)
    print(f"full decode, simplejpeg:      {full:.3f} ms")
    tj_full = _ms_per_image(whole, data, args.repeat)
    print(f"full decode, TurboJPEG:       {tj_full:.3f} ms")
    for eighths in range(1, 8):
        ms = _ms_per_image(lambda i, d: whole(i, d, eighths), data, args.repeat)
        print(f"TurboJPEG at {eighths}/8:            {ms:.3f} ms ({ms / tj_full:.2f} of full)")

    fused = RandomResizedCrop(args.size)
    unfused = dataclasses.replace(fused, fused=False)
    chain = DecoderChain()
    counts = {}
    for i, info in enumerate(infos):
        box = fused.box(info.width, info.height, 0, 0, i)
        e = fused.eighths(box[2], box[3])
        counts[e] = counts.get(e, 0) + 1
    u = _ms_per_image(lambda i, d: unfused.decode(d, chain, 0, 0, i), data, args.repeat)
    f = _ms_per_image(lambda i, d: fused.decode(d, chain, 0, 0, i), data, args.repeat)
    scales = ", ".join(f"{n} at {e}/8" for e, n in sorted(counts.items()))
    print(f"random-resized crop to {args.size}: whole image then crop {u:.3f} ms, "
          f"crop region only {f:.3f} ms: {u / f:.2f}x ({scales})")
    _restart_rows(data, fused, unfused, chain, args.repeat)


def _restart_rows(data, fused, unfused, chain, repeat: int) -> None:
    """The crop on the photos re-encoded without and with restart markers."""
    from fastdata.decoding import turbojpeg
    from fastdata.decoding.decode import decode_rgb
    from fastdata.packers.preprocess import encode

    pixels = [decode_rgb(d) for d in data]
    plain = [encode(p, "jpeg", 90) for p in pixels]
    marked = [encode(p, "jpeg", 90, restarts=True) for p in pixels]
    sizes = (np.mean([len(d) for d in plain]), np.mean([len(d) for d in marked]))
    print(f"re-encoded at quality 90: {sizes[0] / 1e3:.1f} kB, with restart markers and "
          f"their index {sizes[1] / 1e3:.1f} kB (+{(sizes[1] / sizes[0] - 1) * 100:.1f}%)")
    _python_per_cut(marked, fused, repeat)
    rows = [("quality 90", plain), ("quality 90 + restarts", marked)]
    if turbojpeg.restarts_supported():
        from fastdata.decoding.jpeg_restarts import add_index

        rows.append(("original + lossless restarts",
                     [add_index(turbojpeg.add_restarts(d)) for d in data]))
    best_unfused = None
    for name, items in rows:
        u = _ms_per_image(lambda i, d: unfused.decode(d, chain, 0, 0, i), items, repeat)
        f = _ms_per_image(lambda i, d: fused.decode(d, chain, 0, 0, i), items, repeat)
        best_unfused = u if best_unfused is None else min(best_unfused, u)
        print(f"  {name:<30} whole image then crop {u:.3f} ms, fused {f:.3f} ms: "
              f"{u / f:.2f}x; against the best whole-image crop so far {best_unfused / f:.2f}x")


def _python_per_cut(marked: list[bytes], crop, repeat: int) -> None:
    """The Python part of a cut (it holds the GIL that the decode threads share)."""
    from fastdata.decoding.jpeg_restarts import cut, restart_layout

    layouts = [restart_layout(d) for d in marked]
    boxes = [crop.box(lay.width, lay.height, 0, 0, i)[:4] for i, lay in enumerate(layouts)]
    box_ms = _ms_per_image(lambda i, d: crop.box(layouts[i].width, layouts[i].height, 0, 0, i),
                           marked, repeat)
    cut_ms = _ms_per_image(lambda i, d: cut(d, restart_layout(d), boxes[i]), marked, repeat)
    print(f"  Python per cut (holding the GIL): drawing the box {box_ms * 1e3:.1f} us, "
          f"restart layout and cut {cut_ms * 1e3:.1f} us")


if __name__ == "__main__":
    main()
