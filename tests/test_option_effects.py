"""Options that had no test of their effect: each one does what its help says."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import optional
import pytest
import torch
from click.testing import CliRunner

import fastdata
from fastdata.cli import main
from fastdata.demo import synthesize


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(f.relative_to(folder).as_posix().encode() + f.read_bytes())
    return h.hexdigest()


def test_synth_seed_gives_the_same_bytes_and_another_seed_others(tmp_path):
    runner = CliRunner()
    for name, seed in (("a", "4"), ("b", "4"), ("c", "5")):
        result = runner.invoke(main, ["synth", str(tmp_path / name), "--kind", "tiny", "-n", "12",
                                      "--classes", "2", "--seed", seed])
        assert result.exit_code == 0, result.output
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert _digest(tmp_path / "a") != _digest(tmp_path / "c")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("effects")
    synthesize(root / "src", kind="tiny", n=24, classes=3, seed=1, progress=False)
    return root


def test_pack_progress_draws_a_bar_without_a_terminal_and_no_progress_none(tiny, tmp_path):
    def pack(flag, out):
        # stderr is a pipe here, not a terminal: by default no bar is drawn.
        return subprocess.run([sys.executable, "-m", "fastdata.cli", "pack", str(tiny / "src"),
                               str(tmp_path / out), *flag], capture_output=True, text=True,
                              timeout=300)
    forced, hidden, default = pack(["--progress"], "a.lmdb"), pack(["--no-progress"], "b.lmdb"), \
        pack([], "c.lmdb")
    assert forced.returncode == hidden.returncode == default.returncode == 0
    assert "24/24" in forced.stderr, forced.stderr          # the bar's count, at its end
    assert "24/24" not in hidden.stderr and "24/24" not in default.stderr


def test_bench_keeps_its_packs_in_out_dir_and_records_its_options(tiny, tmp_path):
    out = tmp_path / "kept"
    result = CliRunner().invoke(main, [
        "bench", str(tiny / "src"), "--formats", "lmdb", "--workers", "0", "--epochs", "1",
        "--size", "8", "--out-dir", str(out), "--cache", "ram", "--seed", "3",
        "--no-persistent-workers", "--json", str(tmp_path / "r.json"), "--no-progress"],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    kept = fastdata.open_dataset(out / "lmdb-keep.lmdb")  # a dataset, still there afterwards
    assert len(kept) == 24
    data = json.loads((tmp_path / "r.json").read_text())
    options = data["options"]
    assert options["ram_cache"] is True and options["seed"] == 3
    assert options["persistent_workers"] is False
    rows = {r["name"]: r for r in data["rows"]}
    assert rows["lmdb"]["path"] == str(out / "lmdb-keep.lmdb") and rows["lmdb"]["status"] == "ok"


def test_prefetcher_without_conversion_hands_on_uint8(tiny, tmp_path):
    path = fastdata.pack(tiny / "src", tmp_path / "p.lmdb", progress=False).output
    ds = fastdata.open_dataset(path, decode=fastdata.Decode(size=(8, 8)))
    loader = torch.utils.data.DataLoader(ds, batch_size=6, collate_fn=fastdata.collate)
    copied = fastdata.CUDAPrefetcher(loader, device="cpu", convert=False)
    converted = fastdata.CUDAPrefetcher(loader, device="cpu")
    (raw, _), (floats, _) = next(iter(copied)), next(iter(converted))
    assert raw.dtype == torch.uint8 and floats.dtype == torch.float32
    assert torch.equal(raw.cpu(), next(iter(loader))[0])
    assert torch.allclose(raw.cpu().float() / 255, floats.cpu())


def test_stream_transform_target_transform_and_verify_off(tiny, tmp_path):
    fastdata.pack(tiny / "src", tmp_path / "s-%06d.tar",
                  options=fastdata.PackOptions(shard_size=10), progress=False)
    manifest = tmp_path / "s.tar.fastdata.json"
    plain = list(fastdata.ShardedIterableDataset(manifest, decode=fastdata.Decode(size=(8, 8))))
    changed = list(fastdata.ShardedIterableDataset(
        manifest, decode=fastdata.Decode(size=(8, 8)),
        transform=lambda image: image.flip(-1), target_transform=lambda label: label + 100))
    assert [y + 100 for _, y in plain] == [y for _, y in changed]
    assert all(torch.equal(a.flip(-1), b) for (a, _), (b, _) in zip(plain, changed))

    # One byte of the first record's image changed: with verify (the default) its
    # CRC32 names it; verify=False hands the changed bytes on unchecked.
    index = np.load(tmp_path / "s.tar.fastdata.index.npy", allow_pickle=False)
    shards = [s["path"] for s in json.loads(manifest.read_text())["shards"]]
    first = index[0]
    shard = tmp_path / shards[int(first["shard"])]
    data = bytearray(shard.read_bytes())
    data[int(first["offset"]) + int(first["size"]) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    raw = fastdata.Decode(output="bytes")
    with pytest.raises(fastdata.CorruptDataError):
        list(fastdata.ShardedIterableDataset(manifest, decode=raw))
    unchecked = list(fastdata.ShardedIterableDataset(fastdata.DatasetRef(manifest, verify=False),
                                                     decode=raw))
    assert len(unchecked) == 24
    start, stop = int(first["offset"]), int(first["offset"]) + int(first["size"])
    assert bytes(data[start:stop]) in {bytes(b) for b, _ in unchecked}


def _page_cache_drops() -> int | None:
    """How many times this machine's page cache was dropped (/proc/vmstat), or None."""
    try:
        with open("/proc/vmstat", encoding="ascii") as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == "drop_pagecache":
                    return int(value)
    except OSError:
        pass
    return None


