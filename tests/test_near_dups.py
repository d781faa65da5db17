"""Near-duplicates (``fastdata dedup --near``): the hash index finds exactly the
pairs brute force finds, the mirror hash is the mirrored image's, planted
copies (resized, re-encoded, cropped, mirrored) are grouped with their
original and nothing else, ``--against`` and ``--write-view`` drop near copies
of another dataset's images, the CLI's options and output, and damaged or
undecodable records are named."""

from __future__ import annotations

import io
import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import lmdb_get, lmdb_put
from PIL import Image

import fastdata
from fastdata.cli import main
from fastdata.dataset.resolve import open_reader
from fastdata.demo import synthesize
from fastdata.errors import CorruptDataError, FastDataError
from fastdata.near_duplicates import (
    HASH_BITS,
    choose_scheme,
    components,
    group_labels,
    image_hash,
    near_pairs,
    near_pairs_from_runs,
    scheme_for,
)
from fastdata.near_groups import KEY_BITS, write_hashes

KINDS = ("resized", "reencoded", "cropped", "mirrored")


# -- helpers -----------------------------------------------------------------------------


def distance(a: int, b: int) -> int:
    return (int(a) ^ int(b)).bit_count()


def jpeg(image: Image.Image, quality: int = 90) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return out.getvalue()


