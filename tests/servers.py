"""Real servers for the storage tests: moto's S3 server in a subprocess and a
threaded HTTP file server honouring Range requests. Requests cross a socket;
nothing is mocked. The fixtures are re-exported by conftest.py.

* ``s3_server`` (session) / ``s3_server_fresh`` (per test, for tests that stop
  it) / ``s3_server_auth`` (per test, a moto server that checks credentials);
* ``s3_env`` sets the AWS_* variables for ``s3_server``;
* ``http_server`` serves ``.root`` at ``.url``; a path under ``/truncate/``
  sends the full Content-Length but only half the body, then hangs up;
  ``.cut[path]`` breaks that many whole GETs of a path off half-way, and
  ``.hold[path] = Hold()`` stops the next one half-way until released.
"""

from __future__ import annotations

import http.server
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from ci_needs import missing

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


def wait_until_listening(proc: subprocess.Popen, what: str, log_path: Path,
                         on_failure=None) -> int:
    """The port ``proc`` listens on once it does (30 s at most); else raise with its log.

    Servers are started on port 0 and bind a free port themselves, so no port
    is picked here, closed and then taken by something else before they bind
    it; the port is read back from the process's own listening socket.
    """
    deadline = time.monotonic() + 30
    while True:
        port = _listening_port(proc.pid)
        if port is not None and _answers(port):
            return port
        if proc.poll() is not None or time.monotonic() > deadline:
            output = log_path.read_text(errors="replace")
            if on_failure is not None:
                on_failure()
            raise RuntimeError(f"{what} did not start: {output}")
        time.sleep(0.05)