def test_bench_cold_drops_the_page_cache_before_every_measured_epoch(tiny, tmp_path):
    # Whether this machine lets a process drop the page cache (root on Linux,
    # /proc/sys writable), asked without dropping it.
    can_drop = sys.platform.startswith("linux") and os.access("/proc/sys/vm/drop_caches",
                                                              os.W_OK)
    epochs = 2

    def bench(*flags):
        report = tmp_path / f"bench{len(flags)}.json"
        result = CliRunner().invoke(main, [
            "bench", str(tiny / "src"), "--formats", "lmdb", "--workers", "0",
            "--epochs", str(epochs), "--size", "8", "--json", str(report), "--no-progress",
            *flags], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        data = json.loads(report.read_text())
        assert data["rows"] and all(r["status"] == "ok" for r in data["rows"]), data["rows"]
        return result.output, data

    warm_output, warm = bench()
    assert warm["cache"] == "warm" and warm["cache_note"] is None
    assert {r["cache"] for r in warm["rows"]} == {"warm"} and "--cold" not in warm_output
    before = _page_cache_drops()
    cold_output, cold = bench("--cold")
    after = _page_cache_drops()
    rows = cold["rows"]     # the baseline, lmdb, and lmdb as loader() reads it by default
    assert len(rows) >= 3, [r["name"] for r in rows]
    if not can_drop:
        # Said, once, and every row measured (and labelled) warm.
        assert cold["cache"] == "warm" and {r["cache"] for r in rows} == {"warm"}
        assert cold["cache_note"].startswith("--cold: cannot drop the page cache")
        assert cold["cache_note"].endswith("; running warm")
        assert "warning: --cold: cannot drop the page cache" in cold_output
        return
    assert cold["cache"] == "cold"
    assert cold["cache_note"] == "page cache dropped before every measured epoch"
    assert {r["cache"] for r in rows} == {"cold"}, [(r["name"], r["cache"]) for r in rows]
    assert cold_output.count("(cold)") == len(rows) and "--cold" not in cold_output
    if before is not None and after is not None:
        # Once to see that it can, then before every measured epoch of every row,
        # the rows of loader()'s defaults included (other processes may drop it too).
        assert after - before >= 1 + epochs * len(rows), (after - before, len(rows))


def _png(pixels: np.ndarray) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


def test_parquet_image_column_packs_that_column_and_names_a_missing_one(tmp_path):
    pa = optional.require("pyarrow")
    pq = optional.require("pyarrow", "pyarrow.parquet")
    from fastdata.errors import SourceError

    rng = np.random.default_rng(5)
    n = 6
    photos = [rng.integers(0, 256, (9 + i, 12, 3), dtype=np.uint8) for i in range(n)]
    decoys = [np.full((7, 7, 3), 40 * i, np.uint8) for i in range(n)]
    photo_bytes, decoy_bytes = [_png(p) for p in photos], [_png(d) for d in decoys]
    table = pa.table({
        "photo": pa.array(photo_bytes, pa.binary()),
        # A decoy under the default name, in the Hugging Face layout.
        "image": pa.array([{"bytes": b, "path": f"decoy-{i}.png"}
                           for i, b in enumerate(decoy_bytes)],
                          pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "caption": [f"photo {i}" for i in range(n)],
        "label": [i % 2 for i in range(n)],
    })
    path = tmp_path / "photos.parquet"
    pq.write_table(table, path)

    source = fastdata.ParquetSource(path, image_column="photo")
    assert len(source) == n and source.describe()["image_column"] == "photo"
    assert source.metadata_columns == ["caption"]          # the decoy bytes are no metadata
    assert any("'image'" in w for w in source.warnings())
    summary = fastdata.pack(source, tmp_path / "photo.lmdb", progress=False)
    stored = fastdata.open_dataset(summary.output, decode=fastdata.Decode(output="bytes"))
    pixels = fastdata.open_dataset(summary.output, decode=fastdata.Decode(output="numpy"))
    assert len(stored) == n
    assert [bytes(stored[i][0]) for i in range(n)] == photo_bytes   # the bytes, as they were
    assert all(np.array_equal(pixels[i][0], photos[i]) for i in range(n))
    assert [stored[i][1] for i in range(n)] == [i % 2 for i in range(n)]
    assert stored.keys == [f"photos/{i:08d}" for i in range(n)]  # no path: table and row
    # Without the option the default column, the decoys, is what is packed.
    default = fastdata.open_dataset(
        fastdata.pack(fastdata.ParquetSource(path), tmp_path / "default.lmdb",
                      progress=False).output, decode=fastdata.Decode(output="bytes"))
    assert [bytes(default[i][0]) for i in range(n)] == decoy_bytes
    assert default.keys == [f"decoy-{i}.png" for i in range(n)]

    # A missing column: named, with the table's columns and the option that
    # names another as the caller spells it.
    with pytest.raises(SourceError) as info:
        fastdata.ParquetSource(path, image_column="pixels")
    message = str(info.value)
    assert "no image column 'pixels'" in message and str(path) in message
    assert "the table has 'photo', 'image', 'caption', 'label'" in message
    assert "(image_column=NAME names another)" in message and "path_column" not in message
    with pytest.raises(SourceError, match=r"no image column 'pixels'.*\(path_column=NAME names"):
        fastdata.open_source(path, path_column="pixels")
    result = CliRunner().invoke(main, ["pack", str(path), str(tmp_path / "cli.lmdb"),
                                       "--path-column", "pixels"])
    assert result.exit_code == 1 and "no image column 'pixels'" in result.output
    assert "(--path-column NAME names another)" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "cli.lmdb").exists()
