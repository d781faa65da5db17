"""The hostile-names engine: datasets and lists whose names lead outside them,
opened by every command, with every open of a file outside watched.

``python bench/fuzz.py --hostile`` is the full form (counts by field and by
command) and ``tests/test_contained.py`` runs it too. A *case* is one packed
dataset (or list) with one name changed: a manifest field (``shards[0].path``,
``extra.index``, ``extra.keys``, ``extra.metadata.index``) set to a hostile
value, a file the dataset names (or a TFRecord shard's ``.idx``) replaced by a
symbolic link to a file outside,
an HDF5 dataset stored in another file, or a list's image path. The hostile
values: an absolute path, ``../`` and ``sub/../../`` out of the folder, an
http URL on a second server, an s3:// and a file:// URL, a NUL, a terminal
escape, backslashes, a Windows drive. Every file they lead to exists outside
the dataset, in the folder ``outside/``, as a copy of the file it stands for,
so that a reader that followed one would read real records.

Each case is opened by every command that applies (``open_dataset``, a
``ShardedIterableDataset``, ``verify_dataset``, ``fastdata info``,
``fastdata.convert``, the RAM cache fill, DALI's pipeline when DALI is
installed, ``open_dataset`` over HTTP for sharded formats; ``pack`` for lists)
while inotify watches ``outside/`` for any open or read of a file there, and a
second HTTP server counts the requests that reach it. Outcomes:

- ``refused``: a FastDataError whose message names the field (or the line),
  nothing outside opened, no request to the second server;
- ``unclear``: refused so, but the message does not name the field;
- ``read-outside``: a file outside was opened, or the second server was asked;
- ``accepted``: no error (the hostile name was taken);
- ``crash``: another exception.

Everything but ``refused`` is a bug.
"""

from __future__ import annotations

import ctypes
import http.server
import json
import os
import shutil
import struct
import threading
import traceback
from dataclasses import dataclass, field

OUTCOMES = ("refused", "unclear", "read-outside", "accepted", "crash")
FAILURES = OUTCOMES[1:]
SHARDED = ("tar", "tfrecord")
#: format -> output name as packed.
DATASETS = {"tar": "x-%06d.tar", "tfrecord": "x-%05d.tfrecord", "lmdb": "x.lmdb", "hdf5": "x.h5"}
LISTS = ("csv", "jsonl", "parquet")


# -- watching for opens outside --------------------------------------------------------------

_IN_ACCESS, _IN_OPEN = 0x1, 0x20


class OpenWatch:
    """inotify on one folder: every open or read of a file in it, by any process."""

    def __init__(self, folder: str) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        if libc.inotify_add_watch(self.fd, os.fsencode(folder), _IN_OPEN | _IN_ACCESS) < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {folder} failed")

    def events(self) -> list[str]:
        """Names opened or read since the last call (the folder itself as '.')."""
        names = []
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return names
            pos = 0
            while pos < len(data):
                _wd, _mask, _cookie, length = struct.unpack_from("iIII", data, pos)
                raw = data[pos + 16:pos + 16 + length].rstrip(b"\0")
                names.append(raw.decode("utf-8", "replace") or ".")
                pos += 16 + length

    def close(self) -> None:
        os.close(self.fd)


class _Counting(http.server.BaseHTTPRequestHandler):
    hits: list = []

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (the http.server name)
        self.hits.append(self.path)
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET


