"""Sorted runs (fastdata.jobs.sorted_runs): a run is its rows in lexsort order,
a writer spills runs of a bounded size, a merge of any runs (uneven, empty,
one) at any chunk size is the stable sort of all their rows with ties in run
order, and groups of equal rows come out whole across chunk boundaries."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fastdata.errors import FastDataError
from fastdata.jobs.sorted_runs import (
    RunWriter,
    combine_runs,
    equal_runs,
    group_chunks,
    merged,
    save_chunks,
    stable_order,
    write_run,
)

DIGEST = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("position", "<i8")])
BAND = np.dtype([("key", "<u4"), ("hash", "<u8"), ("position", "<i8")])


def digest_rows(rng, n: int, distinct: int = 7) -> np.ndarray:
    """Rows with many ties: few distinct (hi, lo), positions in input order."""
    rows = np.zeros(n, DIGEST)
    rows["hi"] = rng.integers(0, 3, n).astype(np.uint64) << np.uint64(62)  # top bits used
    rows["lo"] = rng.integers(0, distinct, n)
    rows["position"] = np.arange(n)
    return rows


def expected(parts: list[np.ndarray], order: tuple[str, ...]) -> np.ndarray:
    """np.lexsort of everything, in run order: the merge's promised result."""
    every = np.concatenate(parts)
    return every[np.lexsort(tuple(every[name] for name in reversed(order)))]


def runs_of(tmp_path, parts, order) -> list[str]:
    return [write_run(str(tmp_path / f"r{k}.npy"), part, order) for k, part in enumerate(parts)]


def test_a_run_is_its_rows_in_lexsort_order_read_without_pickle(tmp_path):
    rows = digest_rows(np.random.default_rng(0), 500)
    path = write_run(str(tmp_path / "a.npy"), rows, ("hi", "lo"))
    assert path == str(tmp_path / "a.npy") and sorted(p.name for p in tmp_path.iterdir()) == \
        ["a.npy"]
    back = np.load(path, allow_pickle=False)
    assert back.dtype == DIGEST
    assert np.array_equal(back, expected([rows], ("hi", "lo")))
    # Ties (equal hi, lo) keep their input order: positions rise within each.
    for hi, lo in {(int(a), int(b)) for a, b in back[["hi", "lo"]].tolist()}:
        same = back[(back["hi"] == hi) & (back["lo"] == lo)]["position"]
        assert (np.diff(same) > 0).all()


@pytest.mark.parametrize("dtype,order", [(DIGEST, ("hi", "lo")), (DIGEST, ("lo", "position")),
                                         (BAND, ("key",)), (BAND, ("key", "hash"))])
def test_the_fast_order_is_lexsorts(dtype, order):
    rng = np.random.default_rng(1)
    rows = np.zeros(3000, dtype)
    for name in dtype.names:
        rows[name] = rng.integers(0, 40, len(rows))
    if "key" in dtype.names:
        rows["key"] = rng.integers(0, 1 << 28, len(rows))
        rows["key"][::3] = rows["key"][0]  # ties
    want = np.lexsort(tuple(rows[name] for name in reversed(order)))
    assert np.array_equal(stable_order(rows, order), want)
    assert len(stable_order(rows[:0], order)) == 0


@pytest.mark.parametrize("chunk_rows", [1, 2, 3, 64, 1 << 16])
def test_a_merge_is_the_stable_sort_of_everything(tmp_path, chunk_rows):
    rng = np.random.default_rng(chunk_rows)
    sizes = [0, 1, 37, 400, 0, 5, 1000, 2]  # uneven, empty runs among them
    parts, start = [], 0
    for size in sizes:
        part = digest_rows(rng, size)
        part["position"] += start  # each row's origin, to pin the tie order
        start += size
        parts.append(part[np.lexsort((part["lo"], part["hi"]))])
    order = ("hi", "lo")
    chunks = list(merged(runs_of(tmp_path, parts, order), order, chunk_rows=chunk_rows))
    assert all(0 < len(c) <= chunk_rows for c in chunks)
    got = np.concatenate(chunks)
    assert np.array_equal(got, expected(parts, order))


def test_a_merge_of_one_run_none_or_only_empty_ones(tmp_path):
    rows = digest_rows(np.random.default_rng(3), 300)
    order = ("lo",)
    one = runs_of(tmp_path, [rows], order)
    assert np.array_equal(np.concatenate(list(merged(one, order, chunk_rows=7))),
                          expected([rows], order))
    assert list(merged([], order)) == []
    empty = runs_of(tmp_path, [rows[:0], rows[:0]], order)
    assert list(merged(empty, order, chunk_rows=4)) == []


def test_a_merge_over_a_range_of_the_first_field(tmp_path):
    rng = np.random.default_rng(4)
    parts = [np.sort(np.array(list(zip(rng.integers(0, 50, n), rng.integers(0, 9, n),
                                      np.arange(n))), BAND), order="key") for n in (90, 0, 300)]
    paths = runs_of(tmp_path, parts, ("key",))
    every = expected(parts, ("key",))
    for start, stop in [(0, 50), (10, 11), (7, 30), (None, 20), (45, None), (60, 70)]:
        got = list(merged(paths, ("key",), chunk_rows=16, start=start, stop=stop))
        keep = every[((start or 0) <= every["key"]) & (every["key"] < (stop or 1 << 32))]
        assert np.array_equal(np.concatenate(got) if got else every[:0], keep), (start, stop)


