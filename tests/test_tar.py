"""Tests of the tar shard format: writer, reader, webdataset interop, streaming dataset."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import fastdata
from fastdata import Decode, Order
from fastdata.cli import main
from fastdata.packers.pack import PackSummary
from fastdata.errors import CorruptDataError, FastDataError, ManifestError
from fastdata.formats.tar.members import iter_members, split_key
from fastdata.formats.tar.reader import TarReader
from fastdata.formats.tar.schema import member_header, sample_stem, split_name, ustar_header
from fastdata.ops.verify import verify_dataset

from conftest import build_tree, expected_chw, make_image_bytes, uniform_spec

IMAGE_EXTS = "jpg;jpeg;png;webp;bmp;ppm;pgm;tif;tiff;gif"

# webdataset 1.0.2 leaves shard files to the garbage collector and warns about
# API details; neither is what these tests are about.
pytestmark = [pytest.mark.filterwarnings("ignore::ResourceWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:.*shardshuffle.*:UserWarning")]


def pack(src, out, **options) -> PackSummary:
    return fastdata.pack(src, out, options=fastdata.PackOptions(**options), progress=False)


def shard_files(summary_or_manifest) -> list[Path]:
    path = Path(getattr(summary_or_manifest, "output", summary_or_manifest))
    manifest = json.loads(path.read_text())
    return [path.parent / s["path"] for s in manifest["shards"]]


@pytest.fixture
def small_tree(tmp_path):
    """12 images, 3 classes, 16x16 (equal sizes so tensors collate)."""
    return build_tree(tmp_path / "small", uniform_spec(per_class=4), size=(16, 16))


@pytest.fixture
def sharded(small_tree, tmp_path):
    """small_tree packed into 4 shards of 3 records."""
    return pack(small_tree.root, tmp_path / "out" / "ds.tar", shard_size=3)


def webdataset_shards(folder: Path, n: int = 10, per_shard: int = 4, *, cls: bool = True,
                      seed: int = 0) -> tuple[list[Path], list[tuple[str, bytes, int]]]:
    """Shards written by webdataset's own ShardWriter: (paths, [(key, png, label)])."""
    import webdataset as wds

    folder.mkdir(parents=True, exist_ok=True)
    samples = []
    with wds.ShardWriter(str(folder / "wds-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i in range(n):
            data = make_image_bytes(".png", size=(8, 8), seed=seed, name=f"w{i}")
            key, label = f"sample{i:04d}", i % 3
            sample = {"__key__": key, "png": data, "txt": f"caption {i}"}
            if cls:
                sample["cls"] = label
            sink.write(sample)
            samples.append((key, data, label))
    return sorted(folder.glob("wds-*.tar")), samples


# -- round trip ------------------------------------------------------------------


@pytest.mark.parametrize("ext", [".tar", ".tfrecord"])
def test_one_shard_of_a_set_opens_with_the_sets_classes_and_keys(small_tree, tmp_path, ext):
    out = tmp_path / "out" / f"ds-%06d{ext}"
    summary = pack(small_tree.root, out, shard_size=5)  # shards of 5, 5 and 2
    whole = fastdata.open_dataset(summary.output, decode=Decode(output="bytes"))
    names = [s["path"] for s in whole.manifest.shards]
    one = fastdata.open_dataset(out.parent / names[1], decode=Decode(output="bytes"))
    assert len(one) == 5 and one.classes == whole.classes
    assert one.keys == whole.keys[5:10] and one.targets == whole.targets[5:10]
    assert [one[i] for i in range(5)] == [whole[i] for i in range(5, 10)]
    assert one.manifest.extra["shard_of"] == os.path.basename(summary.output)
    stream = fastdata.ShardedIterableDataset(out.parent / names[1], decode=Decode(output="bytes"))
    assert list(stream) == [whole[i] for i in range(5, 10)]
    assert verify_dataset(out.parent / names[1], progress=False).ok
    result = CliRunner().invoke(main, ["info", str(out.parent / names[1])])
    assert f"one shard of {os.path.basename(summary.output)}" in result.output


def test_a_stream_has_the_keys_targets_and_classes_of_a_map_style_dataset(sharded):
    stream = fastdata.ShardedIterableDataset(sharded.output)
    with fastdata.open_dataset(sharded.output) as ds:
        assert stream.keys == ds.keys and stream.targets == ds.targets
        assert stream.classes == ds.classes and stream.class_to_idx == ds.class_to_idx


def test_round_trip_several_shards(image_tree, tmp_path):
    summary = pack(image_tree.root, tmp_path / "out" / "ds.tar", shard_size=3)
    assert summary.format == "tar"
    assert summary.output == str(tmp_path / "out" / "ds.tar.fastdata.json")
    assert summary.records == len(image_tree)
    shards = shard_files(summary)
    assert [p.name for p in shards] == [f"ds-{i:06d}.tar" for i in range(6)]  # 16 records / 3
    with TarReader(summary.output) as reader:
        assert len(reader) == len(image_tree)
        assert reader.keys == image_tree.keys
        assert reader.labels.tolist() == image_tree.labels
        assert reader.classes == image_tree.classes
        for i, sample in enumerate(image_tree.samples):
            assert reader.read(i) == sample.data
        assert reader.read_many([15, 0, 5]) == [image_tree.payloads[i] for i in (15, 0, 5)]
        assert [(i, d, lab) for i, d, lab in reader] == [
            (i, s.data, s.label) for i, s in enumerate(image_tree.samples)]
        assert [c for _, c in reader.shard_ranges()] == [3, 3, 3, 3, 3, 1]
    manifest = fastdata.formats.read_manifest(summary.output)
    assert manifest.format == "tar" and manifest.count == len(image_tree)
    assert sum(s["count"] for s in manifest.shards) == len(image_tree)
    assert manifest.extra["member_schema"] == "webdataset-1"


def test_tar_dataset_map_style(image_tree, tmp_path):
    out = pack(image_tree.root, tmp_path / "ds.tar", shard_size=4).output
    ds = fastdata.open_dataset(out)
    assert isinstance(ds, fastdata.TarDataset)
    assert ds.classes == image_tree.classes and ds.targets == image_tree.labels
    for i in (0, 7, len(image_tree) - 1):
        image, label = ds[i]
        assert label == image_tree.labels[i]
        assert np.array_equal(image.numpy(), expected_chw(image_tree.payloads[i]))
    raw = fastdata.TarDataset(out, decode=Decode(output="bytes"))
    assert raw.__getitems__([3, 1]) == [(image_tree.payloads[i], image_tree.labels[i])
                                       for i in (3, 1)]


def test_single_file_without_shard_size(small_tree, tmp_path):
    summary = pack(small_tree.root, tmp_path / "one.tar")
    assert [p.name for p in shard_files(summary)] == ["one.tar"]
    with TarReader(tmp_path / "one.tar") as reader:  # the shard path finds its manifest
        assert reader.manifest.extra.get("foreign") is None
        assert [reader.read(i) for i in range(len(reader))] == small_tree.payloads


@pytest.mark.parametrize("pattern, names", [
    ("out-%06d.tar", ["out-000000.tar", "out-000001.tar", "out-000002.tar", "out-000003.tar"]),
    ("out-{000000..000009}.tar", ["out-000000.tar", "out-000001.tar", "out-000002.tar",
                                  "out-000003.tar"]),
    ("shard_%03d.tar", ["shard_000.tar", "shard_001.tar", "shard_002.tar", "shard_003.tar"]),
])
def test_output_patterns(small_tree, tmp_path, pattern, names):
    summary = pack(small_tree.root, tmp_path / "p" / pattern, shard_size=3)
    assert [p.name for p in shard_files(summary)] == names
    assert all(p.is_file() for p in shard_files(summary))
    # The pattern itself opens the dataset, through its manifest.
    with TarReader(tmp_path / "p" / pattern) as reader:
        assert reader.keys == small_tree.keys
        assert [reader.read(i) for i in range(len(reader))] == small_tree.payloads


def test_brace_pattern_without_manifest_names_exact_shards(sharded, small_tree, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for p in shard_files(sharded):
        shutil.copy(p, bare / p.name)
    with TarReader(bare / "ds-{000000..000003}.tar") as reader:  # scanned: no manifest here
        assert reader.manifest.extra["foreign"] is True
        assert [reader.read(i) for i in range(len(reader))] == small_tree.payloads
        assert reader.labels.tolist() == small_tree.labels
    with pytest.raises(ManifestError, match="missing"):
        TarReader(bare / "ds-{000000..000005}.tar")


def test_byte_shard_size_counts_tar_framing(small_tree, tmp_path):
    summary = pack(small_tree.root, tmp_path / "b" / "ds.tar", shard_size="6KB")
    shards = shard_files(summary)
    assert len(shards) > 1
    for p in shards:
        # Each 16x16 image plus its .cls takes 2-3 KiB on disk; the two end
        # blocks come on top of the limit.
        assert p.stat().st_size <= 6000 + 1024, p


def test_write_json_member(small_tree, tmp_path):
    summary = pack(small_tree.root, tmp_path / "j" / "ds.tar",
                   writer_options={"write_json": True})
    with tarfile.open(shard_files(summary)[0]) as tar:
        names = tar.getnames()
        meta = json.loads(tar.extractfile(names[2]).read())
    assert names[:3] == ["cat/img000.png", "cat/img000.cls", "cat/img000.json"]
    assert meta == {"key": "cat/img000.png", "label": 0}
    # Without .cls members the json label is used when scanning.
    with TarReader(shard_files(summary)) as reader:
        assert reader.labels.tolist() == small_tree.labels


@pytest.mark.parametrize("encoding, ext", [("png", "png"), ("jpeg", "jpg"), ("raw", "raw")])
def test_member_extension_follows_pack_time_encoding(small_tree, tmp_path, encoding, ext):
    from fastdata.packers.preprocess import Preprocess

    options = dict(preprocess=Preprocess(encoding=encoding, resize=8))
    summary = pack(small_tree.root, tmp_path / f"{encoding}.tar", **options)
    with tarfile.open(shard_files(summary)[0]) as tar:
        images = [n for n in tar.getnames() if not n.endswith(".cls")]
    assert images == [f"{k.rsplit('.', 1)[0]}.{ext}" for k in small_tree.keys]
    image, label = fastdata.open_dataset(summary.output)[5]
    assert tuple(image.shape) == (3, 8, 8) and label == small_tree.labels[5]


def test_source_extensions_writes_the_shards_earlier_versions_wrote(tmp_path):
    """``source_extensions=True`` keeps the source's spelling (``b.v2.jpeg`` ->
    ``bee/b_v2.jpeg``): the golden source packs to the very shards an earlier
    fastdata wrote (tests/legacy_names/tar); by default that member is
    ``bee/b_v2.jpg``. Both read back through the index, and as a scanned tar."""
    here = Path(__file__).parent
    legacy = here / "legacy_names" / "tar"
    kept = pack(here / "golden" / "src", tmp_path / "kept" / "old-%06d.tar", shard_size=5,
                workers=1, writer_options={"source_extensions": True})
    plain = pack(here / "golden" / "src", tmp_path / "plain" / "old-%06d.tar", shard_size=5,
                 workers=1)
    assert [p.read_bytes() for p in shard_files(kept)] == [
        (legacy / f"old-{n:06d}.tar").read_bytes() for n in range(3)]
    with tarfile.open(shard_files(plain)[0]) as tar:
        assert "bee/b_v2.jpg" in tar.getnames() and "bee/b_v2.jpeg" not in tar.getnames()
    assert json.loads(Path(kept.output).read_text())["pack_options"]["source_extensions"]
    assert "source_extensions" not in json.loads(Path(plain.output).read_text())["pack_options"]
    read = []
    for path in (kept.output, plain.output, legacy / "old.fastdata.json"):
        ds = fastdata.open_dataset(path, decode=Decode(output="bytes"))
        read.append((ds.keys, [ds[i] for i in range(len(ds))]))
    assert read[0] == read[1] == read[2]
    for summary in (kept, plain):
        with TarReader(shard_files(summary)) as scanned:  # no index: the members' names
            assert [scanned.read(i) for i in range(len(scanned))] == [d for d, _ in read[0][1]]


# -- the tar bytes themselves ----------------------------------------------------------


def test_plain_ustar_headers(sharded, small_tree):
    expected_names = []
    for key, label in zip(small_tree.keys, small_tree.labels):
        stem, ext = key.rsplit(".", 1)
        ext = {"jpeg": "jpg", "tif": "tiff"}.get(ext.lower(), ext.lower())  # one per encoding
        expected_names += [f"{stem}.{ext}", f"{stem}.cls"]
    names, pos = [], 0
    for shard in shard_files(sharded):
        data = shard.read_bytes()
        with tarfile.open(shard) as tar:
            members = tar.getmembers()
        for m in members:
            assert m.pax_headers == {}, m.name  # no PAX for short ASCII names
            assert (m.mtime, m.mode, m.uid, m.gid, m.uname, m.gname) == (0, 0o444, 0, 0, "", "")
            assert m.isreg()
            names.append(m.name)
        # Exactly one 512-byte header per member, data padded to 512, two end blocks.
        expected_size = sum(512 + -(-m.size // 512) * 512 for m in members) + 1024
        assert len(data) == expected_size
        assert data[-1024:] == bytes(1024)
        assert data[257:265] == b"ustar\x0000"
        with tarfile.open(shard) as tar:
            cls = [tar.extractfile(m).read() for m in members if m.name.endswith(".cls")]
        assert cls == [str(lab).encode() for lab in small_tree.labels[pos:pos + len(cls)]]
        pos += len(cls)
    assert names == expected_names


def test_reproducible_bytes(small_tree, tmp_path):
    a = pack(small_tree.root, tmp_path / "a" / "ds.tar", shard_size=5)
    b = pack(small_tree.root, tmp_path / "b" / "ds.tar", shard_size=5)
    assert [p.read_bytes() for p in shard_files(a)] == [p.read_bytes() for p in shard_files(b)]


def test_header_helpers_match_tarfile():
    header = ustar_header(b"dir/name.jpg", 1234)
    info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")  # checks the checksum
    assert (info.name, info.size, info.mode, info.mtime) == ("dir/name.jpg", 1234, 0o444, 0)
    long_name = "/".join(["d" * 60, "e" * 60, "img.jpg"])
    prefix, name = split_name(long_name.encode())
    assert prefix + b"/" + name == long_name.encode() and len(prefix) <= 155 and len(name) <= 100
    info = tarfile.TarInfo.frombuf(ustar_header(name, 5, prefix=prefix), "utf-8", "strict")
    assert info.name == long_name
    assert split_name(("x" * 120).encode()) is None
    assert len(member_header(long_name, 5)) == 512
    assert len(member_header("x" * 120 + ".jpg", 5)) > 512  # needs a PAX header


@pytest.mark.parametrize("key, stem", [
    ("cat/img_001.jpg", "cat/img_001"),
    ("cat/img.v2.final.JPG", "cat/img_v2_final"),
    ("a.b/c/d.e.png", "a.b/c/d_e"),  # dots in folders are fine for webdataset
    ("noext", "noext"),
])
def test_sample_stem(key, stem):
    assert sample_stem(key) == stem
    assert split_key(f"{sample_stem(key)}.png") == (stem, "png")


def test_colliding_stems_get_suffixes(tmp_path):
    tree = build_tree(tmp_path / "src", ("c/a.jpg", "c/a.png", "c/a.b.png", "c/a_b.png"))
    summary = pack(tree.root, tmp_path / "ds.tar")
    with tarfile.open(shard_files(summary)[0]) as tar:
        images = [n for n in tar.getnames() if not n.endswith(".cls")]
    assert images == ["c/a_b.png", "c/a.jpg", "c/a_1.png", "c/a_b_1.png"]
    with TarReader(summary.output) as reader:
        assert reader.keys == tree.keys
        assert [reader.read(i) for i in range(4)] == tree.payloads


def test_renamed_member_keys_are_reported(tmp_path):
    tree = build_tree(tmp_path / "src", ("a/china.jpg", "a/china.bmp", "a/x.y.png", "b/ok.png"))
    summary = pack(tree.root, tmp_path / "out" / "ds.tar")
    # "a/china.bmp" sorts first and keeps "a/china"; ".jpg" clashes with it.
    expected = [("a/china.jpg", "a/china_1", "ds.tar"), ("a/x.y.png", "a/x_y", "ds.tar")]
    assert [(r.key, r.stored_as, r.file) for r in summary.renamed] == expected
    assert "'a/china' was taken by 'a/china.bmp'" in summary.renamed[0].reason
    assert "'.' in the file name" in summary.renamed[1].reason
    # The report file is written for the renames alone (no skips, no warnings).
    assert summary.report == str(tmp_path / "out" / "ds.tar.report.json")
    report = json.loads(Path(summary.report).read_text())
    assert [(r["key"], r["stored_as"], r["file"]) for r in report["renamed"]] == expected
    assert report["skipped"] == [] and report["warnings"] == []
    assert summary.to_dict()["renamed"] == report["renamed"]
    with tarfile.open(shard_files(summary)[0]) as tar:
        assert [n for n in tar.getnames() if not n.endswith(".cls")] == [
            "a/china.bmp", "a/china_1.jpg", "a/x_y.png", "b/ok.png"]
    # The dataset's keys stay the source's (keys.json).
    ds = fastdata.open_dataset(summary.output, decode=Decode(output="bytes"))
    assert ds.keys == tree.keys == ["a/china.bmp", "a/china.jpg", "a/x.y.png", "b/ok.png"]
    assert [ds[i] for i in range(len(ds))] == [(s.data, s.label) for s in tree.samples]


def test_renames_name_their_shard_and_clashes_are_per_shard(tmp_path):
    tree = build_tree(tmp_path / "src", ("a/china.jpg", "a/china.bmp", "a/x.y.png"))
    summary = pack(tree.root, tmp_path / "out" / "ds-%06d.tar", shard_size=1)
    # One record per shard: no clash, only the dotted name is stored otherwise.
    assert [(r.key, r.stored_as, r.file) for r in summary.renamed] == [
        ("a/x.y.png", "a/x_y", "ds-000002.tar")]
    assert summary.report == str(tmp_path / "out" / "ds.tar.report.json")
    plain = pack(tree.root, tmp_path / "lmdb" / "ds.lmdb")
    assert plain.renamed == [] and plain.report is None  # other formats keep keys as they are


def test_long_keys_round_trip(tmp_path):
    deep = "/".join(["d" * 50, "e" * 50, "f" * 40]) + "/img.png"  # > 100: prefix/name split
    flat = "g" * 150 + ".jpg"                                      # one 154-byte name: PAX
    tree = build_tree(tmp_path / "src", (f"cls/{deep}", f"cls/{flat}", "cls/short.png"))
    assert sum(len(k) > 100 for k in tree.keys) == 2
    summary = pack(tree.root, tmp_path / "out" / "ds.tar")
    shard = shard_files(summary)[0]
    with tarfile.open(shard) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert f"cls/{deep[:-4]}.png" in members and members[f"cls/{deep[:-4]}.png"].pax_headers == {}
    assert members[f"cls/{flat[:-4]}.jpg"].pax_headers  # the fallback
    with TarReader(summary.output) as reader:
        assert reader.keys == tree.keys
        assert [reader.read(i) for i in range(3)] == tree.payloads
    with TarReader([shard]) as scanned:  # our own header parser, PAX included
        assert scanned.keys == [k.rsplit(".", 1)[0] for k in tree.keys]
        assert [scanned.read(i) for i in range(3)] == tree.payloads


# -- webdataset interop ----------------------------------------------------------------


@pytest.mark.parametrize("source_extensions", [False, True])
def test_webdataset_reads_our_shards(image_tree, tmp_path, source_extensions):
    import webdataset as wds

    from fastdata.encodings import ENCODING_EXTENSIONS, sniff_encoding

    summary = pack(image_tree.root, tmp_path / "wd" / "ds.tar", shard_size=4,
                   writer_options={"source_extensions": True} if source_extensions else {})
    urls = [str(p) for p in shard_files(summary)]
    samples = list(wds.WebDataset(urls, shardshuffle=False))
    assert [s["__key__"] for s in samples] == [sample_stem(k) for k in image_tree.keys]
    for s, expected in zip(samples, image_tree.samples):
        # One extension per encoding (IMG1.JPEG -> jpg, B4.TIFF -> tiff), or the
        # source's own, lower-cased.
        ext = (expected.key.rsplit(".", 1)[1].lower() if source_extensions
               else ENCODING_EXTENSIONS[sniff_encoding(expected.data)])
        assert s[ext] == expected.data
        assert int(s["cls"]) == expected.label
    tuples = list(wds.WebDataset(urls, shardshuffle=False).decode().to_tuple(IMAGE_EXTS, "cls"))
    assert [(d, c) for d, c in tuples] == [(s.data, s.label) for s in image_tree.samples]
    decoded = list(wds.WebDataset(urls, shardshuffle=False).decode("rgb8")
                   .to_tuple(IMAGE_EXTS, "cls"))
    assert np.array_equal(decoded[0][0].transpose(2, 0, 1), expected_chw(image_tree.payloads[0]))


def test_we_read_webdataset_shards(tmp_path):
    paths, samples = webdataset_shards(tmp_path / "wds", n=10, per_shard=4)
    assert len(paths) == 3
    with tarfile.open(paths[0]) as tar:
        assert any(m.pax_headers for m in tar.getmembers())  # webdataset writes PAX
    with TarReader([str(p) for p in paths]) as reader:
        assert len(reader) == 10
        assert reader.keys == [k for k, _, _ in samples]
        assert reader.labels.tolist() == [lab for _, _, lab in samples]
        assert [reader.read(i) for i in range(10)] == [d for _, d, _ in samples]
        assert [d for _, d, _ in reader] == [d for _, d, _ in samples]
        assert reader.classes == ["0", "1", "2"]
    with TarReader(tmp_path / "wds" / "wds-%06d.tar") as reader:  # a pattern finds them too
        assert len(reader) == 10
    ds = fastdata.ShardedIterableDataset([str(p) for p in paths], decode=Decode(output="bytes"))
    assert [(d, lab) for d, lab in ds] == [(d, lab) for _, d, lab in samples]


def test_we_read_gnu_and_pax_tars_from_tarfile(tmp_path):
    long_key = "k" * 120
    data = [make_image_bytes(".jpg", size=(8, 8), name=str(i)) for i in range(3)]
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        path = tmp_path / f"t{fmt}.tar"
        with tarfile.open(path, "w", format=fmt) as tar:
            for i, (key, d) in enumerate(zip([long_key, "dir.x/short", "ünï"], data)):
                for ext, payload in (("jpg", d), ("cls", str(i).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
            tar.addfile(tarfile.TarInfo("a_directory"))  # no dot: not part of any sample
        with TarReader([path]) as reader:
            assert reader.keys == [long_key, "dir.x/short", "ünï"]
            assert [reader.read(i) for i in range(3)] == data
            assert reader.labels.tolist() == [0, 1, 2]
    with tarfile.open(tmp_path / f"t{tarfile.GNU_FORMAT}.tar") as tar:
        assert tar.getmembers()[0].name == f"{long_key}.jpg"


def test_member_iteration_order_and_offsets(sharded):
    shard = shard_files(sharded)[0]
    raw = shard.read_bytes()
    with tarfile.open(shard) as tar:
        expected = [(m.name, m.offset_data, m.size) for m in tar.getmembers()]
    got = [(m.name, m.offset, m.size) for m in iter_members(str(shard))]
    assert got == expected
    assert raw[got[0][1]:got[0][1] + got[0][2]].startswith(b"\x89PNG")


def test_sample_without_label_is_an_error(tmp_path):
    paths, _ = webdataset_shards(tmp_path / "nolabel", n=3, per_shard=10, cls=False)
    with pytest.raises(FastDataError, match="no label") as err:
        TarReader(paths)
    assert err.value.path == str(paths[0]) and err.value.key == "sample0000"
    assert ".cls" in str(err.value)


def test_tar_of_an_image_folder_says_to_pack_the_folder(tmp_path):
    # `tar cf images.tar images/`: class folders of images, no .cls members.
    tree = build_tree(tmp_path / "images", uniform_spec(("cat", "dog"), per_class=2))
    path = tmp_path / "images.tar"
    with tarfile.open(path, "w") as tar:
        tar.add(tree.root, arcname="images")
    for open_it in (fastdata.open_dataset, fastdata.TarDataset):
        with pytest.raises(FastDataError, match="no label") as err:
            open_it(path)
        message = str(err.value)
        assert ".cls" in message and "fastdata pack FOLDER out.tar" in message, message
        assert "convert" not in message and "\n" not in message
    result = CliRunner().invoke(main, ["info", str(path)])
    assert result.exit_code == 1
    assert "fastdata pack FOLDER out.tar" in result.stderr, result.stderr


def test_sample_without_image_is_an_error(tmp_path):
    path = tmp_path / "noimg.tar"
    with tarfile.open(path, "w") as tar:
        for name, payload in (("s0.txt", b"hello"), ("s0.cls", b"1")):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    with pytest.raises(FastDataError, match="no image member") as err:
        TarReader([path])
    assert err.value.key == "s0"


# -- damage ---------------------------------------------------------------------------


def test_truncated_shard_with_manifest(sharded):
    shard = shard_files(sharded)[1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    reader = TarReader(sharded.output)  # the records past the cut are refused when read
    first, count = reader.shard_ranges()[1]
    with pytest.raises(CorruptDataError, match="truncated") as err:
        reader.read(first + count - 1)
    assert err.value.path == str(shard)


@pytest.mark.parametrize("cut", ["mid_member", "member_boundary", "mid_header"])
def test_truncated_foreign_shard(tmp_path, cut):
    paths, _ = webdataset_shards(tmp_path / "w", n=4, per_shard=10)
    path = paths[0]
    members = list(iter_members(str(path)))
    data = path.read_bytes()
    if cut == "mid_member":
        end = members[3].offset + members[3].size // 2
    elif cut == "member_boundary":
        m = members[-1]
        end = m.offset + m.size + (-m.size % 512)  # the end-of-archive blocks are gone
    else:
        end = members[5].offset - 512 + 100
    path.write_bytes(data[:end])
    with pytest.raises(CorruptDataError) as err:
        TarReader([path])
    assert err.value.path == str(path)
    assert err.value.offset is not None
    assert "truncated" in err.value.message


def test_corrupted_header_names_shard_and_offset(tmp_path):
    paths, _ = webdataset_shards(tmp_path / "w", n=4, per_shard=10)
    path = paths[0]
    members = list(iter_members(str(path)))
    header_at = members[2].offset - 512
    data = bytearray(path.read_bytes())
    data[header_at + 3] ^= 0x55  # inside the name field
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptDataError, match="checksum") as err:
        TarReader([path])
    assert (err.value.path, err.value.offset) == (str(path), header_at)
    assert str(err.value).startswith(f"{path}: byte offset {header_at}: tar header fails")


def test_garbage_file_is_not_a_hang(tmp_path):
    path = tmp_path / "junk.tar"
    path.write_bytes(os.urandom(5000))
    with pytest.raises(CorruptDataError):
        TarReader([path])
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    with pytest.raises(CorruptDataError, match="truncated"):
        TarReader([empty])


def test_corrupted_payload_fails_crc(sharded, small_tree):
    with TarReader(sharded.output) as reader:
        shard, offset = int(reader._index["shard"][4]), int(reader._index["offset"][4])
    path = shard_files(sharded)[shard]
    data = bytearray(path.read_bytes())
    data[offset + 20] ^= 0xFF
    path.write_bytes(bytes(data))
    with TarReader(sharded.output) as reader:
        assert reader.read(3) == small_tree.payloads[3]
        with pytest.raises(CorruptDataError, match="CRC32") as err:
            reader.read(4)
        assert err.value.key == small_tree.keys[4]
    ds = fastdata.ShardedIterableDataset(sharded.output, decode=Decode(output="bytes"))
    with pytest.raises(CorruptDataError):
        list(ds)
    skipping = fastdata.ShardedIterableDataset(sharded.output, decode=Decode(output="bytes"),
                                               on_error="skip")
    with pytest.warns(RuntimeWarning, match="skipping corrupt record 4"):
        assert len(list(skipping)) == len(small_tree) - 1 and skipping.skipped == 1


# -- ShardedIterableDataset ---------------------------------------------------------------


def _loader(ds, workers=2):
    from torch.utils.data import DataLoader

    return DataLoader(ds, batch_size=None, num_workers=workers,
                      multiprocessing_context="fork" if workers else None)


def _keys_seen(ds, tree, workers=2) -> list[str]:
    by_bytes = {s.data: s.key for s in tree.samples}
    out = []
    for data, label in _loader(ds, workers):
        key = by_bytes[data]
        assert label == tree.labels[tree.keys.index(key)]
        out.append(key)
    return out


@pytest.mark.parametrize("shuffle", [False, True])
def test_iterable_dataloader_two_workers_exactly_once(sharded, small_tree, shuffle):
    ds = fastdata.ShardedIterableDataset(sharded.output, decode=Decode(output="bytes"),
                                         order=Order(shuffle=shuffle, window=4, seed=3))
    seen = _keys_seen(ds, small_tree)
    assert sorted(seen) == sorted(small_tree.keys)
    if not shuffle:
        # Workers take the samples of the stored order in turn and the DataLoader
        # takes them from its workers in turn: the stored order comes out.
        assert seen == small_tree.keys


def test_iterable_tensor_batches(sharded, small_tree):
    from torch.utils.data import DataLoader

    ds = fastdata.ShardedIterableDataset(sharded.output)
    batches = list(DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork"))
    images = np.concatenate([b[0].numpy() for b in batches])
    labels = np.concatenate([b[1].numpy() for b in batches])
    assert images.shape == (12, 3, 16, 16) and images.dtype == np.uint8
    expected = {(small_tree.labels[i], expected_chw(d).tobytes())
                for i, d in enumerate(small_tree.payloads)}
    assert {(int(lab), im.tobytes()) for lab, im in zip(labels, images)} == expected


def test_shuffle_reproducible_and_changes_with_epoch(sharded, small_tree):
    def order(epoch, seed=7, workers=2):
        ds = fastdata.ShardedIterableDataset(sharded.output, decode=Decode(output="bytes"),
                                             order=Order(shuffle=True, window=5, seed=seed))
        ds.set_epoch(epoch)
        return _keys_seen(ds, small_tree, workers)

    first = order(0)
    assert order(0) == first
    assert order(1) != first
    assert order(0, seed=8) != first
    assert sorted(order(1)) == sorted(first) == sorted(small_tree.keys)
    assert order(2, workers=0) == order(2, workers=0)


def test_fewer_shards_than_workers(small_tree, tmp_path):
    summary = pack(small_tree.root, tmp_path / "one.tar")  # a single shard
    ds = fastdata.ShardedIterableDataset(summary.output, decode=Decode(output="bytes"))
    assert sorted(_keys_seen(ds, small_tree)) == sorted(small_tree.keys)
    ds = fastdata.ShardedIterableDataset(summary.output, decode=Decode(output="bytes"),
                                         order=Order(shuffle=True))
    assert sorted(_keys_seen(ds, small_tree)) == sorted(small_tree.keys)


@pytest.mark.parametrize("shard_size, world, drop_last, per_rank, repeats", [
    (3, 4, False, 3, 0),   # 4 shards, 4 ranks
    (2, 4, False, 3, 0),   # 6 shards, 4 ranks: samples are split, not shards
    (4, 4, False, 3, 0),   # 3 shards < 4 ranks
    (5, 5, False, 3, 3),   # 12 over 5 ranks: padded to 15 with 3 repeats
    (5, 5, True, 2, 0),    # ... or 2 dropped
    (12, 7, False, 2, 2),  # one shard, 7 ranks
])
def test_split_across_ranks_equal_work(small_tree, tmp_path, shard_size, world, drop_last,
                                       per_rank, repeats):
    out = pack(small_tree.root, tmp_path / "s" / "ds.tar", shard_size=shard_size).output
    counts, seen = [], Counter()
    for rank in range(world):
        ds = fastdata.ShardedIterableDataset(out, decode=Decode(output="bytes"),
                                             order=Order(rank=rank, world_size=world,
                                                         drop_last=drop_last))
        assert len(ds) == per_rank and ds.plan().repeats == repeats
        got = [d for d, _ in ds]
        counts.append(len(got))
        seen.update(got)
    assert counts == [per_rank] * world
    if drop_last:
        assert sum(seen.values()) == 12 - ds.plan().dropped and max(seen.values()) == 1
    else:
        assert set(seen) == set(small_tree.payloads)
        assert sum(seen.values()) - 12 == repeats < world and max(seen.values()) <= 2


def test_iterable_pickles_with_rank(sharded):
    import pickle

    ds = fastdata.ShardedIterableDataset(sharded.output, decode=Decode(output="bytes"))
    clone = pickle.loads(pickle.dumps(ds))
    assert (clone._rank, clone._world) == (0, 1)  # resolved at pickling: no process group here
    assert len(list(clone)) == 12


def test_iterable_rejects_non_sharded_format(small_tree, tmp_path):
    out = tmp_path / "x.lmdb"
    pack(small_tree.root, out)
    with pytest.raises(FastDataError, match="not a sharded format"):
        fastdata.ShardedIterableDataset(out)


def test_warnings_do_not_leak_from_reader(sharded):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with TarReader(sharded.output) as reader:
            list(reader)