def _serve(handler) -> tuple[http.server.ThreadingHTTPServer, str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


# -- the pristine datasets ---------------------------------------------------------------------

@dataclass
class World:
    """The work folder: pristine datasets, ``outside/`` and the two servers."""

    work: str
    pristine: dict = field(default_factory=dict)   # format -> (folder, name to open)
    lists: dict = field(default_factory=dict)      # list kind -> list file
    serving: str = ""                              # URL of the server of ``work``
    other: str = ""                                # URL of the second server
    servers: list = field(default_factory=list)

    @property
    def outside(self) -> str:
        return os.path.join(self.work, "outside")

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()


def build(work: str, *, formats=tuple(DATASETS), lists=LISTS) -> World:
    """Pack a small source with metadata into every format, write every list
    kind, and start the servers."""
    import fastdata
    from fastdata.demo import synthesize

    world = World(work)
    os.makedirs(world.outside, exist_ok=True)
    src = os.path.join(work, "src")
    synthesize(src, kind="tiny", n=12, classes=3, progress=False)
    images = sorted(os.path.relpath(os.path.join(d, n), src).replace(os.sep, "/")
                    for d, _, names in os.walk(src) for n in names)
    listed = os.path.join(src, "list.jsonl")
    with open(listed, "w", encoding="utf-8") as f:
        for rel in images:
            f.write(json.dumps({"path": rel, "label": rel.split("/")[0], "n": 1}) + "\n")
    for fmt in formats:
        folder = os.path.join(work, "pristine", fmt)
        options = fastdata.PackOptions(workers=1, shard_size=6 if fmt in SHARDED else None)
        summary = fastdata.pack(listed, os.path.join(folder, DATASETS[fmt]), options=options,
                                progress=False)
        world.pristine[fmt] = (folder, os.path.basename(summary.output))
    for kind in lists:
        world.lists[kind] = _write_list(kind, src, images)
    shutil.copy(os.path.join(src, images[0]), os.path.join(world.outside, "secret.png"))
    server, world.other = _serve(_Counting)
    world.servers.append(server)
    from servers import RangeHandler

    handler = lambda *a, **k: RangeHandler(*a, directory=work, **k)  # noqa: E731
    server, world.serving = _serve(handler)
    world.servers.append(server)
    return world


def _write_list(kind: str, src: str, images: list[str]) -> str:
    path = os.path.join(src, f"list.{kind}")
    rows = [{"path": rel, "label": rel.split("/")[0]} for rel in images]
    if kind == "csv":
        import csv

        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, ["path", "label"])
            writer.writeheader()
            writer.writerows(rows)
    elif kind == "jsonl":
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        image = pa.array([{"bytes": None, "path": r["path"]} for r in rows],
                         pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
        pq.write_table(pa.table({"image": image, "label": [r["label"] for r in rows]}), path)
    return path


# -- the cases ----------------------------------------------------------------------------

#: Name -> how it is written, from (the absolute secret path, its path relative
#: to the folder holding the name, the second server's URL).
VALUES = {
    "absolute": lambda secret, rel, other: secret,
    "dotdot": lambda secret, rel, other: rel,
    "inner-dotdot": lambda secret, rel, other: "sub/../" + rel,
    "http-other-host": lambda secret, rel, other: f"{other}/{os.path.basename(secret)}",
    "s3-url": lambda secret, rel, other: f"s3://other-bucket/{os.path.basename(secret)}",
    "file-url": lambda secret, rel, other: "file://" + secret,
    "nul": lambda secret, rel, other: rel.replace("/", "/\x00", 1),
    "escape": lambda secret, rel, other: "\x1b[2J" + os.path.basename(secret),
    "backslash": lambda secret, rel, other: rel.replace("/", "\\"),
    "drive": lambda secret, rel, other: "C:\\" + os.path.basename(secret),
}
SHARDED_FIELDS = ("shards[0].path", "extra.index", "extra.keys", "extra.metadata.index")


@dataclass(frozen=True)
class Case:
    kind: str       # a format or a list kind
    field: str      # what was changed
    value: str      # a VALUES name, "symlink", or an HDF5 storage kind

    @property
    def name(self) -> str:
        return f"{self.kind}/{self.field}/{self.value}"


def cases(world: World) -> list[Case]:
    out = []
    for fmt in world.pristine:
        if fmt in SHARDED:
            for name in SHARDED_FIELDS:
                out += [Case(fmt, name, v) for v in (*VALUES, "symlink")]
            if fmt == "tfrecord":
                out.append(Case(fmt, "shard .idx", "symlink"))
        else:
            out += [Case(fmt, "shards[0].path", v) for v in VALUES]
            if fmt == "lmdb":
                out.append(Case(fmt, "data.mdb", "symlink"))
            else:
                out += [Case(fmt, "payload", v) for v in ("external", "external-link", "virtual")]
    for kind in world.lists:
        out += [Case(kind, "path", v) for v in (*VALUES, "symlink")]
    return out


def _field_file(manifest: dict, field_name: str) -> str:
    if field_name == "shards[0].path":
        return manifest["shards"][0]["path"]
    holder = manifest["extra"]
    for part in field_name.split(".")[1:-1]:
        holder = holder[part]
    return holder[field_name.split(".")[-1]]


def _set_field(manifest: dict, field_name: str, value: str) -> None:
    if field_name == "shards[0].path":
        manifest["shards"][0]["path"] = value
        return
    holder = manifest["extra"]
    for part in field_name.split(".")[1:-1]:
        holder = holder[part]
    holder[field_name.split(".")[-1]] = value


def prepare(world: World, case: Case, folder: str) -> str:
    """The case's dataset (or list) under ``folder``: what the commands open."""
    if case.kind in LISTS:
        return _prepare_list(world, case, folder)
    pristine, opened = world.pristine[case.kind]
    shutil.copytree(pristine, folder)
    path = os.path.join(folder, opened)
    secret = os.path.join(world.outside, f"{case.kind}-{case.field}-{case.value}")
    if case.kind in SHARDED:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
        if case.field == "shard .idx":
            target = os.path.join(folder, manifest["shards"][0]["path"] + ".idx")
        else:
            target = os.path.join(folder, _field_file(manifest, case.field))
        shutil.copy(target, secret)  # a read outside would find real data
        if case.value == "symlink":
            os.remove(target)
            os.symlink(secret, target)
            return path
        _set_field(manifest, case.field, _value(case.value, secret, folder, world))
        with open(path, "w", encoding="utf-8") as f:
            json.dump(manifest, f)
        return path
    if case.kind == "lmdb":
        return _prepare_lmdb(world, case, path, secret)
    return _prepare_hdf5(world, case, path, secret)


def _value(name: str, secret: str, folder: str, world: World) -> str:
    return VALUES[name](secret, os.path.relpath(secret, folder).replace(os.sep, "/"),
                        world.other)


def _prepare_lmdb(world: World, case: Case, path: str, secret: str) -> str:
    import lmdb

    data = os.path.join(path, "data.mdb")
    shutil.copy(data, secret)
    if case.value == "symlink":
        os.remove(data)
        os.symlink(secret, data)
        return path
    env = lmdb.open(path, subdir=True, lock=False)
    with env.begin(write=True) as txn:
        manifest = json.loads(txn.get(b"__manifest__"))
        manifest["shards"][0]["path"] = _value(case.value, secret, path, world)
        txn.put(b"__manifest__", json.dumps(manifest).encode())
    env.close()
    return path


def _prepare_hdf5(world: World, case: Case, path: str, secret: str) -> str:
    import h5py
    import numpy as np

    with h5py.File(path, "r+") as f:
        if case.field == "shards[0].path":
            manifest = json.loads(f["manifest"][()])
            manifest["shards"][0]["path"] = _value(case.value, secret, os.path.dirname(path),
                                                   world)
            del f["manifest"]
            f["manifest"] = json.dumps(manifest)
            return path
        payload = f["payload"][()]
        np.asarray(payload).tofile(secret)
        del f["payload"]
        if case.value == "external":
            f.create_dataset("payload", shape=payload.shape, dtype="u1",
                             external=[(secret, 0, payload.nbytes)])
            return path
        other = secret + ".h5"
        with h5py.File(other, "w") as g:
            g["payload"] = payload
        if case.value == "external-link":
            f["payload"] = h5py.ExternalLink(other, "/payload")
        else:
            layout = h5py.VirtualLayout(shape=payload.shape, dtype="u1")
            layout[:] = h5py.VirtualSource(other, "payload", shape=payload.shape)
            f.create_virtual_dataset("payload", layout)
    return path


def _prepare_list(world: World, case: Case, folder: str) -> str:
    src = os.path.dirname(world.lists[case.kind])
    shutil.copytree(src, folder, ignore=shutil.ignore_patterns("list.*"))
    secret = os.path.join(world.outside, "secret.png")
    if case.value == "symlink":
        os.symlink(secret, os.path.join(folder, "link.png"))
        hostile = "link.png"
    else:
        hostile = _value(case.value, secret, folder, world)
    path = os.path.join(folder, os.path.basename(world.lists[case.kind]))
    rows = [{"path": hostile, "label": "class_000"}]
    if case.kind == "csv":
        import csv

        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, ["path", "label"])
            writer.writeheader()
            writer.writerows(rows)
    elif case.kind == "jsonl":
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        image = pa.array([{"bytes": None, "path": hostile}],
                         pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
        pq.write_table(pa.table({"image": image, "label": ["class_000"]}), path)
    return path


# -- the commands -------------------------------------------------------------------------

def _open_dataset(path, out):
    import fastdata

    with fastdata.open_dataset(path, decode=fastdata.Decode(output="bytes")) as ds:
        ds[0]


def _stream(path, out):
    import fastdata

    next(iter(fastdata.ShardedIterableDataset(path, decode=fastdata.Decode(output="bytes"))))


def _verify(path, out):
    from fastdata.ops.verify import verify_dataset

    verify_dataset(path, progress=False)


def _info(path, out):
    from click.testing import CliRunner

    from fastdata.cli import main

    result = CliRunner().invoke(main, ["info", path])
    if isinstance(result.exception, SystemExit) and result.exit_code == 1:
        from fastdata.errors import FastDataError

        raise FastDataError(result.output)  # the one-line error the command printed
    if result.exception is not None:
        raise result.exception


def _convert(path, out):
    import fastdata

    fastdata.convert(path, os.path.join(out, "converted.lmdb"),
                     options=fastdata.PackOptions(workers=1), progress=False)


def _cache(path, out):
    import fastdata

    with fastdata.open_dataset(path, decode=fastdata.Decode(output="bytes"), cache="ram",
                               progress=False) as ds:
        ds[0]


def _dali(path, out):
    import fastdata
    from fastdata.dali.pipeline import build_pipeline

    build_pipeline(path, order=fastdata.Order(batch_size=2), device="cpu")


def _pack(path, out):
    import fastdata

    fastdata.pack(path, os.path.join(out, "packed.lmdb"),
                  options=fastdata.PackOptions(workers=1), progress=False)


def _dali_installed() -> bool:
    import optional

    return optional.available("dali")


def commands(case: Case, world: World) -> dict:
    """The commands that apply to ``case``: name -> fn(path, scratch folder)."""
    if case.kind in LISTS:
        return {"pack": _pack}
    if case.field == "shard .idx":  # read by verify and by DALI's TFRecord reader only
        return {"verify": _verify, **({"dali": _dali} if _dali_installed() else {})}
    out = {"open_dataset": _open_dataset, "verify": _verify, "info": _info,
           "convert": _convert, "cache": _cache}
    if case.kind in SHARDED:
        out["stream"] = _stream
        if case.value != "symlink":  # a server's own links are the server's business
            out["open_dataset (http)"] = "http"
    if _dali_installed():
        out["dali"] = _dali
    return out


def expected_words(case: Case) -> str:
    """What a refusal's message must name."""
    if case.kind in LISTS:
        return "line 2" if case.kind == "csv" else "line 1" if case.kind == "jsonl" else "row 0"
    if case.field == "payload":
        return "'payload'"
    if case.field == "shard .idx":
        return ".idx'"
    return case.field


def run_case(world: World, case: Case, folder: str, watch: OpenWatch) -> dict:
    """Every command on one case: command -> (outcome, detail)."""
    from fastdata.errors import FastDataError

    path = prepare(world, case, folder)
    scratch = folder + ".out"
    os.makedirs(scratch, exist_ok=True)
    watch.events()  # the preparation's own opens
    _Counting.hits.clear()
    results = {}
    for name, fn in commands(case, world).items():
        target = path
        if fn == "http":
            target = world.serving + "/" + os.path.relpath(path, world.work).replace(os.sep, "/")
            fn = _open_dataset
        error = None
        try:
            fn(target, scratch)
        except FastDataError as exc:
            error = exc
        except Exception:  # noqa: BLE001 (a crash is an outcome here)
            results[name] = ("crash", traceback.format_exc(limit=3)[-600:])
            watch.events()
            _Counting.hits.clear()
            continue
        seen, hits = watch.events(), list(_Counting.hits)
        _Counting.hits.clear()
        if seen or hits:
            results[name] = ("read-outside", f"opened outside: {seen[:3]}, second server: "
                                             f"{hits[:3]}; error: {error}")
        elif error is None:
            results[name] = ("accepted", "no error")
        elif expected_words(case) not in str(error):
            results[name] = ("unclear", str(error)[:300])
        else:
            results[name] = ("refused", str(error)[:300])
    return results


def run(world: World, selected: list[Case] | None = None) -> list[dict]:
    """Every case (or ``selected``): one dict per case and command."""
    watch = OpenWatch(world.outside)
    rows = []
    try:
        for n, case in enumerate(selected if selected is not None else cases(world)):
            folder = os.path.join(world.work, "cases", str(n))
            for command, (outcome, detail) in run_case(world, case, folder, watch).items():
                rows.append({"case": case.name, "kind": case.kind, "field": case.field,
                             "value": case.value, "command": command, "outcome": outcome,
                             "detail": detail})
    finally:
        watch.close()
    return rows
