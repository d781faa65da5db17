"""A dataset stays inside itself: names that lead outside are refused before
anything is opened, remote reads stay on the dataset's host and within the
sizes the manifest gives, and credentials never reach output.

The campaign over every field, hostile value and command is the engine in
``tests/hostile_names.py`` (``python bench/fuzz.py --hostile``): inotify
watches the files outside, a second HTTP server counts the requests it gets.
"""

from __future__ import annotations

import base64
import collections
import http.server
import json
import os
import shutil
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

import fastdata
import fastdata.storage
from fastdata.cli import main
from fastdata.contained import name_problem
from fastdata.errors import FastDataError, StorageError, UnsafeNameError
from fastdata.ops.verify import verify_dataset

import hostile_names
from conftest import build_tree, uniform_spec
from servers import RangeHandler

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the opens outside are watched with inotify (Linux)")

SECRET = "s3cr3tPW9"
#: Samples as the stored bytes, undecoded.
BYTES = fastdata.Decode(output="bytes")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    world = hostile_names.build(str(tmp_path_factory.mktemp("hostile")))
    yield world
    world.close()


# -- the names ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["/etc/passwd", "../x.tar", "sub/../../x.tar", "a/../b.tar",
                                  "./x.tar", "a//b.tar", "s3://b/x.tar", "http://h/x.tar",
                                  "file:///x.tar", "x\x00.tar", "x\x1b[2J.tar", "x\x85.tar",
                                  "..\\x.tar", "C:x.tar", ""])
def test_names_that_leave_the_folder_are_refused(name):
    assert name_problem(name) is not None


@pytest.mark.parametrize("name", ["x.tar", "sub/x-000001.tar", ".x.old-1.tar", "x y#1.tar"])
def test_plain_relative_names_are_taken(name):
    assert name_problem(name) is None


def test_a_list_may_write_dot_segments_that_stay_inside():
    assert name_problem("./img/a.png", canonical=False) is None
    assert name_problem("img/../a.png", canonical=False) is None
    assert name_problem("img/../../a.png", canonical=False) is not None


def test_query_and_fragment_characters_are_refused_at_urls_only():
    assert name_problem("x?sig=1.tar") is None
    assert name_problem("x?sig=1.tar", remote=True) is not None
    assert name_problem("x#1.tar", remote=True) is not None


# -- the campaign -----------------------------------------------------------------------------

def test_every_hostile_name_is_refused_by_every_command(world):
    rows = hostile_names.run(world)
    bad = [r for r in rows if r["outcome"] != "refused"]
    assert not bad, "\n".join(f"{r['outcome']}: {r['case']} by {r['command']}: {r['detail']}"
                              for r in bad[:10])
    # The campaign's reach: it cannot shrink unnoticed.
    by_command = collections.Counter(r["command"] for r in rows)
    commands = {"open_dataset", "verify", "info", "convert", "cache", "stream",
                "open_dataset (http)", "pack"}
    assert commands <= set(by_command), by_command
    assert {r["kind"] for r in rows} == {*hostile_names.DATASETS, *hostile_names.LISTS}
    assert len({r["case"] for r in rows}) >= 140 and len(rows) >= 700


def test_the_watch_sees_an_open_outside_and_the_second_server_a_request(world):
    """The campaign's detectors work: a read of a file outside and a request to
    the second server are both seen."""
    watch = hostile_names.OpenWatch(world.outside)
    try:
        watch.events()
        with open(os.path.join(world.outside, "secret.png"), "rb") as f:
            f.read(1)
        assert "secret.png" in watch.events()
    finally:
        watch.close()
    hostile_names._Counting.hits.clear()
    with pytest.raises(StorageError):
        fastdata.storage.open_remote(world.other + "/probe.bin").read()
    assert hostile_names._Counting.hits == ["/probe.bin"]
    hostile_names._Counting.hits.clear()


def test_the_refusal_names_the_manifest_and_the_field(world, tmp_path):
    case = hostile_names.Case("tar", "shards[0].path", "dotdot")
    path = hostile_names.prepare(world, case, str(tmp_path / "ds"))
    with pytest.raises(UnsafeNameError) as info:
        fastdata.open_dataset(path)
    message = str(info.value)
    assert message.startswith(path + ": manifest field shards[0].path is '../")
    assert "'..' segment" in message and "\n" not in message
    result = CliRunner().invoke(main, ["verify", path])
    assert result.exit_code == 1 and result.output.startswith("error: ")
    assert "Traceback" not in result.output


