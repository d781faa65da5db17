"""Integrity of everything a manifest covers, and damage that must never be silent
or abort the process:

- labels, CRC32s, offsets and keys are under a SHA-256 in the manifest,
  checked on open (keys when loaded); the sharded index and the LMDB and HDF5
  columns are under a CRC-32 per piece of rows, each piece checked when a
  record of it is first read; labels outside the classes are refused even
  without one (datasets packed before these checksums);
- a copied index row is refused when its piece is first read, and ``verify``
  finds one in an index without a checksum; TFRecord messages name the record
  and the byte offset apart;
- ``verify`` checks every byte of tar/TFRecord shards (their SHA-256), the
  ``.idx`` files and shards mixed in from another pack;
- a damaged LMDB gives an error naming the file from ``verify`` and the RAM
  cache, never an abort (those walks run in a child process).
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import build_tree, lmdb_get, lmdb_put, run_python, uniform_spec

import fastdata
from fastdata import Decode
from fastdata.cli import main
from fastdata.errors import CorruptDataError
from fastdata.ops.verify import verify_dataset

EXTENSIONS = {"lmdb": ".lmdb", "hdf5": ".h5", "tar": ".tar", "tfrecord": ".tfrecord"}
SHARDED = ("tar", "tfrecord")
#: Exit statuses of a process killed by SIGABRT, SIGBUS, SIGSEGV (negative from
#: subprocess; 128 + n from a shell).
KILLED = {-6, -7, -11, 134, 135, 139}


# -- packing and damaging ----------------------------------------------------------------


@pytest.fixture
def tree(tmp_path):
    """20 equal-sized images in 5 classes."""
    return build_tree(tmp_path / "src", uniform_spec(classes=("a", "b", "c", "d", "e"),
                                                     per_class=4), size=(16, 16))


def pack(src, out, **options) -> Path:
    """Pack; the path to open (the manifest of a sharded dataset)."""
    summary = fastdata.pack(src, out, options=fastdata.PackOptions(**options), progress=False)
    return Path(summary.output)


def packed(tree, tmp_path, fmt: str, **options) -> Path:
    return pack(tree.root, tmp_path / "out" / f"ds{EXTENSIONS[fmt]}", **options)


def verify_cli(path):
    return CliRunner().invoke(main, ["verify", str(path)])


def overwrite(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def sidecar(path: Path, what: str) -> Path:
    """The index (``"index"``) or keys (``"keys"``) file of a sharded dataset."""
    return path.parent / json.loads(path.read_text())["extra"][what]


def set_label(path: Path, fmt: str, index: int, value: int) -> None:
    """Change the stored label of one record, as damage would: its 8 bytes only."""
    if fmt == "hdf5":
        import h5py

        with h5py.File(path, "r") as f:
            at = f["labels"].id.get_offset()
        overwrite(path, at + 8 * index, struct.pack("<q", value))
    elif fmt == "lmdb":  # the whole value and its piece (key schema 1.1), which reads use
        labels = np.frombuffer(lmdb_get(path, b"__labels__"), dtype="<i8").copy()
        labels[index] = value
        piece = b"__labels__/%010d" % (index // 128)
        lmdb_put(path, {b"__labels__": labels.tobytes(),
                        piece: labels[index // 128 * 128:][:128].tobytes()})
    else:
        rows = np.load(sidecar(path, "index"), allow_pickle=False)
        rows["label"][index] = value
        np.save(sidecar(path, "index"), rows, allow_pickle=False)


def edit_manifest(path: Path, fmt: str, change) -> None:
    """Rewrite the stored manifest through ``change(dict)``."""
    if fmt == "lmdb":
        manifest = json.loads(lmdb_get(path, b"__manifest__"))
        change(manifest)
        lmdb_put(path, {b"__manifest__": json.dumps(manifest).encode()})
    elif fmt == "hdf5":
        import h5py

        with h5py.File(path, "r+") as f:
            dset = f["manifest"]
            manifest = json.loads(dset[()].decode().rstrip())
            change(manifest)
            text = json.dumps(manifest, separators=(",", ":"))
            dset[()] = text.ljust(dset.dtype.itemsize).encode()
    else:
        manifest = json.loads(path.read_text())
        change(manifest)
        path.write_text(json.dumps(manifest))


def as_packed_before_checksums(path: Path, fmt: str) -> None:
    """Make the dataset look packed before the per-array checksums existed
    (and the sharded index's per-piece ones)."""
    def change(manifest: dict) -> None:
        manifest["checksums"].pop("metadata_sha256", None)
        manifest.get("extra", {}).pop("index_pieces", None)
        manifest.get("extra", {}).pop("column_pieces", None)

    edit_manifest(path, fmt, change)


def first_use_error(path: Path) -> CorruptDataError:
    """The error of reading a damaged dataset's record 3 (the dataset opens: its
    index or columns are checked a piece at a time, when first used)."""
    ds = fastdata.open_dataset(path, decode=Decode(output="bytes"))
    with pytest.raises(CorruptDataError) as info:
        ds[3]
    return info.value


def shard_paths(path: Path) -> list[Path]:
    return [path.parent / s["path"] for s in json.loads(path.read_text())["shards"]]


# -- labels, CRC32s, offsets and keys under a checksum -------------------------------------


@pytest.mark.parametrize("fmt", sorted(EXTENSIONS))
@pytest.mark.parametrize("value", [10**15, 1], ids=["huge", "another-class"])
def test_a_changed_label_fails_on_first_use_and_in_verify(tree, tmp_path, fmt, value):
    path = packed(tree, tmp_path, fmt)
    set_label(path, fmt, 3, value)  # record 3 is of class 0
    error = first_use_error(path)
    if fmt in SHARDED:
        assert "rows 0..19 of the dataset index fail their CRC-32" in str(error)
        assert error.path == str(sidecar(path, "index"))
    else:
        assert "records 0..19 (piece 0) in the labels" in str(error)
        assert "fail their CRC-32" in str(error) and error.path == str(path)
    result = verify_cli(path)
    assert result.exit_code == 1 and "CRC-32" in result.output
    assert error.path in result.output


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_a_changed_label_of_a_file_without_pieces_fails_on_open(tree, tmp_path, fmt):
    path = packed(tree, tmp_path, fmt)
    edit_manifest(path, fmt, lambda m: m["extra"].pop("column_pieces"))  # checked whole
    set_label(path, fmt, 3, 1)
    with pytest.raises(CorruptDataError, match="SHA-256") as info:
        fastdata.open_dataset(path)
    assert info.value.path == str(path) and "labels" in str(info.value)
    result = verify_cli(path)
    assert result.exit_code == 1
    assert result.stderr.startswith("error:") and "SHA-256" in result.stderr
    assert str(path) in result.stderr


@pytest.mark.parametrize("fmt,name", [("lmdb", "__crc32__"), ("hdf5", "crc32"),
                                      ("hdf5", "offsets")])
def test_crc32_and_offset_arrays_are_covered(tree, tmp_path, fmt, name):
    path = packed(tree, tmp_path, fmt)
    if fmt == "lmdb":  # the piece reads use
        key = name.encode() + b"/0000000000"
        crcs = bytearray(lmdb_get(path, key))
        crcs[8] ^= 0x01
        lmdb_put(path, {key: bytes(crcs)})
    else:
        import h5py

        with h5py.File(path, "r") as f:
            at = f[name].id.get_offset() + f[name].dtype.itemsize * 5
        with open(path, "rb") as f:
            f.seek(at)
            byte = f.read(1)[0]
        overwrite(path, at, bytes([byte ^ 0x01]))
    with fastdata.formats.open_reader(path) as reader:  # checked by piece, when read
        with pytest.raises(CorruptDataError, match=f"{name}.*fail their CRC-32") as info:
            reader.read_many(range(len(reader)))
    assert info.value.path == str(path)
    assert verify_cli(path).exit_code == 1


def _damage_keys(path: Path, fmt: str) -> None:
    if fmt == "lmdb":
        keys = json.loads(lmdb_get(path, b"__keys__"))
        keys[2] = keys[2].replace("img", "IMG")
        lmdb_put(path, {b"__keys__": json.dumps(keys).encode()})
    elif fmt == "hdf5":
        import h5py

        with h5py.File(path, "r+") as f:
            f["keys"][2] = f["keys"].asstr()[2].replace("img", "IMG")
    else:
        keys_file = sidecar(path, "keys")
        keys_file.write_text(keys_file.read_text().replace("img002", "IMG002"))


@pytest.mark.parametrize("fmt", sorted(EXTENSIONS))
def test_damaged_keys_fail_when_loaded_and_in_verify(tree, tmp_path, fmt):
    path = packed(tree, tmp_path, fmt)
    _damage_keys(path, fmt)
    reader = fastdata.formats.open_reader(path)
    with pytest.raises(CorruptDataError, match="the keys.*SHA-256"):
        reader.keys
    reader.close()
    result = verify_cli(path)
    assert result.exit_code == 1, result.output
    assert "keys" in result.stdout and "SHA-256" in result.stdout


def test_verify_lists_a_damaged_record_without_a_key_when_the_keys_are_damaged(tree, tmp_path):
    path = packed(tree, tmp_path, "lmdb")
    _damage_keys(path, "lmdb")
    payload = bytearray(lmdb_get(path, b"%010d" % 3))
    payload[len(payload) // 2] ^= 0xFF
    lmdb_put(path, {b"%010d" % 3: bytes(payload)})
    result = verify_cli(path)
    assert result.exit_code == 1, result.output
    (line,) = [ln for ln in result.stdout.splitlines() if ln.startswith("  record 3")]
    # The record named once ("record 3: record 3 fails" before), no "(None)" for its key.
    assert line.startswith("  record 3 fails its CRC32 check (stored "), line


@pytest.mark.parametrize("fmt", ["hdf5", "tar"])
def test_missing_keys_are_damage_when_the_manifest_has_their_checksum(tree, tmp_path, fmt):
    path = packed(tree, tmp_path, fmt)
    if fmt == "hdf5":
        import h5py

        with h5py.File(path, "r+") as f:
            del f["keys"]
    else:
        sidecar(path, "keys").unlink()
    with fastdata.formats.open_reader(path) as reader:
        with pytest.raises(CorruptDataError, match="keys"):
            reader.keys
    assert verify_cli(path).exit_code == 1


@pytest.mark.parametrize("fmt", sorted(EXTENSIONS))
def test_datasets_packed_before_the_checksums_still_open(tree, tmp_path, fmt):
    path = packed(tree, tmp_path, fmt)
    as_packed_before_checksums(path, fmt)
    ds = fastdata.open_dataset(path, decode=Decode(output="bytes"))
    assert [ds[i] for i in range(len(ds))] == [(s.data, s.label) for s in tree.samples]
    assert ds.keys == tree.keys
    assert verify_dataset(path, progress=False).ok


@pytest.mark.parametrize("fmt", sorted(EXTENSIONS))
@pytest.mark.parametrize("value", [10**15, 5, -1])
def test_a_label_outside_the_classes_is_refused_without_checksums(tree, tmp_path, fmt, value):
    path = packed(tree, tmp_path, fmt)
    as_packed_before_checksums(path, fmt)
    set_label(path, fmt, 3, value)
    if fmt in SHARDED:
        error = first_use_error(path)
    else:
        with pytest.raises(CorruptDataError) as info:
            fastdata.open_dataset(path)
        error = info.value
    assert "not a class index" in str(error)
    assert f"record 3 has label {value}" in str(error)
    assert error.record == 3


def test_a_label_changed_within_the_classes_disagrees_with_the_class_counts(tree, tmp_path):
    path = packed(tree, tmp_path, "lmdb")
    as_packed_before_checksums(path, "lmdb")
    set_label(path, "lmdb", 3, 1)
    with pytest.raises(CorruptDataError, match="manifest counts"):
        fastdata.open_dataset(path)


def test_a_negative_label_in_a_foreign_tar_is_refused(tmp_path):
    shard = tmp_path / "theirs.tar"
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for stem, label in (("s0", b"0"), ("s1", b"-1")):
            for ext, data in (("png", b"not really a png"), ("cls", label)):
                info = tarfile.TarInfo(f"{stem}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with pytest.raises(CorruptDataError, match="record 1 has label -1, not a class index"):
        fastdata.formats.open_reader(shard)


# -- a copied index row --------------------------------------------------------------------


def copy_row(path: Path, source: int, target: int) -> None:
    rows = np.load(sidecar(path, "index"), allow_pickle=False)
    rows[target] = rows[source]
    np.save(sidecar(path, "index"), rows, allow_pickle=False)


@pytest.mark.parametrize("fmt", SHARDED)
def test_a_copied_index_row_is_refused_on_first_use(tree, tmp_path, fmt):
    path = packed(tree, tmp_path, fmt, shard_size=8)
    copy_row(path, 7, 10)
    error = first_use_error(path)
    assert "dataset index fail their CRC-32" in str(error)
    assert error.path == str(sidecar(path, "index"))
    result = verify_cli(path)
    assert result.exit_code == 1 and str(sidecar(path, "index")) in result.output


@pytest.mark.parametrize("fmt", SHARDED)
@pytest.mark.parametrize("source,target", [(8, 10), (9, 10)])
def test_verify_finds_a_copied_row_in_an_index_without_checksum(tree, tmp_path, fmt, source,
                                                                target):
    # Rows of one class (8-11) and one shard (0-15): labels and counts stay right.
    path = packed(tree, tmp_path, fmt, shard_size=16)
    as_packed_before_checksums(path, fmt)
    copy_row(path, source, target)
    result = verify_dataset(path, progress=False)
    assert not result.ok
    rows = [p for p in result.problems if p["index"] == target]
    assert rows and f"index row {target} " in rows[0]["reason"]
    assert rows[0]["path"] == str(sidecar(path, "index"))
    cli = verify_cli(path)
    assert cli.exit_code == 1 and f"record {target} " in cli.stdout


def test_tfrecord_mismatch_names_the_record_and_the_byte_offset_apart(tree, tmp_path):
    path = packed(tree, tmp_path, "tfrecord")
    as_packed_before_checksums(path, "tfrecord")
    rows = np.load(sidecar(path, "index"), allow_pickle=False)
    offset = int(rows["offset"][10])
    rows["size"][10] -= 1  # still in order, no overlap: only the shard can tell
    np.save(sidecar(path, "index"), rows, allow_pickle=False)
    result = verify_dataset(path, progress=False)
    records = [p for p in result.problems if p["index"] is not None]
    assert [p["index"] for p in records] == [10], result.problems
    reason = records[0]["reason"]
    assert f"record 10 at byte offset {offset}" in reason
    assert f"record {offset}" not in reason
    # The shard's .idx still says the old size: that is a problem of its own.
    assert any(p["path"].endswith(".idx") for p in result.problems)


# -- verify checks every byte the manifest covers ---------------------------------------------


def _tar_damage(shard: Path, kind: str) -> None:
    with tarfile.open(shard) as tar:
        members = tar.getmembers()
    image = next(m for m in members if not m.name.endswith(".cls") and m.size % 512)
    label = next(m for m in members if m.name.endswith(".cls") and m.size == 1)
    if kind == "header":
        overwrite(shard, image.offset + 140, b"7")  # a digit of the mtime field
    elif kind == "padding":
        overwrite(shard, image.offset_data + image.size, b"\x01")
    elif kind == "cls":
        overwrite(shard, label.offset_data, b"9")  # the index keeps the right label
    elif kind == "end":
        overwrite(shard, shard.stat().st_size - 10, b"\x01")
    else:
        with open(shard, "ab") as f:
            f.write(b"\0" * 512)


@pytest.mark.parametrize("kind", ["header", "padding", "cls", "end", "appended"])
def test_verify_checks_every_byte_of_a_tar_shard(tree, tmp_path, kind):
    path = packed(tree, tmp_path, "tar", shard_size=6)
    shard = shard_paths(path)[1]
    _tar_damage(shard, kind)
    as_bytes = fastdata.open_dataset(path, decode=Decode(output="bytes"))
    assert as_bytes[7][0] == tree.samples[7].data
    result = verify_dataset(path, progress=False)
    assert result.checked == result.count  # every record is fine, the shard is not
    assert [p.get("path") for p in result.problems] == [str(shard)]
    assert ("SHA-256" if kind != "appended" else "the manifest says") in result.problems[0][
        "reason"]
    cli = verify_cli(path)
    assert cli.exit_code == 1
    assert cli.stdout.splitlines()[1:] == [f"  {shard}: {result.problems[0]['reason']}"]


@pytest.mark.parametrize("kind", ["changed", "missing", "longer", "shorter"])
def test_verify_checks_tfrecord_idx_files(tree, tmp_path, kind):
    path = packed(tree, tmp_path, "tfrecord", shard_size=8)
    idx = Path(f"{shard_paths(path)[1]}.idx")
    lines = idx.read_text().splitlines(keepends=True)
    if kind == "changed":
        offset, size = lines[2].split()
        lines[2] = f"{offset} {int(size) + 1}\n"
    elif kind == "longer":
        lines.append(lines[-1])
    elif kind == "shorter":
        lines = lines[:-1]
    if kind == "missing":
        idx.unlink()
    else:
        idx.write_text("".join(lines))
    result = verify_dataset(path, progress=False)
    assert [p.get("path") for p in result.problems] == [str(idx)]
    if kind == "changed":
        assert "line 3 reads" in result.problems[0]["reason"]
    assert verify_cli(path).exit_code == 1


@pytest.mark.parametrize("fmt", SHARDED)
def test_verify_reports_a_shard_from_another_pack(tree, tmp_path, fmt):
    # The same images under other names of the same length: every record of the
    # other pack's shard reads back right, only the shard's SHA-256 differs.
    other = tmp_path / "other"
    for sample in tree.samples:
        target = other / sample.key.replace("img", "pic")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(sample.data)
    path = packed(tree, tmp_path, fmt, shard_size=6)
    theirs = pack(other, tmp_path / "theirs" / f"ds{EXTENSIONS[fmt]}", shard_size=6)
    mixed = shard_paths(path)[2]
    shutil.copyfile(shard_paths(theirs)[2], mixed)
    result = verify_dataset(path, progress=False)
    assert result.checked == result.count
    assert [p.get("path") for p in result.problems] == [str(mixed)]
    assert "another pack" in result.problems[0]["reason"]
    assert verify_cli(path).exit_code == 1


# -- a damaged LMDB never aborts the process ------------------------------------------------------


PAGE = 4096


@pytest.fixture
def lmdb_pages(tmp_path):
    """48 records of ~1.2 KB (two per leaf page) packed into LMDB: (path, data.mdb)."""
    src = build_tree(tmp_path / "src48", uniform_spec(per_class=16, exts=(".bmp",)),
                     size=(20, 20))
    path = pack(src.root, tmp_path / "pages.lmdb")
    return path, path / "data.mdb"


def leaf_pages_of(data: bytes, record: int) -> list[tuple[int, int]]:
    """(page number, position of the key) of every leaf page holding record's key
    (the live page and any stale copy: damage to all hits the live one)."""
    needle = struct.pack("<H", 10) + b"%010d" % record  # node's key size, then the key
    out, pos = [], data.find(needle)
    while pos >= 0:
        page = pos // PAGE
        if struct.unpack_from("<H", data, page * PAGE + 10)[0] & 0x02:  # P_LEAF
            out.append((page, pos + 2))
        pos = data.find(needle, pos + 1)
    return out


def run_verify(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastdata.cli", "verify", str(path)],
                          capture_output=True, text=True, timeout=120)


_OPEN_CACHES = """
    import sys
    import fastdata
    for path in sys.argv[1:]:
        for cache in ("ram", "decoded"):
            try:
                fastdata.open_dataset(path, cache=cache, decode=fastdata.Decode(size=(20, 20)))
                print(cache, "NO-ERROR")
            except fastdata.FastDataError as exc:
                print(cache, type(exc).__name__, exc)
    """


@pytest.mark.slow
@pytest.mark.parametrize("where", ["page-header", "page-tail"])
def test_zeroed_lmdb_pages_give_an_error_never_an_abort(lmdb_pages, where):
    path, data_file = lmdb_pages
    original = data_file.read_bytes()
    copies = []
    for record in (0, 20, 41):
        copy = path.with_name(f"{where}-{record}.lmdb")
        shutil.copytree(path, copy)
        data = bytearray(original)
        for page, _ in leaf_pages_of(original, record):
            at = page * PAGE + (0 if where == "page-header" else PAGE - 512)
            data[at:at + 512] = bytes(512)
        (copy / "data.mdb").write_bytes(data)
        proc = run_verify(copy)
        assert proc.returncode == 1, (record, proc.returncode, proc.stderr[-500:])
        assert f"{copy}:" in proc.stdout and "damaged" in proc.stdout
        if where == "page-header":  # every record of the page is unreadable
            assert f"record {record} " in proc.stdout, proc.stdout
        copies.append(copy)
    caches = run_python(_OPEN_CACHES, *map(str, copies))
    assert caches.returncode == 0, (caches.returncode, caches.stderr[-500:])
    lines = caches.stdout.splitlines()
    assert len(lines) == 2 * len(copies), caches.stdout
    for line, copy in zip(lines, [c for c in copies for _ in range(2)]):
        assert " CorruptDataError " in line and str(copy) in line, line


@pytest.mark.slow
def test_zeroed_bytes_anywhere_in_an_lmdb_never_abort_verify(lmdb_pages):
    path, data_file = lmdb_pages
    original = data_file.read_bytes()
    size = len(original)
    for at in (8192, 8192 + 1536, size // 2, size // 2 + 2048, size - 4096, size - 512):
        data = bytearray(original)
        data[at:at + 512] = bytes(512)
        data_file.write_bytes(data)
        proc = run_verify(path)
        assert proc.returncode not in KILLED and proc.returncode in (0, 1), (at, proc.stderr)
        assert "Traceback" not in proc.stderr, (at, proc.stderr[-1000:])


@pytest.mark.slow
def test_a_death_of_the_lmdb_library_is_an_error_naming_the_file(lmdb_pages):
    path, data_file = lmdb_pages
    data = bytearray(data_file.read_bytes())
    # The current meta page (the higher txnid) names the root, a branch page;
    # its second node pointer sent past the page makes LMDB read past the file.
    txnids = [struct.unpack_from("<Q", data, meta * PAGE + 144)[0] for meta in (0, 1)]
    root = struct.unpack_from("<Q", data, txnids.index(max(txnids)) * PAGE + 128)[0]
    assert struct.unpack_from("<H", data, root * PAGE + 10)[0] & 0x01  # P_BRANCH
    struct.pack_into("<H", data, root * PAGE + 16 + 2, 0xFF00)
    data_file.write_bytes(data)
    proc = run_verify(path)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-500:])
    line = proc.stdout.splitlines()[1]
    assert line.startswith(f"  {data_file}: the lmdb library died reading it (SIG"), line
    assert "re-pack it" in line
    caches = run_python(_OPEN_CACHES, str(path))
    assert caches.returncode == 0, (caches.returncode, caches.stderr[-500:])
    for line in caches.stdout.splitlines():
        assert f"CorruptDataError {data_file}: the lmdb library died" in line, line


def test_lmdb_walks_run_here_when_no_child_process_can_start(lmdb_pages, monkeypatch):
    path, _ = lmdb_pages
    monkeypatch.setattr(sys, "executable", str(path / "no-such-python"))
    assert verify_dataset(path, progress=False).ok
    ds = fastdata.open_dataset(path, cache="ram", decode=Decode(output="bytes"))
    assert ds[5] == fastdata.open_dataset(path, decode=Decode(output="bytes"))[5]