def test_the_writer_spills_bounded_sorted_runs(tmp_path):
    rng = np.random.default_rng(5)
    rows = digest_rows(rng, 1000)
    writer = RunWriter(str(tmp_path / "w"), DIGEST, ("lo", "hi"), rows_in_memory=128,
                       prefix="piece")
    for at in range(0, 1000, 300):  # adds larger and smaller than a run
        writer.add(rows[at:at + 300])
    writer.add(rows[:0])
    paths = writer.close()
    assert [p.rsplit("/", 1)[1] for p in paths] == [f"piece-{k:06d}.npy" for k in range(8)]
    sizes = [len(np.load(p)) for p in paths]
    assert sizes == [128] * 7 + [104]
    for k, path in enumerate(paths):
        assert np.array_equal(np.load(path), expected([rows[128 * k:128 * (k + 1)]],
                                                      ("lo", "hi")))
    got = np.concatenate(list(merged(paths, ("lo", "hi"), chunk_rows=50)))
    assert np.array_equal(got, expected([rows], ("lo", "hi")))
    with pytest.raises(ValueError, match="dtype"):
        RunWriter(str(tmp_path / "x"), DIGEST, ("lo",)).add(np.zeros(3, BAND))
    with pytest.raises(ValueError, match="no field"):
        RunWriter(str(tmp_path / "x"), DIGEST, ("key",))


def test_combined_runs_merge_to_the_same_order(tmp_path):
    rng = np.random.default_rng(6)
    parts = [digest_rows(rng, int(n)) for n in rng.integers(0, 60, 23)]
    order = ("hi", "lo")
    paths = runs_of(tmp_path, parts, order)
    fewer = combine_runs(paths, order, str(tmp_path), fan_in=3, chunk_rows=5)
    assert len(fewer) <= 3
    got = np.concatenate(list(merged(fewer, order, chunk_rows=11)))
    assert np.array_equal(got, expected(parts, order))


def test_save_chunks_writes_one_npy(tmp_path):
    rows = digest_rows(np.random.default_rng(7), 100)
    path = str(tmp_path / "s.npy")
    assert save_chunks(path, (rows[at:at + 30] for at in range(0, 100, 30)), DIGEST) == 100
    assert np.array_equal(np.load(path, allow_pickle=False), rows)
    assert save_chunks(path, iter(()), DIGEST) == 0 and len(np.load(path)) == 0


@pytest.mark.parametrize("chunk_rows", [1, 2, 5, 1000])
def test_equal_runs_come_whole_across_chunk_boundaries(tmp_path, chunk_rows):
    rng = np.random.default_rng(8)
    rows = digest_rows(rng, 400, distinct=40)
    rows["lo"][:60] = 3  # one group longer than several chunks
    order = ("hi", "lo")
    paths = runs_of(tmp_path, [rows[:150], rows[150:]], order)
    every = expected([rows[:150], rows[150:]], order)
    groups = list(equal_runs(merged(paths, order, chunk_rows=chunk_rows), order))
    keys = every[["hi", "lo"]].tolist()
    want = []
    for key in sorted(set(keys)):
        members = every[[k == key for k in keys]]
        if len(members) >= 2:
            want.append(members)
    assert len(groups) == len(want)
    for got, members in zip(groups, want):
        assert np.array_equal(got, members)
    whole = list(group_chunks(merged(paths, order, chunk_rows=chunk_rows), order))
    assert np.array_equal(np.concatenate(whole), every)
    for a, b in itertools.pairwise(whole):
        assert tuple(a[-1][["hi", "lo"]].tolist()) != tuple(b[0][["hi", "lo"]].tolist())


def test_bad_runs_are_named(tmp_path):
    good = write_run(str(tmp_path / "good.npy"), digest_rows(np.random.default_rng(9), 50),
                     ("lo",))
    (tmp_path / "junk.npy").write_bytes(b"not a run")
    with pytest.raises(FastDataError, match="junk.npy.*write the run again"):
        list(merged([good, str(tmp_path / "junk.npy")], ("lo",)))
    data = (tmp_path / "good.npy").read_bytes()
    (tmp_path / "cut.npy").write_bytes(data[:-40])
    with pytest.raises(FastDataError, match="cut.npy.*cut short"):
        list(merged([str(tmp_path / "cut.npy")], ("lo",)))
    other = write_run(str(tmp_path / "other.npy"), np.zeros(3, BAND), ("position",))
    with pytest.raises(FastDataError, match="other.npy.*one kind"):
        list(merged([good, other], ("position",)))
    with pytest.raises(FastDataError, match="missing.npy"):
        list(merged([str(tmp_path / "missing.npy")], ("lo",)))
    np.save(tmp_path / "square.npy", np.zeros((2, 2), DIGEST))
    with pytest.raises(FastDataError, match="square.npy.*not a run of"):
        list(merged([str(tmp_path / "square.npy")], ("lo",)))