# -- links you made yourself --------------------------------------------------------------------

def _linked(world, tmp_path: Path, store: Path) -> tuple[str, str]:
    """A copy of the tar dataset whose second shard is moved to ``store`` and
    linked back; (its manifest, the original's manifest)."""
    folder, opened = world.pristine["tar"]
    dataset = tmp_path / "ds"
    shutil.copytree(folder, dataset)
    manifest = json.loads((dataset / opened).read_text())
    shard = dataset / manifest["shards"][1]["path"]
    store.mkdir()
    shutil.move(shard, store / shard.name)
    os.symlink(store / shard.name, shard)
    return str(dataset / opened), os.path.join(folder, opened)


def test_links_out_are_read_when_asked_for(world, tmp_path):
    path, original = _linked(world, tmp_path, tmp_path / "other-disk")
    with pytest.raises(UnsafeNameError, match="allow_outside=True"):
        fastdata.open_dataset(path)
    with fastdata.open_dataset(fastdata.DatasetRef(path, allow_outside=True), decode=BYTES) as ds, \
            fastdata.open_dataset(original, decode=BYTES) as same:
        assert [ds[i] for i in range(len(ds))] == [same[i] for i in range(len(same))]
    stream = fastdata.ShardedIterableDataset(fastdata.DatasetRef(path, allow_outside=True),
                                            decode=BYTES)
    assert len(list(stream)) == len(same)
    assert verify_dataset(path, allow_outside=True).ok
    for command in (["info"], ["verify"]):
        refused = CliRunner().invoke(main, [*command, path])
        assert refused.exit_code == 1 and "--allow-outside" in refused.output
        taken = CliRunner().invoke(main, [*command, path, "--allow-outside"])
        assert taken.exit_code == 0, taken.output


def test_another_tools_shards_found_by_a_pattern_stay_inside_too(tmp_path):
    from test_tar import webdataset_shards

    paths, samples = webdataset_shards(tmp_path / "wds", n=8, per_shard=4)
    disk = tmp_path / "other-disk"
    disk.mkdir()
    shutil.move(paths[1], disk / paths[1].name)
    os.symlink(disk / paths[1].name, paths[1])
    pattern = str(tmp_path / "wds" / "wds-%06d.tar")
    with pytest.raises(UnsafeNameError, match="shard 'wds-000001.tar' leads through a "
                                              "symbolic link"):
        fastdata.open_dataset(pattern)
    with fastdata.open_dataset(fastdata.DatasetRef(pattern, allow_outside=True),
                               decode=BYTES) as ds:
        assert [ds[i][0] for i in range(len(ds))] == [data for _, data, _ in samples]


def test_links_inside_the_folder_are_followed(world, tmp_path):
    path, original = _linked(world, tmp_path, tmp_path / "ds" / "store")
    with fastdata.open_dataset(path, decode=BYTES) as ds, \
            fastdata.open_dataset(original, decode=BYTES) as same:
        assert [ds[i] for i in range(len(ds))] == [same[i] for i in range(len(same))]


def test_a_list_of_your_own_may_name_files_elsewhere(world, tmp_path):
    src = Path(world.lists["csv"]).parent
    image = next(src.rglob("*.png"))
    listed = tmp_path / "mine.csv"
    listed.write_text(f"path,label\n{image},a\n")
    with pytest.raises(UnsafeNameError, match=r"line 2 \(path\).*absolute path"):
        fastdata.open_source(listed)
    source = fastdata.open_source(listed, allow_outside=True)
    assert next(iter(source)).path == str(image)
    out = tmp_path / "out.lmdb"
    result = CliRunner().invoke(main, ["pack", str(listed), str(out), "--allow-outside",
                                       "--no-progress", "--workers", "1"])
    assert result.exit_code == 0, result.output
    with fastdata.open_dataset(out, decode=BYTES) as ds:
        assert ds[0][0] == image.read_bytes()


# -- remote reads stay with their origin ----------------------------------------------------------

class _Redirecting(RangeHandler):
    """``/moved/NAME`` redirects to ``/NAME`` on this server; ``/away/NAME`` to
    ``/NAME`` on ``elsewhere``."""

    elsewhere = ""

    def _send(self, body: bool) -> None:
        for prefix, base in (("/moved/", ""), ("/away/", self.elsewhere)):
            if self.path.startswith(prefix):
                self.send_response(302)
                self.send_header("Location", base + "/" + self.path[len(prefix):])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        super()._send(body)