def copies(data: bytes) -> dict[str, bytes]:
    """One copy of each kind, made as bench/near_dups.py makes them."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = image.size
    cut = (int(w * .03), int(h * .03), w - int(w * .03), h - int(h * .03))
    return {"resized": jpeg(image.resize((w // 2, h // 2), Image.BILINEAR)),
            "reencoded": jpeg(image, 40), "cropped": jpeg(image.crop(cut)),
            "mirrored": jpeg(image.transpose(Image.FLIP_LEFT_RIGHT))}


def copy_key(key: str, kind: str) -> str:
    return key.replace(".jpg", f"-{kind}.jpg")


def keys_of(path) -> list[str]:
    with open_reader(path) as reader:
        return [reader.keys[i] for i in range(len(reader))]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


# -- 1. the index is exact ---------------------------------------------------------------


def brute_force(hashes, threshold, queries=()) -> set[tuple[int, int, int]]:
    """Every pair i < j within ``threshold`` over all comparisons (hashes with
    hashes, each query of a record with the other's hash), its smallest distance."""
    hashes = np.asarray(hashes, np.uint64)
    best = np.bitwise_count(hashes[:, None] ^ hashes[None, :]).astype(np.int64)
    for query in queries:
        cross = np.bitwise_count(np.asarray(query, np.uint64)[:, None] ^ hashes[None, :])
        best = np.minimum(best, np.minimum(cross, cross.T))
    i, j = np.nonzero(np.triu(best <= threshold, k=1))
    return {(int(a), int(b), int(best[a, b])) for a, b in zip(i, j)}


def flipped(rng, value: int, bits: int) -> int:
    for bit in rng.choice(HASH_BITS, bits, replace=False).tolist():
        value ^= 1 << bit
    return value


@pytest.fixture(scope="module")
def planted_hashes():
    """1200 random 63-bit hashes and 300 near copies of some of them (0 to 12
    bits flipped; several copies of one base, so copies of copies are pairs at
    up to 24 bits, across every threshold's edge), shuffled; and a second set
    of hashes of the same records (as mirror hashes are), some near another
    record's hash, some near the record's own (which is not a pair)."""
    rng = np.random.default_rng(7)
    base = rng.integers(0, 1 << HASH_BITS, 1200, dtype=np.uint64)
    extra = [flipped(rng, int(base[b]), int(rng.integers(0, 13)))
             for b in rng.choice(150, 300).tolist()]  # ~2 copies per base of 150
    hashes = np.concatenate([base, np.asarray(extra, np.uint64)])
    hashes = hashes[rng.permutation(len(hashes))]
    other = rng.integers(0, 1 << HASH_BITS, len(hashes), dtype=np.uint64)
    for i in rng.choice(len(hashes), 200, replace=False).tolist():
        j = int(rng.integers(len(hashes)))
        other[i] = flipped(rng, int(hashes[j]), int(rng.integers(0, 13)))
    for i in rng.choice(len(hashes), 50, replace=False).tolist():
        other[i] = flipped(rng, int(hashes[i]), int(rng.integers(0, 3)))
    assert int(hashes.max()) < 1 << HASH_BITS
    return hashes, other


def check_rows(pairs: np.ndarray) -> set[tuple[int, int, int]]:
    """The rows as a set, after checking their form: int64 (n, 3), sorted,
    i < j, each pair once."""
    assert pairs.dtype == np.int64 and pairs.ndim == 2 and pairs.shape[1] == 3
    rows = [tuple(r) for r in pairs.tolist()]
    assert rows == sorted(rows)
    assert all(i < j for i, j, _ in rows)
    assert len({(i, j) for i, j, _ in rows}) == len(rows)
    return set(rows)


@pytest.mark.parametrize("bands", [None, 3, 4, 6])
@pytest.mark.parametrize("threshold", [0, 4, 8, 12])
def test_the_index_finds_exactly_the_pairs_brute_force_finds(planted_hashes, threshold, bands):
    hashes, _ = planted_hashes
    expected = brute_force(hashes, threshold)
    assert len(expected) >= (10 if threshold == 0 else 100)  # the planted copies
    assert check_rows(near_pairs(hashes, threshold, bands=bands)) == expected


@pytest.mark.parametrize("bands", [None, 3, 4, 6])
@pytest.mark.parametrize("threshold", [0, 4, 8, 12])
def test_queries_find_the_cross_pairs_with_their_smallest_distance(planted_hashes, threshold,
                                                                   bands):
    hashes, other = planted_hashes
    expected = brute_force(hashes, threshold, [other])
    plain = brute_force(hashes, threshold)
    assert len(expected - plain) >= 10  # pairs the queries add, or make closer
    got = check_rows(near_pairs(hashes, threshold, [other], bands=bands))
    assert got == expected


def test_the_smallest_distance_of_a_pair_found_several_ways():
    a = (1 << 40) - 1
    hashes = np.asarray([a, a ^ 0b111111, 12345], np.uint64)   # 6 bits apart
    # The second record's query 1 bit from the first's hash, the third's 2 bits
    # from the first's and 8 from the second's.
    mirror = np.asarray([99, a ^ 0b1, a ^ (0b11 << 20)], np.uint64)
    assert near_pairs(hashes, 6, [mirror]).tolist() == [[0, 1, 1], [0, 2, 2]]
    assert near_pairs(hashes, 8, [mirror]).tolist() == [[0, 1, 1], [0, 2, 2], [1, 2, 8]]
    assert near_pairs(hashes, 6).tolist() == [[0, 1, 6]]
    # A record's query near its own hash is no pair.
    assert near_pairs(hashes[:1], 8, [hashes[:1]]).shape == (0, 3)


def test_edge_sizes_and_bands():
    assert near_pairs(np.zeros(0, np.uint64), 8).shape == (0, 3)
    assert near_pairs(np.asarray([5], np.uint64), 8).shape == (0, 3)
    assert near_pairs(np.asarray([5, 5, 5], np.uint64), 0).tolist() == \
        [[0, 1, 0], [0, 2, 0], [1, 2, 0]]
    for n, threshold in itertools.product((10, 10_000, 10**6), (0, 8, 12, 24)):
        assert choose_scheme(n, threshold).radius <= 2
    with pytest.raises(ValueError, match="bands"):
        near_pairs(np.asarray([1, 2], np.uint64), 8, bands=2)  # 32-bit bands


def test_the_scheme_is_exact_for_every_spread_of_the_differing_bits():
    """The pigeonhole bound behind every scheme: however ``threshold`` bits
    spread over ``m`` blocks, the ``j`` blocks with the fewest hold at most
    ``2 * radius`` of them."""
    def spreads(left, blocks):
        if blocks == 1:
            yield (left,)
            return
        for first in range(left + 1):
            for rest in spreads(left - first, blocks - 1):
                yield (first,) + rest

    for threshold, m, j in itertools.product((0, 3, 8, 12), (1, 3, 5, 9), (1, 2, 3)):
        if j > m:
            continue
        scheme = scheme_for(m, j, threshold)
        worst = max(sum(sorted(spread)[:j]) for spread in spreads(threshold, m))
        assert worst <= 2 * scheme.radius, (threshold, m, j)
        assert all(scheme.width(t) <= KEY_BITS for t in range(len(scheme.tables)))


def test_the_rule_widens_the_keys_as_records_grow():
    small, million, huge = (choose_scheme(n, 8) for n in (1_000, 10**6, 10**9))
    assert small.radius == 0 and len(small.tables) == 9  # a pure sort: 9 bands of 7 bits
    assert million.radius == 1 and [million.width(t) for t in range(3)] == [21, 21, 21]
    assert min(huge.width(t) for t in range(len(huge.tables))) > 21  # wider keys at 10^9
    assert choose_scheme(10**6, 8, queries=1).radius <= 1


class InProcess:
    """An executor as fastdata.jobs' are (results(fn, pieces, common,
    in_order=)), run here, that counts the pieces."""

    def __init__(self):
        self.calls = []

    def results(self, fn, pieces, common, *, in_order):
        for number, arg in pieces:
            self.calls.append(fn.__name__)
            yield number, fn(number, arg, *common)


@pytest.mark.parametrize("scheme", [None, (5, 2), (9, 1), (3, 1)])
def test_pairs_from_pieces_of_hashes(planted_hashes, tmp_path, scheme):
    """Hashes written as pieces (as workers do) give the pairs near_pairs gives,
    whatever the scheme: tables of 2 of 5 blocks, 9 bands of radius 0, 3 of radius 1."""
    hashes, other = planted_hashes
    threshold = 8
    cuts = [0, 100, 101, 700, len(hashes)]  # uneven pieces, one of one record
    files = [write_hashes(str(tmp_path / f"h{k}.npy"), hashes[a:b], start=a,
                          queries=[other[a:b]])
             for k, (a, b) in enumerate(itertools.pairwise(cuts))]
    executor = InProcess()
    found = near_pairs_from_runs(files, str(tmp_path / "job"), threshold, executor=executor,
                                 scheme=scheme and scheme_for(*scheme, threshold))
    pairs = np.load(found.path, allow_pickle=False)
    rows = {(int(i), int(j), int(d)) for i, j, d in pairs[["i", "j", "distance"]].tolist()}
    assert rows == brute_force(hashes, threshold, [other])
    assert found.records == len(hashes) and found.pairs == len(pairs)
    assert found.rows >= 2 * len(hashes) * len(found.scheme.tables) and found.checked > 0
    assert executor.calls.count("index_piece") == 4
    assert executor.calls.count("pairs_part") >= len(found.scheme.tables)
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == ["pairs.npy"]


def test_many_pieces_are_merged_before_the_pairs(planted_hashes, tmp_path):
    """More runs per table than a part reads at once: merged first, a piece
    per group of them, and the pairs are the same."""
    hashes, other = planted_hashes
    cuts = list(range(0, len(hashes), 40)) + [len(hashes)]  # 38 pieces
    files = [write_hashes(str(tmp_path / f"h{k}.npy"), hashes[a:b], start=a,
                          queries=[other[a:b]])
             for k, (a, b) in enumerate(itertools.pairwise(cuts))]
    executor = InProcess()
    found = near_pairs_from_runs(files, str(tmp_path / "job"), 8, executor=executor,
                                 scheme=scheme_for(3, 1, 8))
    pairs = np.load(found.path, allow_pickle=False)
    assert {(int(i), int(j), int(d)) for i, j, d in pairs[["i", "j", "distance"]].tolist()} \
        == brute_force(hashes, 8, [other])
    assert executor.calls.count("merge_piece") == 3 * 3  # 38 runs a table: 3 groups of 16
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == ["pairs.npy"]


def test_one_hash_many_times_and_groups_of_every_size():
    """Groups far larger than the rest (300 copies of one hash, 40 of another
    8 bits away) next to groups of every size: every pair, each once."""
    rng = np.random.default_rng(11)
    hashes = rng.integers(0, 1 << HASH_BITS, 2000, dtype=np.uint64)
    hashes[rng.choice(2000, 300, replace=False)] = hashes[0]
    far = rng.choice(np.flatnonzero(hashes != hashes[0]), 40, replace=False)
    hashes[far] = flipped(rng, int(hashes[0]), 8)
    for threshold in (0, 8):
        got = check_rows(near_pairs(hashes, threshold))
        assert got == brute_force(hashes, threshold)
        assert len(got) >= 301 * 300 // 2 + (40 * 39 // 2 if threshold else 0)


def test_bad_pieces_of_hashes_are_named(tmp_path):
    np.save(tmp_path / "odd.npy", np.zeros(3, [("hash", "<u8")]))
    with pytest.raises(FastDataError, match="odd.npy.*write_hashes"):
        near_pairs_from_runs([str(tmp_path / "odd.npy")], str(tmp_path / "job"), 8)
    a = write_hashes(str(tmp_path / "a.npy"), np.arange(3, dtype=np.uint64))
    b = write_hashes(str(tmp_path / "b.npy"), np.arange(3, dtype=np.uint64), start=3,
                     queries=[np.arange(3, dtype=np.uint64)])
    with pytest.raises(FastDataError, match="same queries"):
        near_pairs_from_runs([a, b], str(tmp_path / "job"), 8)
    with pytest.raises(ValueError, match="63 bits"):
        write_hashes(str(tmp_path / "c.npy"), np.asarray([1 << 63], np.uint64))


def test_groups_are_the_connected_components():
    rng = np.random.default_rng(3)
    pairs = rng.integers(0, 300, (400, 2))
    pairs = np.sort(pairs[pairs[:, 0] != pairs[:, 1]], axis=1)
    parent = {}

    def root(x):
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    for a, b in pairs.tolist():
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    members, labels = group_labels(pairs)
    assert members.tolist() == sorted(set(pairs.ravel().tolist()))
    assert labels.tolist() == [root(x) for x in members.tolist()]
    groups = components(pairs, 300)
    assert [g[0] for g in groups] == sorted({root(x) for x in members.tolist()})
    assert sorted(x for g in groups for x in g) == members.tolist()
    assert components(np.zeros((0, 3), np.int64)) == []
    chain = np.stack([np.arange(999, 0, -1), np.arange(1000, 1, -1)], 1)  # one long path
    assert components(chain) == [list(range(1, 1001))]


# -- 2. the mirror hash ------------------------------------------------------------------


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> list[Path]:
    """16 photo-like JPEGs (the demo generator), in the order of their names."""
    root = tmp_path_factory.mktemp("near") / "pool"
    synthesize(root, kind="photos", n=16, seed=1, progress=False)
    return sorted(root.rglob("*.jpg"))


def test_the_mirror_hash_is_the_mirrored_images_hash(photos):
    for path in photos[:5]:
        data = path.read_bytes()
        plain, mirror = image_hash(data)
        assert 0 <= plain < 1 << HASH_BITS and 0 <= mirror < 1 << HASH_BITS
        image = Image.open(io.BytesIO(data)).convert("RGB")
        flipped_plain, flipped_mirror = image_hash(jpeg(image.transpose(Image.FLIP_LEFT_RIGHT)))
        assert distance(flipped_plain, mirror) <= 6, path
        assert distance(flipped_mirror, plain) <= 6, path
        assert distance(flipped_plain, plain) >= 16, path  # a mirror image looks different
        # Raw pixels (a dataset packed as arrays): the mirror exactly as stored.
        pixels = np.asarray(image)
        raw = image_hash(pixels.tobytes(), raw_shape=pixels.shape)
        raw_flipped = image_hash(np.ascontiguousarray(pixels[:, ::-1]).tobytes(),
                                 raw_shape=pixels.shape)
        assert distance(raw_flipped[0], raw[1]) <= 4, path
        assert distance(raw[0], plain) <= 6, path  # the same picture, decoded another way


def test_hashes_of_unrelated_photos_are_far_apart(photos):
    hashes = [image_hash(p.read_bytes()) for p in photos]
    for (a, ma), (b, _) in itertools.combinations(hashes, 2):
        assert distance(a, b) > 12 and distance(ma, b) > 12


def test_a_non_image_is_a_decode_error():
    with pytest.raises((OSError, ValueError)):
        image_hash(b"not an image at all")


# -- 3. planted copies -------------------------------------------------------------------


@pytest.fixture(scope="module")
def planted(photos, tmp_path_factory):
    """12 photos; of 8 of them ("copied") one copy of each kind, of 2 an exact
    copy of the file, 2 left alone: 46 records, packed to LMDB and to tar.
    ``origin`` maps each key to its original's key."""
    tmp = tmp_path_factory.mktemp("planted")
    src = tmp / "src"
    pool = photos[:12]
    origin = {}
    for k, path in enumerate(pool):
        key = path.relative_to(path.parent.parent).as_posix()
        (src / path.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, src / key)
        origin[key] = key
        if k < 8:
            for kind, data in copies(path.read_bytes()).items():
                (src / copy_key(key, kind)).write_bytes(data)
                origin[copy_key(key, kind)] = key
        elif k < 10:
            shutil.copy(path, src / copy_key(key, "exact"))
            origin[copy_key(key, "exact")] = key
    keys = [p.relative_to(path.parent.parent).as_posix() for p in pool]
    return {"tmp": tmp, "origin": origin, "copied": keys[:8], "exact": keys[8:10],
            "alone": keys[10:],
            "lmdb": fastdata.pack(src, tmp / "d.lmdb", progress=False).output,
            "tar": fastdata.pack(src, tmp / "d-%06d.tar", progress=False,
                                 options=fastdata.PackOptions(shard_size=20)).output}


def group_keys(report) -> list[set[str]]:
    return [{m.key for m in g.members} for g in report.groups]


def group_with(report, key: str) -> set[str]:
    found = [keys for keys in group_keys(report) if key in keys]
    assert len(found) <= 1
    return found[0] if found else set()


def assert_precise(report, origin) -> None:
    """No group mixes copies of two originals."""
    for keys in group_keys(report):
        assert len({origin[k] for k in keys}) == 1, keys


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_resized_and_reencoded_copies_are_grouped_with_their_original(planted, fmt):
    origin = planted["origin"]
    report = fastdata.dedup(planted[fmt], near=True, progress=False)
    assert report.near_threshold == 8 and report.flip is False
    assert report.records == [len(origin)] == [46]
    assert_precise(report, origin)
    for key in planted["copied"]:
        group = group_with(report, key)
        assert {key, copy_key(key, "resized"), copy_key(key, "reencoded")} <= group
        assert copy_key(key, "mirrored") not in group  # only with flip
    assert not any(k.endswith("-mirrored.jpg") for keys in group_keys(report) for k in keys)
    for key in planted["alone"]:
        assert group_with(report, key) == set()
    for group in report.groups:
        exact = origin[group.members[0].key] in planted["exact"]
        assert group.kind == ("exact" if exact else "near"), group
        assert (group.distance == 0) if exact else (0 <= group.distance <= 8)
        assert group.datasets() == {0}
        assert [m.index for m in group.members] == sorted(m.index for m in group.members)
    for key in planted["exact"]:
        assert group_with(report, key) == {key, copy_key(key, "exact")}
    # The members are what their keys say.
    keys = keys_of(planted[fmt])
    assert all(keys[m.index] == m.key for g in report.groups for m in g.members)
    assert report.within() == report.groups and not report.shared()
    assert report.redundant() == sum(len(g.members) - 1 for g in report.groups)
    assert report.to_drop() == sorted(m.index for g in report.groups for m in g.members[1:])


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_mirrored_copies_are_found_with_flip(planted, fmt):
    origin = planted["origin"]
    report = fastdata.dedup(planted[fmt], near=True, flip=True, progress=False)
    assert report.flip is True and report.to_dict()["near"] == {"threshold": 8, "flip": True}
    assert_precise(report, origin)
    for key in planted["copied"]:
        assert {key, copy_key(key, "resized"), copy_key(key, "reencoded"),
                copy_key(key, "mirrored")} <= group_with(report, key)
    for key in planted["exact"]:
        assert group_with(report, key) == {key, copy_key(key, "exact")}
        assert [g.kind for g in report.groups if key in {m.key for m in g.members}] == ["exact"]


def test_cropped_copies_and_the_threshold(planted):
    origin = planted["origin"]
    found = {}
    for threshold in (0, 4, 8, 10):
        report = fastdata.dedup(planted["lmdb"], near=True, threshold=threshold,
                                progress=False)
        assert report.near_threshold == threshold
        assert_precise(report, origin)
        assert all(g.distance <= threshold for g in report.groups)
        found[threshold] = {k for keys in group_keys(report) for k in keys}
    # A wider threshold only adds records.
    assert found[0] <= found[4] <= found[8] <= found[10]
    # Exact copies at any threshold; at 0 bits, nothing of another look.
    assert {k for k in found[0] if origin[k] in planted["exact"]} == \
        set(planted["exact"]) | {copy_key(k, "exact") for k in planted["exact"]}
    cropped = [copy_key(k, "cropped") for k in planted["copied"]]
    assert sum(k in found[10] for k in cropped) >= len(cropped) // 2


def test_a_dataset_of_raw_pixels(planted):
    """Records stored decoded (uint8 HWC) are hashed from their pixels."""
    from fastdata.packers.preprocess import Preprocess

    origin = planted["origin"]
    out = fastdata.pack(planted["tmp"] / "src", planted["tmp"] / "raw.lmdb", progress=False,
                        options=fastdata.PackOptions(preprocess=Preprocess(
                            resize=64, center_crop=True, encoding="raw"))).output
    with open_reader(out) as reader:
        assert reader.manifest.raw_shape == (64, 64, 3)
    report = fastdata.dedup(out, near=True, flip=True, progress=False)
    assert_precise(report, origin)
    for key in planted["copied"]:
        assert {key, copy_key(key, "resized"), copy_key(key, "reencoded"),
                copy_key(key, "mirrored")} <= group_with(report, key)
    for key in planted["exact"]:  # the same file: the same pixels
        assert group_with(report, key) == {key, copy_key(key, "exact")}


def test_16_bit_pngs_are_hashed_by_their_look(photos, tmp_path):
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for k, path in enumerate(photos[:4]):
        grey = np.asarray(Image.open(path).convert("L"), np.uint32)
        Image.fromarray((1000 + grey * 250).astype(np.uint16)).save(src / f"deep{k}.png")
    # One of them again in 8 bits (the high byte, as fastdata's decoder reads it).
    Image.fromarray(((1000 + np.asarray(Image.open(photos[0]).convert("L"), np.uint32) * 250)
                     >> 8).astype(np.uint8)).save(src / "flat0.png")
    summary = fastdata.pack(tmp_path / "src", tmp_path / "deep.lmdb", progress=False)
    assert summary.records == 5
    with open_reader(summary.output) as reader:
        assert Image.open(io.BytesIO(reader.read(0))).mode == "I;16"
    report = fastdata.dedup(summary.output, near=True, progress=False)
    assert group_keys(report) == [{"a/deep0.png", "a/flat0.png"}]


# -- 4. --against and --write-view -------------------------------------------------------


@pytest.fixture(scope="module")
def split(photos, tmp_path_factory):
    """Training: photos 0-9 and a resized copy of photo 2 (LMDB); validation: a
    re-encoded copy of photo 0, a resized copy of photo 1 and photo 12 (tar)."""
    tmp = tmp_path_factory.mktemp("split")
    train, val = tmp / "train", tmp / "val"

    def key(path):
        return path.relative_to(path.parent.parent).as_posix()

    for path in photos[:10]:
        (train / path.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, train / key(path))
    (train / copy_key(key(photos[2]), "resized")).write_bytes(
        copies(photos[2].read_bytes())["resized"])
    (val / "v").mkdir(parents=True)
    (val / "v" / "from-0.jpg").write_bytes(copies(photos[0].read_bytes())["reencoded"])
    (val / "v" / "from-1.jpg").write_bytes(copies(photos[1].read_bytes())["resized"])
    shutil.copy(photos[12], val / "v" / "own.jpg")
    data = tmp / "data"
    return {"data": data, "keys": [key(p) for p in photos[:10]],
            "train": fastdata.pack(train, data / "train.lmdb", progress=False).output,
            "val": fastdata.pack(val, data / "val.tar", progress=False).output}


def test_near_copies_in_another_dataset_are_shared(split):
    keys = split["keys"]
    report = fastdata.dedup(split["train"], against=[split["val"]], near=True,
                            progress=False)
    assert report.records == [11, 3]
    shared = sorted(({(m.dataset, m.key) for m in g.members} for g in report.shared()),
                    key=sorted)
    assert shared == [{(0, keys[0]), (1, "v/from-0.jpg")}, {(0, keys[1]), (1, "v/from-1.jpg")}]
    assert all(g.kind == "near" for g in report.shared())
    assert [{m.key for m in g.members} for g in report.within()] == \
        [{keys[2], copy_key(keys[2], "resized")}]
    assert report.redundant() == 1
    # Without --near, nothing is shared: the bytes differ.
    assert not fastdata.dedup(split["train"], against=[split["val"]], progress=False).groups


def test_write_view_leaves_out_near_copies_of_the_other_dataset(split):
    keys, data = split["keys"], split["data"]
    view = data / "clean.fastdata.json"
    done = invoke("dedup", split["train"], "--near", "--against", split["val"],
                  "--write-view", view, "--no-progress")
    assert done.exit_code == 0, done.output
    assert "8 of 11 records (without 3)" in done.output
    assert f"against {split['val']} (3 records): 2 record(s) of" in done.output
    train = keys_of(split["train"])
    pair = [train.index(keys[2]), train.index(copy_key(keys[2], "resized"))]
    dropped = {keys[0], keys[1], train[max(pair)]}  # the first of a group stays
    assert keys_of(view) == [k for k in train if k not in dropped]
    with open_reader(view) as reader, open_reader(split["train"]) as parent:
        for i in range(len(reader)):
            assert reader.read(i) == parent.read(train.index(reader.keys[i]))
    # --fail-on-shared: near copies count as shared.
    done = invoke("dedup", split["train"], "--near", "--against", split["val"],
                  "--fail-on-shared", "--no-progress")
    assert done.exit_code == 1


# -- 5. the CLI --------------------------------------------------------------------------


def test_cli_text_names_near_duplicates_and_the_threshold(planted):
    done = invoke("dedup", planted["lmdb"], "--near", "--no-progress")
    assert done.exit_code == 0, done.output
    first = done.output.splitlines()[0]
    assert "46 records" in first and "near-duplicates" in first
    assert "within 8 bits" in first and "mirrored" not in first
    assert "bits)" in done.output and "(same bytes)" in done.output
    done = invoke("dedup", planted["lmdb"], "--near", "--threshold", "4", "--flip",
                  "--no-progress")
    assert done.exit_code == 0, done.output
    assert "within 4 bits, mirrored too" in done.output.splitlines()[0]
    plain = invoke("dedup", planted["lmdb"], "--no-progress")
    assert plain.exit_code == 0 and "exact duplicates" in plain.output
    assert "near-duplicates" not in plain.output


def test_cli_json_has_the_near_settings_and_each_groups_kind(planted):
    done = invoke("dedup", planted["tar"], "--near", "--flip", "--threshold", "10", "--json",
                  "--no-progress")
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["near"] == {"threshold": 10, "flip": True}
    assert report["groups"] and report["within"] == len(report["groups"])
    for group in report["groups"]:
        assert group["kind"] in ("exact", "near")
        assert isinstance(group["distance"], int) and 0 <= group["distance"] <= 10
        assert (group["kind"] == "exact") == (group["distance"] == 0 and all(
            m["key"].endswith("-exact.jpg") or copy_key(m["key"], "exact") in
            {n["key"] for n in group["members"]} for m in group["members"]))
    assert sum(g["kind"] == "exact" for g in report["groups"]) == 2
    exact = json.loads(invoke("dedup", planted["tar"], "--json", "--no-progress").output)
    assert exact["near"] is None
    assert [g["kind"] for g in exact["groups"]] == ["exact", "exact"]


@pytest.mark.parametrize("option", [["--threshold", "4"], ["--flip"]])
def test_near_options_without_near_are_refused(planted, option):
    done = invoke("dedup", planted["lmdb"], *option, "--no-progress")
    assert done.exit_code != 0
    assert "--near" in done.output
    with pytest.raises(FastDataError, match="near"):
        fastdata.dedup(planted["lmdb"], threshold=4 if option[0] == "--threshold" else None,
                       flip=option == ["--flip"], progress=False)


def test_a_threshold_out_of_range_is_refused(planted):
    done = invoke("dedup", planted["lmdb"], "--near", "--threshold", "30", "--no-progress")
    assert done.exit_code == 2
    assert "--threshold" in done.output and "30" in done.output
    for bad in (25, -1, True, 4.0):
        with pytest.raises(FastDataError, match="threshold"):
            fastdata.dedup(planted["lmdb"], near=True, threshold=bad, progress=False)


# -- 6. damaged and undecodable records ---------------------------------------------------


def test_a_damaged_lmdb_record_is_named(planted, tmp_path):
    out = Path(shutil.copytree(planted["lmdb"], tmp_path / "d.lmdb"))
    payload = bytearray(lmdb_get(out, b"%010d" % 3))
    payload[len(payload) // 2] ^= 0xFF
    lmdb_put(out, {b"%010d" % 3: bytes(payload)})
    with pytest.raises(CorruptDataError, match="record 3"):
        fastdata.dedup(out, near=True, progress=False)


def test_a_damaged_tar_record_is_named(planted, tmp_path):
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for name in planted["copied"][:3]:
        shutil.copy(planted["tmp"] / "src" / name, src / Path(name).name)
    out = fastdata.pack(tmp_path / "src", tmp_path / "d.tar", progress=False).output
    shard = tmp_path / "d.tar"
    raw = bytearray(shard.read_bytes())
    raw[700] ^= 0xFF  # inside the first record's bytes (its header is 512)
    shard.write_bytes(bytes(raw))
    with pytest.raises(CorruptDataError, match="record 0"):
        fastdata.dedup(out, near=True, flip=True, progress=False)


def test_a_record_that_is_not_an_image_is_named(photos, tmp_path):
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    shutil.copy(photos[0], src / "a.jpg")
    # A PNM header the packer accepts, then too few pixels: PIL cannot decode it.
    (src / "b.ppm").write_bytes(b"P6\n40 30\n255\n" + bytes(range(100)))
    summary = fastdata.pack(tmp_path / "src", tmp_path / "bad.lmdb", progress=False)
    if summary.records != 2:
        pytest.skip(f"the packer refuses the undecodable record: {summary.skipped}")
    keys = keys_of(summary.output)
    with pytest.raises(FastDataError, match=f"record {keys.index('a/b.ppm')} does not decode"
                       ) as caught:
        fastdata.dedup(summary.output, near=True, progress=False)
    assert not isinstance(caught.value, CorruptDataError)
    assert "a/b.ppm" in str(caught.value)
    # Exact dedup does not decode: it reads the record fine.
    assert fastdata.dedup(summary.output, progress=False).groups == []
