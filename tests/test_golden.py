"""Golden packs: a fixed source and fixed options give the same records and files.

``tests/golden/src`` is a small committed image folder (its bytes never depend
on an encoder's version). It is packed into every built-in format, plain, with
pack-time ``--resize`` and with ``--encoding raw``, and sharded; the digests of
what comes out are compared with ``tests/golden/expected.json``:

- sharded formats (tar, TFRecord): every file's SHA-256 (shards, ``.idx``,
  index and keys sidecars, tar's ``_info.json``) — byte-identical output;
- LMDB: every key and value except the manifest;
- HDF5: every dataset's values except the manifest;
- and for every format the manifest without the fields that name the time,
  the machine's paths and the fastdata version.

Resized and raw packs go through a decoder, a resize and (for --resize) an
encoder, whose output may change with those libraries' versions: those cases
compare only when Pillow, OpenCV and numpy are the versions the digests were
made with, and say so when skipped. The plain packs always compare.

Regenerate (only when an on-disk change is intended, and say so in the commit):
``python tests/test_golden.py --write``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
from ci_needs import missing

HERE = Path(__file__).parent / "golden"
SOURCE = HERE / "src"
EXPECTED = HERE / "expected.json"

#: (case name, output file name, pack options as keyword arguments)
CASES = [
    ("lmdb", "out.lmdb", {}),
    ("hdf5", "out.h5", {}),
    ("tfrecord", "out.tfrecord", {}),
    ("tar", "out.tar", {}),
    ("tfrecord-sharded", "out.tfrecord", {"shard_size": 5}),
    ("tar-sharded", "out-%06d.tar", {"shard_size": 5}),
    ("lmdb-resize", "out.lmdb", {"resize": "12"}),
    ("hdf5-resize", "out.h5", {"resize": "12"}),
    ("tfrecord-resize", "out.tfrecord", {"resize": "12"}),
    ("tar-resize", "out.tar", {"resize": "12"}),
    ("lmdb-raw", "out.lmdb", {"resize": "16x16", "encoding": "raw"}),
    ("hdf5-raw", "out.h5", {"resize": "16x16", "encoding": "raw"}),
    ("tfrecord-raw", "out.tfrecord", {"resize": "16x16", "encoding": "raw"}),
    ("tar-raw", "out-%06d.tar", {"resize": "16x16", "encoding": "raw", "shard_size": 4}),
]

#: Manifest fields that differ between two runs of the same pack.
_VOLATILE = ("created_at", "fastdata_version")


def _library_versions() -> dict[str, str]:
    import cv2
    import numpy
    import PIL

    return {"Pillow": PIL.__version__, "opencv": cv2.__version__, "numpy": numpy.__version__}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest_digest(manifest: dict) -> dict:
    m = {k: v for k, v in manifest.items() if k not in _VOLATILE}
    m["source"] = {k: v for k, v in m["source"].items() if k != "root"}
    return m


def _lmdb_digest(path: Path) -> dict:
    import lmdb

    env = lmdb.open(str(path), readonly=True, lock=False, subdir=True)
    try:
        with env.begin() as txn:
            items = {bytes(k).decode(): bytes(v) for k, v in txn.cursor()}
    finally:
        env.close()
    manifest = json.loads(items.pop("__manifest__"))
    return {"records": {k: _sha(v) for k, v in items.items()},
            "manifest": _manifest_digest(manifest)}


def _hdf5_digest(path: Path) -> dict:
    import h5py

    with h5py.File(path, "r") as f:
        datasets = {}
        for name in f:
            if name == "manifest":
                continue
            value = f[name][()]
            if name == "keys":
                datasets[name] = _sha(json.dumps([k.decode() for k in value]).encode())
            else:
                datasets[name] = _sha(value.tobytes())
        attrs = {k: str(v) for k, v in f.attrs.items()}
        raw = f["manifest"][()]
    manifest = json.loads(raw.decode().rstrip() if isinstance(raw, bytes) else raw.rstrip())
    return {"datasets": datasets, "attrs": attrs, "manifest": _manifest_digest(manifest)}


def _sharded_digest(folder: Path) -> dict:
    files = {}
    manifest = None
    for p in sorted(folder.iterdir()):
        if p.name.endswith(".fastdata.json"):
            manifest = json.loads(p.read_text(encoding="utf-8"))
        elif not p.name.endswith(".report.json"):
            files[p.name] = _sha(p.read_bytes())
    return {"files": files, "manifest": _manifest_digest(manifest)}


def pack_case(out_dir: Path, name: str, options: dict) -> dict:
    """Pack the golden source with ``options`` into ``out_dir``; its digest."""
    import fastdata
    from fastdata.packers.pack import PackOptions
    from fastdata.packers.preprocess import Preprocess, parse_resize

    pre = Preprocess(resize=parse_resize(options.get("resize")),
                     encoding=options.get("encoding", "keep"))
    opts = PackOptions(shard_size=options.get("shard_size"), preprocess=pre, workers=1)
    out = out_dir / name
    fastdata.pack(str(SOURCE), str(out), options=opts, progress=False)
    if name.endswith(".lmdb"):
        return _lmdb_digest(out)
    if name.endswith(".h5"):
        return _hdf5_digest(out)
    return _sharded_digest(out_dir)


def _expected() -> dict:
    return json.loads(EXPECTED.read_text(encoding="utf-8"))


@pytest.mark.parametrize("case,name,options", CASES, ids=[c[0] for c in CASES])
def test_golden_pack(tmp_path, case, name, options):
    expected = _expected()
    if options.get("resize") and expected["libraries"] != _library_versions():
        missing(f"digests were made with {expected['libraries']}, this is "
                f"{_library_versions()}: decoded pixels may differ (.ci/constraints.txt pins "
                f"the versions)")
    got = pack_case(tmp_path, name, options)
    assert got == expected["cases"][case]


def _write() -> None:
    import tempfile

    cases = {}
    for case, name, options in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            cases[case] = pack_case(Path(tmp), name, options)
    EXPECTED.write_text(json.dumps({"libraries": _library_versions(), "cases": cases},
                                   indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {EXPECTED} ({len(cases)} cases)")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_golden.py --write")
    os.chdir(Path(__file__).parent.parent)
    _write()
