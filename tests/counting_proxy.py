"""A counting HTTP forwarding proxy for the storage tests.

``CountingProxy(upstream)`` listens on a free port of 127.0.0.1 and forwards
every request it gets (method, path, headers, body) to ``upstream`` (such as
moto's S3 server) over a real socket, then streams the answer back. It
records, per request, the method, path, Range header, status and the number of
response body bytes it relayed, so a test can count what a client fetched.

Point a client at ``proxy.endpoint`` instead of the upstream's (for S3:
``AWS_ENDPOINT_URL``). The Host header is forwarded as the client sent it, so
a request signature made for the proxy's address stays valid. The client's
connection is kept alive; each has one upstream connection of its own, kept
alive as long as the upstream allows (moto's server closes it after every
answer). Response bodies framed by Content-Length, by chunked transfer
encoding or by the end of the connection are relayed as they come.
"""

from __future__ import annotations

import http.client
import http.server
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

#: Headers that belong to one connection, never forwarded (RFC 9110, 7.6.1).
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
              "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}
#: Bytes relayed at a time.
BLOCK = 1 << 16


@dataclass(frozen=True)
class Request:
    """One forwarded request and what its answer held."""

    method: str
    path: str               # as requested, query string included
    range: str | None       # the Range header, if any
    status: int
    body_bytes: int         # response body bytes relayed to the client

    @property
    def key(self) -> str:
        """The path without its query string and leading slash (``bucket/key``)."""
        return self.path.split("?", 1)[0].lstrip("/")


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128   # readers open many connections at once

    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = upstream
        self.lock = threading.Lock()
        self.log: list[Request] = []
        #: Requests being answered (logged when their answer ends).
        self.active = 0


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"    # keep-alive towards the client
    server: _Server

    def log_message(self, *args) -> None:
        pass

    def __getattr__(self, name: str):
        if name.startswith("do_"):       # every method is forwarded alike
            return self._forward
        raise AttributeError(name)

    def _upstream(self) -> http.client.HTTPConnection:
        conn = getattr(self, "_conn", None)
        if conn is None:
            conn = self._conn = http.client.HTTPConnection(*self.server.upstream, timeout=60)
        return conn

    def _drop_upstream(self) -> None:
        conn = getattr(self, "_conn", None)
        if conn is not None:
            conn.close()
        self._conn = None

    def finish(self) -> None:
        super().finish()
        self._drop_upstream()

    def _request_body(self) -> bytes:
        """The request's body, chunked transfer encoding undone (sent upstream
        with a Content-Length)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass                 # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()        # the CRLF after the chunk
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send_upstream(self, body: bytes) -> http.client.HTTPResponse:
        for attempt in (0, 1):       # a kept-alive upstream connection may have closed
            conn = self._upstream()
            try:
                conn.putrequest(self.command, self.path, skip_host=True,
                                skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                        conn.putheader(name, value)
                if body or self.command in ("PUT", "POST", "PATCH") or \
                        "Content-Length" in self.headers:
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body if body else None)
                return conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self._drop_upstream()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _forward(self) -> None:
        with self.server.lock:
            self.server.active += 1
        try:
            self._answer()
        finally:
            with self.server.lock:
                self.server.active -= 1

    def _answer(self) -> None:
        body = self._request_body()
        answer = self._send_upstream(body)
        chunked = answer.chunked
        length = answer.getheader("Content-Length")
        bodiless = self.command == "HEAD" or answer.status in (204, 304) or \
            100 <= answer.status < 200
        self.send_response_only(answer.status, answer.reason)
        for name, value in answer.getheaders():
            if name.lower() not in HOP_BY_HOP:
                self.send_header(name, value)
        until_close = not bodiless and not chunked and length is None
        if chunked and not bodiless:
            self.send_header("Transfer-Encoding", "chunked")
        if until_close:            # the body ends with the connection: end ours too
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        sent = 0
        while not bodiless:
            # read1 returns b"" at the end without closing the response (so the
            # connection could not send the next request); read() then does.
            block = answer.read1(BLOCK) or answer.read()
            if not block:
                break
            sent += len(block)
            if chunked:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
            else:
                self.wfile.write(block)
        if chunked and not bodiless:
            self.wfile.write(b"0\r\n\r\n")
        answer.read()                     # ends it (a HEAD's, a 204's: nothing to read)
        self.wfile.flush()
        if answer.will_close:
            self._drop_upstream()
        with self.server.lock:
            self.server.log.append(Request(self.command, self.path, self.headers.get("Range"),
                                           answer.status, sent))


class CountingProxy:
    """A forwarding proxy to ``upstream`` (``http://host:port``) at ``.endpoint``;
    ``.log``: a :class:`Request` for every answered request, in the order
    their answers ended."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.port is None:
            raise ValueError(f"an http://host:port upstream, not {upstream!r}")
        self.server = _Server((parts.hostname, parts.port))
        self.port = self.server.socket.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                       name="counting-proxy")
        self.thread.start()

    @property
    def log(self) -> list[Request]:
        with self.server.lock:
            return list(self.server.log)

    def quiet_log(self, timeout: float = 30.0) -> list[Request]:
        """The log once no request is being answered: a client that has its
        answers sees its requests logged (an entry is added after the body)."""
        end = time.monotonic() + timeout
        while True:
            with self.server.lock:
                if self.server.active == 0:
                    return list(self.server.log)
            if time.monotonic() > end:
                raise TimeoutError("the proxy is still answering a request")
            time.sleep(0.01)

    def clear(self) -> None:
        with self.server.lock:
            del self.server.log[:]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> CountingProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