def _listening_port(pid: int) -> int | None:
    """The TCP port process ``pid`` listens on (Linux: /proc), or None yet."""
    try:
        targets = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None                  # gone, or a descriptor closed while listed
    inodes = {t[len("socket:["):-1] for t in targets if t.startswith("socket:[")}
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()    # local_address rem_address st ... inode
            if fields[3] == "0A" and fields[9] in inodes:          # 0A: LISTEN
                return int(fields[1].rsplit(":", 1)[1], 16)
    return None


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class MotoServer:
    """``moto_server`` on a port of 127.0.0.1 it picks; its access log in ``log_path``."""

    def __init__(self, *, check_auth: bool = False) -> None:
        if shutil.which("moto_server") is None:
            missing("moto_server is not on PATH (pip install -e '.[test]' brings moto[server])")
        self.check_auth = check_auth
        self.log_path = Path(tempfile.mkstemp(prefix="moto-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None
        self.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, **CREDENTIALS}

    def start(self) -> None:
        """Start moto on port 0: it binds a free port, which ``port`` then holds."""
        env = dict(os.environ)
        if self.check_auth:     # moto then checks every request's keys against its IAM
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(["moto_server", "-H", "127.0.0.1", "-p", "0"],
                                     stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        self.port = wait_until_listening(self.proc, "moto_server", self.log_path)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def client(self):
        import boto3
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def make_bucket(self, name: str) -> str:
        client = self.client()
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        return f"s3://{name}"

    def put(self, url: str, data: bytes) -> None:
        bucket, key = _bucket_key(url)
        self.client().put_object(Bucket=bucket, Key=key, Body=data)

    def get(self, url: str) -> bytes:
        bucket, key = _bucket_key(url)
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()

    def upload_dir(self, local_dir, url_prefix: str) -> list[str]:
        """Upload every file under ``local_dir`` below ``url_prefix`` (plain boto3)."""
        bucket, prefix = _bucket_key(url_prefix)
        self.make_bucket(bucket)
        client, keys = self.client(), []
        for path in sorted(Path(local_dir).rglob("*")):
            if path.is_file():
                key = "/".join(p for p in (prefix.strip("/"),
                                           path.relative_to(local_dir).as_posix()) if p)
                client.upload_file(str(path), bucket, key)
                keys.append(f"s3://{bucket}/{key}")
        return keys

    def requests(self, method: str, url: str) -> int:
        """How many ``method`` requests for ``url``'s object the server logged."""
        bucket, key = _bucket_key(url)
        pattern = re.compile(rf'"{method} /{re.escape(bucket)}/{re.escape(key)}(\?[^ ]*)? HTTP')
        return len(pattern.findall(self.log_path.read_text(errors="replace")))


def _bucket_key(url: str) -> tuple[str, str]:
    rest = url.split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    return bucket, key


class Hold:
    """The next whole GET of a path held half-way (``server.hold[path] =
    Hold()``): its headers and the first half of its body are sent, then
    ``reached`` is set and the rest waits for :meth:`release`."""

    #: How long a held answer waits at most: a test that never releases it
    #: fails on its own assertions, not by hanging.
    LIMIT_S = 120.0

    def __init__(self) -> None:
        self.reached = threading.Event()
        self._go = threading.Event()

    def release(self) -> None:
        self._go.set()

    def wait(self) -> None:
        self.reached.set()
        self._go.wait(self.LIMIT_S)


class _Listener(http.server.ThreadingHTTPServer):
    # socketserver's default backlog of 5 makes a client's sixth connection at
    # once wait for a SYN retry (a second); readers open more than that.
    request_queue_size = 128

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.lock = threading.Lock()
        #: (method, path, Range header) of every request, in arrival order.
        self.log: list[tuple[str, str, str | None]] = []
        #: path -> how many more whole GETs of it break off half-way.
        self.cut: dict[str, int] = {}
        #: path -> the Hold its next whole GET waits at, half-way.
        self.hold: dict[str, Hold] = {}
        #: How a missing file is answered: 404, 403 (S3 without ListBucket),
        #: or "page" (a 200 HTML page, as a CDN's catch-all route sends).
        self.missing: int | str = 404
        #: Answer every n-th GET of a file with 503 SlowDown, as a throttling
        #: object store does (0: never); ``throttled`` counts those answers.
        self.throttle_every = 0
        self.throttled = 0
        self._gets = 0
        #: Requests being answered now, and the most at once.
        self.active = self.peak_active = 0
        #: Seconds each request waits before its answer (a far server's round trip).
        self.delay = 0.0


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Files of the served folder with HEAD, Range (206/416) and a /truncate/ mode."""

    def log_message(self, *args) -> None:
        pass

    def do_HEAD(self) -> None:
        self._send(body=False)

    def do_GET(self) -> None:
        self._send(body=True)

    def _send(self, body: bool) -> None:
        server = self.server
        if not isinstance(server, _Listener):
            return self._answer(body)
        with server.lock:
            server.active += 1
            server.peak_active = max(server.peak_active, server.active)
        try:
            if server.delay:
                time.sleep(server.delay)
            self._answer(body)
        finally:
            with server.lock:
                server.active -= 1

    def _slow_down(self) -> bool:
        """Whether this request gets a 503 SlowDown (see ``throttle_every``)."""
        server = self.server
        with server.lock:
            if self.command != "GET" or not server.throttle_every:
                return False
            server._gets += 1
            if server._gets % server.throttle_every:
                return False
            server.throttled += 1
        text = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
                b"<Message>Please reduce your request rate.</Message></Error>")
        self.send_response(503)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)
        return True

    def _answer(self, body: bool) -> None:
        rel = self.path.split("?", 1)[0].lstrip("/")
        truncate = rel.startswith("truncate/")
        server, hold = self.server, None
        if isinstance(server, _Listener):  # tests may serve the handler themselves
            with server.lock:
                server.log.append((self.command, rel, self.headers.get("Range")))
                if body and not self.headers.get("Range") and server.cut.get(rel, 0) > 0:
                    server.cut[rel] -= 1               # this whole GET breaks off
                    truncate = True
                if body and not self.headers.get("Range"):
                    hold = server.hold.pop(rel, None)
        path = Path(self.directory, rel.removeprefix("truncate/"))
        if isinstance(server, _Listener) and path.is_file() and self._slow_down():
            return
        if not path.is_file():
            missing = getattr(server, "missing", 404)
            if missing != "page":
                self.send_error(missing)
                return
            page = b"<!doctype html><html><body>Welcome! Page not found here.</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            if body:
                self.wfile.write(page)
            return
        data = path.read_bytes()
        start, end, status = 0, len(data) - 1, 200
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", "") or "")
        if self.headers.get("Range"):
            if not match or (not match.group(1) and not match.group(2)):
                self.send_error(416)
                return
            if match.group(1):
                start = int(match.group(1))
                end = min(int(match.group(2)), end) if match.group(2) else end
            else:                                           # bytes=-N: the last N bytes
                start = max(0, len(data) - int(match.group(2)))
            if start >= len(data) or start > end:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        part = data[start:end + 1]
        self.send_response(status)
        self.send_header("Content-Length", str(len(part)))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.end_headers()
        if body:
            if hold is not None:
                self.wfile.write(part[:len(part) // 2])
                hold.wait()
                part = part[len(part) // 2:]
            self.wfile.write(part[:len(part) // 2] if truncate else part)
            if truncate:
                self.close_connection = True


class HTTPServer:
    def __init__(self, root) -> None:
        self.root = Path(root)
        handler = lambda *a, **k: RangeHandler(*a, directory=str(self.root), **k)  # noqa: E731
        self.server = _Listener(("127.0.0.1", 0), handler)
        self.log, self.cut, self.hold = self.server.log, self.server.cut, self.server.hold
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def throttled(self) -> int:
        """503 SlowDown answers sent so far."""
        return self.server.throttled

    @property
    def peak_active(self) -> int:
        """The most requests answered at once."""
        return self.server.peak_active

    def throttle(self, every: int) -> None:
        """Answer every ``every``-th GET of a file with 503 SlowDown (0: never)."""
        self.server.throttle_every = every

    @property
    def missing(self) -> int | str:
        """How a missing file is answered (see ``_Listener.missing``)."""
        return self.server.missing

    @missing.setter
    def missing(self, value: int | str) -> None:
        self.server.missing = value

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def http_site(root, monkeypatch, cache):
    """A fresh HTTP server for the folder ``root``, with the test's own shard
    cache at ``cache`` and no cache limit; closed at the end."""
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(cache))
    monkeypatch.delenv("FASTDATA_CACHE_LIMIT", raising=False)
    server = HTTPServer(root)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def s3_server():
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture
def s3_server_fresh():
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture
def s3_server_auth():
    server = MotoServer(check_auth=True)
    yield server
    server.stop()


@pytest.fixture
def s3_env(monkeypatch, s3_server):
    """The AWS_* variables pointing at ``s3_server``; returns the server."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture
def http_server(tmp_path):
    """A Range-honouring HTTP server on ``tmp_path/www`` (``.root``, ``.url``)."""
    root = tmp_path / "www"
    root.mkdir()
    server = HTTPServer(root)
    yield server
    server.close()
