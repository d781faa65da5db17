"""Runs made to be bound by one stage each: the stall meter names that stage
(``fastdata.stats(loader)["bound"]``) and its line of advice names the option
documented for it, an option that exists.

The runs are small versions of ``bench/stall_bounds.py``'s, sized so that the
bound is not a close call on a busy 2-core machine: the training loop takes
each batch as soon as it comes (no stand-in step), so the producers never wait
for it, and each batch costs its stage several milliseconds. A server on
127.0.0.1 that holds each request 50 ms is the slow remote. What the advised
option then does to the data wait is measured by the bench, never asserted
here. torch runs one intra-op thread in these tests: with two on a busy 2-core
machine, a batch's float conversion can stall for milliseconds and the meter
would rightly name ``convert`` instead.
"""

from __future__ import annotations

import os

import click
import pytest
import torch
from conftest import no_hang
from servers import http_site

import fastdata
from fastdata.packers.preprocess import Preprocess

ORDER = fastdata.Order(shuffle=True, seed=0, batch_size=32)


@pytest.fixture(autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """64 generated photos, each 4 times (hard links): 256 records' sources."""
    from fastdata.demo import synthesize

    root = tmp_path_factory.mktemp("bounds")
    synthesize(str(root / "synth"), kind="photos", n=64, seed=0, progress=False)
    src = root / "src"
    for folder in sorted((root / "synth").iterdir()):
        (src / folder.name).mkdir(parents=True)
        for image in sorted(folder.iterdir()):
            for k in range(4):
                os.link(image, src / folder.name / f"{k}-{image.name}")
    return src


@pytest.fixture(scope="module")
def raw224(photos, tmp_path_factory):
    """The photos as 224x224 raw pixels (nothing to decode), in LMDB."""
    out = tmp_path_factory.mktemp("raw") / "raw.lmdb"
    options = fastdata.PackOptions(preprocess=Preprocess(resize=224, center_crop=True,
                                                         encoding="raw"))
    return fastdata.pack(photos, out, options=options, progress=False).output


def one_pass(loader) -> dict:
    """The meter's figures after one pass, the loop taking each batch at once."""
    for _images, _labels in loader:
        pass
    return fastdata.stats(loader)


def pack_has(option: str) -> bool:
    from fastdata.cli import main

    command = main.commands["pack"]
    return any(option in p.opts for p in command.get_params(click.Context(command)))


def test_a_stream_from_a_slow_server_is_fetch_bound(tmp_path, monkeypatch):
    from fastdata.demo import synthesize

    synthesize(str(tmp_path / "src"), kind="tiny", n=512, seed=0, progress=False)
    www = tmp_path / "www"
    www.mkdir()
    fastdata.pack(tmp_path / "src", www / "d-%06d.tar",
                  options=fastdata.PackOptions(shard_size=8), progress=False)
    with http_site(www, monkeypatch, tmp_path / "cache") as server, no_hang(60):
        server.server.delay = 0.05                 # each request waits 50 ms
        url = f"{server.url}/d.tar.fastdata.json"
        figures = one_pass(fastdata.loader(fastdata.open_dataset(url, streaming=True,
                                                                 order=ORDER)))
        assert figures["bound"] == "fetch", figures
        assert figures["requests"]["count"] > 0
        assert "read_ahead=16" in figures["advice"], figures["advice"]
        # The advised option is one a stream takes.
        ahead = fastdata.open_dataset(url, streaming=True, order=ORDER, read_ahead=16)
        _images, labels = next(iter(fastdata.loader(ahead)))
        assert len(labels) == 32


def test_large_photos_on_one_decode_thread_are_decode_bound(photos, tmp_path):
    path = fastdata.pack(photos, tmp_path / "photos.lmdb", progress=False).output
    ds = fastdata.open_dataset(path, decode=fastdata.Decode(size=(224, 224)),
                               decode_threads=1, order=ORDER)
    with no_hang(60):
        figures = one_pass(fastdata.loader(ds, num_workers=0))
    assert figures["bound"] == "decode", figures
    assert "fastdata pack --resize" in figures["advice"], figures["advice"]
    assert pack_has("--resize")


def to_float(image):
    """A per-sample transform that makes a float32 tensor."""
    return image.float().div_(255)


def test_a_float_transform_in_a_worker_is_collate_bound(raw224):
    ds = fastdata.open_dataset(raw224, transform=to_float, order=ORDER)
    with no_hang(60):
        figures = one_pass(fastdata.loader(ds, num_workers=1))
    assert figures["bound"] == "collate", figures
    advice = figures["advice"]
    assert "no per-sample transform that makes floats" in advice, advice
    assert "mean/std to fastdata.loader()" in advice, advice
    # The advised way: uint8 stacked by fastdata, normalised by the loader.
    plain = fastdata.open_dataset(raw224, order=ORDER)
    with no_hang(60):
        images, _labels = next(iter(fastdata.loader(plain, num_workers=0,
                                                    mean=(0.5, 0.5, 0.5),
                                                    std=(0.25, 0.25, 0.25))))
    assert images.dtype == torch.float32 and images.shape == (32, 3, 224, 224)


def drop_pages(folder) -> None:
    """Best effort: the dataset's pages out of the page cache (its files only)."""
    for name in os.listdir(folder):
        fd = os.open(os.path.join(folder, name), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def test_reading_records_and_nothing_else_is_read_bound(raw224):
    # The stored bytes, undecoded: reading (and checking) each record is the
    # loader's only work, whether the pages are in the page cache or not. In
    # batches of 128 (19 MB), so that the hand-over between batches is small
    # beside a batch's reading even when the cores are busy.
    drop_pages(raw224)
    ds = fastdata.open_dataset(raw224, decode=fastdata.Decode(output="bytes"),
                               order=fastdata.Order(shuffle=True, seed=0, batch_size=128))
    with no_hang(60):
        figures = one_pass(fastdata.loader(ds, num_workers=0))
    assert figures["bound"] == "read", figures
    assert "cache='ram'" in figures["advice"], figures["advice"]
    cached = fastdata.open_dataset(raw224, cache="ram", progress=False, order=ORDER)
    with no_hang(60):
        figures = one_pass(fastdata.loader(cached, num_workers=0))
    assert figures["cache"]["ram_records"] == len(cached)