def _serve(handler, root) -> tuple[http.server.ThreadingHTTPServer, str]:
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a, **k: handler(*a, directory=str(root), **k))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def served(world, tmp_path, monkeypatch):
    """The pristine tar dataset behind a redirecting server; (server URL, the
    dataset's manifest name, the count of requests the second server got)."""
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    folder, opened = world.pristine["tar"]
    _Redirecting.elsewhere = world.other
    server, url = _serve(_Redirecting, folder)
    hostile_names._Counting.hits.clear()
    yield url, opened
    server.shutdown()
    server.server_close()
    hostile_names._Counting.hits.clear()


def test_a_redirect_on_the_same_host_is_followed(served, world):
    url, opened = served
    folder, _ = world.pristine["tar"]
    with fastdata.open_dataset(f"{url}/moved/{opened}", decode=BYTES) as ds, \
            fastdata.open_dataset(os.path.join(folder, opened), decode=BYTES) as local:
        assert ds[3] == local[3]


def test_a_redirect_to_another_host_is_refused_and_never_asked(served):
    url, opened = served
    with pytest.raises(StorageError, match="another host or scheme") as info:
        fastdata.open_dataset(f"{url}/away/{opened}")
    assert "same host" in str(info.value)
    assert hostile_names._Counting.hits == []  # the other host never got the request


class _Oversending(RangeHandler):
    """Every answer carries ``extra`` more bytes than the file: a server that
    says more than the manifest does (``sent`` counts what went out)."""

    extra = 0
    sent = [0]

    def _send(self, body: bool) -> None:
        path = Path(self.directory, self.path.lstrip("/"))
        if self.extra and path.suffix == ".tar" and not self.headers.get("Range"):
            data = path.read_bytes() + b"\0" * self.extra
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                for start in range(0, len(data), 1 << 16):
                    self.wfile.write(data[start:start + (1 << 16)])
                    self.sent[0] += min(1 << 16, len(data) - start)
            except OSError:  # the client stopped reading
                pass
            return
        super()._send(body)


