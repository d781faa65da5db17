"""Options that had no test of their effect: each one does what its help says."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
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
    unchecked = list(fastdata.ShardedIterableDataset(manifest, decode=raw, verify=False))
    assert len(unchecked) == 24
    start, stop = int(first["offset"]), int(first["offset"]) + int(first["size"])
    assert bytes(data[start:stop]) in {bytes(b) for b, _ in unchecked}
