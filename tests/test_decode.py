"""Decoder registry: every installed decoder gives the same pixels within the stated tolerance."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from fastdata.encodings import sniff_encoding
from fastdata.errors import FastDataError
from fastdata.decoding import decode as D
from fastdata.decoding.decoders import dct_factor

# Documented tolerance for JPEG across decoders (README, decode.py docstring).
JPEG_MEAN_TOL = 1.5
JPEG_MAX_TOL = 8


def _smooth_rgb(h=120, w=160):
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([(x * 1.5) % 256, (y * 2) % 256, (x + y) % 256], -1).astype(np.uint8)


def _encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _exif_rotated_jpeg() -> bytes:
    img = Image.fromarray(_smooth_rgb(60, 100))
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 CW to display
    return _encode(img, "JPEG", quality=92, exif=exif.tobytes())


RGB = _smooth_rgb()
CASES = {
    "jpeg": lambda: _encode(Image.fromarray(RGB), "JPEG", quality=90),
    "jpeg_gray": lambda: _encode(Image.fromarray(RGB[..., 0]), "JPEG", quality=90),
    "jpeg_cmyk": lambda: _encode(Image.fromarray(RGB).convert("CMYK"), "JPEG", quality=95),
    "jpeg_exif_rotated": _exif_rotated_jpeg,
    "png": lambda: _encode(Image.fromarray(RGB), "PNG"),
    "png_gray": lambda: _encode(Image.fromarray(RGB[..., 1]), "PNG"),
    "png_alpha": lambda: _encode(Image.fromarray(np.dstack([RGB, RGB[..., 0]])), "PNG"),
    "png_palette": lambda: _encode(Image.fromarray(RGB).convert("P"), "PNG"),
    "png_16bit": lambda: _encode(Image.fromarray(RGB[..., 0].astype(np.uint16) * 257), "PNG"),
    "png_gray_alpha": lambda: _encode(Image.fromarray(np.dstack([RGB[..., 0], RGB[..., 1]])),
                                      "PNG"),
    "gif": lambda: _encode(Image.fromarray(RGB).convert("P"), "GIF"),
    "webp_lossless": lambda: _encode(Image.fromarray(RGB), "WEBP", lossless=True),
    "bmp": lambda: _encode(Image.fromarray(RGB), "BMP"),
    "tiff": lambda: _encode(Image.fromarray(RGB), "TIFF"),
    "ppm": lambda: _encode(Image.fromarray(RGB), "PPM"),
}

INSTALLED = D.available_decoders()


def _diff(a: np.ndarray, b: np.ndarray) -> tuple[float, int]:
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return float(d.mean()), int(d.max())


def _pairs(cases):
    """(case, decoder) pairs where the decoder handles the case's encoding."""
    return [(c, n) for c in cases for n in INSTALLED
            if D.decoder_class(n)().handles(sniff_encoding(CASES[c]()))]


@pytest.mark.parametrize("case,name", _pairs(sorted(CASES)))
def test_decoders_agree_with_pillow(case, name):
    data = CASES[case]()
    encoding = sniff_encoding(data)
    dec = D.decoder_class(name)()
    ref = D.decoder_class("pil")().decode(data)
    try:
        out = dec.decode(data)
    except ValueError:
        # A decoder may refuse (simplejpeg: CMYK); the auto chain then falls back.
        assert case == "jpeg_cmyk" and name == "simplejpeg"
        out = D.decode_rgb(data)
    assert out.dtype == np.uint8 and out.ndim == 3 and out.shape[2] == 3
    assert out.flags.c_contiguous and out.flags.writeable
    assert out.shape == ref.shape
    mean, worst = _diff(out, ref)
    if encoding == "jpeg":
        assert mean <= JPEG_MEAN_TOL and worst <= JPEG_MAX_TOL, (mean, worst)
    else:
        assert worst == 0, (mean, worst)  # lossless: identical


def test_pillow_matches_plain_pil_convert():
    data = CASES["png_palette"]()
    expected = np.array(Image.open(io.BytesIO(data)).convert("RGB"))
    assert np.array_equal(D.decode_rgb(data, decoder="pil"), expected)


def test_16bit_keeps_high_byte():
    data = CASES["png_16bit"]()
    out = D.decode_rgb(data, decoder="pil")
    assert np.array_equal(out[..., 0], RGB[..., 0])


@pytest.mark.parametrize("name", INSTALLED)
def test_exif_orientation_is_ignored(name):
    data = _exif_rotated_jpeg()
    out = D.decoder_class(name)().decode(data)
    assert out.shape[:2] == (60, 100)  # stored size, not the displayed (rotated) one


@pytest.mark.parametrize("case,name", _pairs(["jpeg_gray", "png_gray", "png_16bit"]))
def test_keep_gray_gives_one_channel(case, name):
    data = CASES[case]()
    dec = D.decoder_class(name)()
    out = dec.decode(data, keep_gray=True)
    assert out.shape == (120, 160, 1)
    color = D.decode_rgb(CASES["png"](), keep_gray=True)
    assert color.shape[2] == 3


@pytest.mark.parametrize("size,expected", [
    (60, (60, 80)), ((50, 70), (50, 70)), (200, (200, 266)), (30, (30, 40)),
])
@pytest.mark.parametrize("name", INSTALLED)
def test_size_outputs_and_agreement(name, size, expected):
    data = CASES["jpeg"]()
    out = D.decoder_class(name)().decode(data, size=size)
    assert out.shape == (*expected, 3)
    ref = D.decoder_class("pil")().decode(data, size=size)
    mean, worst = _diff(out, ref)
    assert mean <= JPEG_MEAN_TOL, (mean, worst)


def test_size_of_portrait_image_follows_torchvision_rule():
    data = _encode(Image.fromarray(_smooth_rgb(160, 120)), "PNG")
    assert D.decode_rgb(data, size=60).shape == (80, 60, 3)
    assert D.target_size(375, 500, 224) == (224, 298)  # int(224 * 500 / 375)


def test_dct_factor_never_goes_below_target():
    assert dct_factor(400, 600, (224, 336)) == 1
    assert dct_factor(1000, 1000, (224, 224)) == 4
    assert dct_factor(512, 512, (64, 64)) == 8


def test_unknown_decoder_is_a_clear_error():
    with pytest.raises(FastDataError, match="unknown decoder 'nope'"):
        D.DecoderChain("nope")


def test_missing_decoder_names_the_package(monkeypatch):
    monkeypatch.setitem(D._unusable, "jpeg4py", "not installed")
    with pytest.raises(FastDataError, match="pip install jpeg4py"):
        D.DecoderChain("jpeg4py")


def test_auto_falls_back_to_pillow_and_raises_for_garbage():
    assert D.decode_rgb(CASES["gif"]()).shape == (120, 160, 3)
    with pytest.raises(Exception):
        D.decode_rgb(b"\xff\xd8\xff" + b"\x00" * 100)


def test_raw_decoding_and_resize():
    chain = D.DecoderChain(raw_shape=(4, 6, 3))
    pixels = np.arange(72, dtype=np.uint8).reshape(4, 6, 3)
    out = chain(pixels.tobytes())
    assert np.array_equal(out, pixels) and out.flags.writeable
    assert D.DecoderChain(raw_shape=(4, 6, 3), size=(2, 3))(pixels.tobytes()).shape == (2, 3, 3)
    with pytest.raises(ValueError, match="raw record holds"):
        chain(b"123")