def test_a_shard_larger_than_the_manifest_says_is_cut_off_there(world, tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    folder, opened = world.pristine["tar"]
    _Oversending.extra, _Oversending.sent[0] = 64 << 20, 0
    server, url = _serve(_Oversending, folder)
    try:
        stream = fastdata.ShardedIterableDataset(f"{url}/{opened}", decode=BYTES,
                                                 remote_read="shards")
        with fastdata.open_dataset(os.path.join(folder, opened), decode=BYTES) as local:
            assert sorted(stream) == sorted(local[i] for i in range(len(local)))
        assert verify_dataset(f"{url}/{opened}").ok
    finally:
        server.shutdown()
        server.server_close()
    manifest = json.loads(Path(folder, opened).read_text())
    copies = {p.stat().st_size for p in (tmp_path / "cache").rglob("*.tar")}
    assert copies <= {s["bytes"] for s in manifest["shards"]}   # the stated sizes, no more
    assert _Oversending.sent[0] < 64 << 20                      # the rest was never read


def test_a_whole_read_past_its_limit_is_refused_unbuffered(tmp_path):
    (tmp_path / "big.tar").write_bytes(b"x" * 1000)
    _Oversending.extra, _Oversending.sent[0] = 64 << 20, 0
    server, url = _serve(_Oversending, tmp_path)
    try:
        with pytest.raises(StorageError, match="more than the 4,096 bytes"):
            fastdata.storage.open_remote(f"{url}/big.tar").read(limit=4096)
    finally:
        server.shutdown()
        server.server_close()
    assert _Oversending.sent[0] < 64 << 20


class _RangeLiar(RangeHandler):
    """Answers a Range request with the whole file (200), or with the range and
    ``extra`` bytes more (206)."""

    mode = "whole"

    def _send(self, body: bool) -> None:
        if not self.headers.get("Range"):
            return super()._send(body)
        data = Path(self.directory, self.path.lstrip("/")).read_bytes()
        start, end = map(int, self.headers["Range"].split("=")[1].split("-"))
        part = data if self.mode == "whole" else data[start:end + 1] + b"junk" * 100
        self.send_response(200 if self.mode == "whole" else 206)
        if self.mode != "whole":
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        self.wfile.write(part)


@pytest.mark.parametrize("mode", ["whole", "longer"])
def test_ranged_reads_take_only_the_bytes_asked_for(tmp_path, mode):
    data = os.urandom(300_000)
    (tmp_path / "obj.bin").write_bytes(data)
    _RangeLiar.mode = mode
    server, url = _serve(_RangeLiar, tmp_path)
    try:
        obj = fastdata.storage.open_remote(f"{url}/obj.bin")
        if mode == "whole":
            with pytest.raises(StorageError, match="does not honour Range"):
                obj.read_range(10, 20)
        else:
            assert obj.read_ranges([(10, 20), (5000, 7)]) == [data[10:30], data[5000:5007]]
            assert obj.read_range(200_000, 9) == data[200_000:200_009]
    finally:
        server.shutdown()
        server.server_close()


# -- no credentials in output -----------------------------------------------------------------------

class _Guarded(RangeHandler):
    """Files only for HTTP Basic ``user:SECRET``."""

    def _send(self, body: bool) -> None:
        expected = "Basic " + base64.b64encode(f"user:{SECRET}".encode()).decode()
        if self.headers.get("Authorization") != expected:
            self.send_error(401)
            return
        super()._send(body)


def _files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def test_a_password_in_a_url_reaches_no_output(world, tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    folder, opened = world.pristine["tar"]
    server, url = _serve(_Guarded, folder)
    try:
        secret_url = url.replace("://", f"://user:{SECRET}@") + "/" + opened
        with fastdata.open_dataset(secret_url, decode=BYTES) as ds:  # sent as Basic auth
            assert len(ds[0][0]) > 0
        runner = CliRunner()
        outputs = [runner.invoke(main, ["info", secret_url]),
                   runner.invoke(main, ["info", secret_url, "--json"]),
                   runner.invoke(main, ["verify", secret_url, "--json"])]
        assert all(r.exit_code == 0 for r in outputs), [r.output for r in outputs]
        out = tmp_path / "out"
        converted = runner.invoke(main, ["convert", secret_url, str(out / "c.lmdb"), "--json",
                                         "--workers", "1", "--no-progress"])
        kept = runner.invoke(main, ["convert", secret_url, str(out / "k.tar"), "--json",
                                    "--keep-source-path", "--workers", "1", "--no-progress"])
        assert converted.exit_code == kept.exit_code == 0, converted.output + kept.output
        outputs += [converted, kept]
        with fastdata.open_dataset(out / "k.tar.fastdata.json") as ds:
            assert ds.manifest.source["root"] == url.replace("://", "://***@") + "/" + opened
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(StorageError) as down:  # the server is gone: an error with the URL
        fastdata.open_dataset(secret_url)
    texts = [r.output for r in outputs] + [str(down.value), down.value.path]
    texts += [p.read_bytes().decode("utf-8", "replace") for p in _files_under(out)
              if p.suffix in (".json", ".mdb", ".tar")]
    assert "cannot reach the endpoint" in str(down.value)
    assert not [t for t in texts if SECRET in t]


def test_a_signed_url_query_is_masked_in_errors(tmp_path):
    url = f"http://127.0.0.1:9/x.tar.fastdata.json?X-Amz-Signature={SECRET}&token={SECRET}"
    with pytest.raises(FastDataError) as info:
        fastdata.open_dataset(url)
    assert SECRET not in str(info.value) and "X-Amz-Signature=***" in str(info.value)
    result = CliRunner().invoke(main, ["info", url])
    assert result.exit_code == 1 and SECRET not in result.output


def test_the_manifest_records_the_source_by_name(tmp_path):
    tree = build_tree(tmp_path / "home" / "someone" / "images", uniform_spec(("a", "b"), 2))
    fastdata.pack(tree.root, tmp_path / "x.lmdb", options=fastdata.PackOptions(workers=1),
                  progress=False)
    fastdata.pack(tree.root, tmp_path / "y.lmdb", progress=False,
                  options=fastdata.PackOptions(workers=1, keep_source_path=True))
    with fastdata.open_dataset(tmp_path / "x.lmdb") as x, \
            fastdata.open_dataset(tmp_path / "y.lmdb") as y:
        assert x.manifest.source["root"] == "images"
        assert y.manifest.source["root"] == str(tree.root)
    assert b"someone" not in (tmp_path / "x.lmdb" / "data.mdb").read_bytes()
