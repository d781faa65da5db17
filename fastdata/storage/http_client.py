"""Requests to http(s) servers with the standard library's ``http.client``:
connections, redirects, retries and the answers (the operations built on them
are in fastdata.storage.http).

obstore follows every redirect, to any host. Here a dataset at an http(s) URL
is read from the server it names and nowhere else: a redirect is followed only
to the same scheme, host and port (at most five) and any other is refused, so
a server cannot send fastdata's requests (and the user's headers) elsewhere.

Connections are kept alive in a pool per process, rebuilt after fork (there is
no runtime to lose, so forked DataLoader workers make their own requests).
Failed connections and 429/5xx answers are retried with backoff
(``max_retries``, ``retry_timeout``, ``init_backoff``, ``max_backoff`` from
``storage_options``, as for the object stores). ``storage_options`` also take
``default_headers``, ``connect_timeout``, ``read_timeout``, ``user_agent``,
``allow_invalid_certificates``, ``root_certificate`` and ``proxy_url``
(otherwise the standard HTTP(S)_PROXY / NO_PROXY variables apply); a URL's
user-info is sent as HTTP Basic authentication.
"""

from __future__ import annotations

import base64
import http.client
import os
import socket
import ssl
import threading
import time
from datetime import timedelta
from urllib.parse import quote, unquote, urljoin, urlsplit

from fastdata.errors import AccessDeniedError, MissingObjectError, StorageError
from fastdata.redaction import redact
from fastdata.storage import adaptive
from fastdata.storage.stores import DEFAULT_CLIENT, DEFAULT_RETRIES

MAX_REDIRECTS = 5
_CHUNK = 1 << 20
_REDIRECTS = (301, 302, 303, 307, 308)
_RETRIED = (429, 500, 502, 503, 504)
#: Answers that say "slow down": fewer requests at once to that server.
_THROTTLED = (429, 503)
_DEFAULTS = {**DEFAULT_CLIENT, **DEFAULT_RETRIES}  # the object stores' own


def _seconds(value) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


class _Settings:
    """What ``storage_options`` say about requests to one origin."""

    def __init__(self, options: dict | None) -> None:
        options = dict(options or {})
        get = lambda name: options.get(name, _DEFAULTS.get(name))  # noqa: E731
        self.connect_timeout = _seconds(get("connect_timeout"))
        self.read_timeout = _seconds(get("read_timeout"))
        self.max_retries = int(get("max_retries"))
        self.retry_timeout = _seconds(get("retry_timeout"))
        self.init_backoff = _seconds(get("init_backoff"))
        self.max_backoff = _seconds(get("max_backoff"))
        self.headers = {str(k): str(v) for k, v in (options.get("default_headers") or {}).items()}
        if options.get("user_agent"):
            self.headers["User-Agent"] = str(options["user_agent"])
        self.headers.setdefault("User-Agent", "fastdata")
        self.insecure = str(options.get("allow_invalid_certificates", "")).lower() in (
            "1", "true", "yes", "on")
        self.root_certificate = options.get("root_certificate")
        self.proxy_url = options.get("proxy_url")
        self.key = (self.connect_timeout, self.read_timeout, self.insecure,
                    str(self.root_certificate), str(self.proxy_url))


class _Origin:
    """scheme, host and port of a URL: what a redirect must keep."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.scheme = parts.scheme.lower()
        self.host = (parts.hostname or "").lower()
        self.port = parts.port or (443 if self.scheme == "https" else 80)
        self.auth = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            self.auth = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        self.target = quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~") + (
            f"?{parts.query}" if parts.query else "")

    def same(self, other: "_Origin") -> bool:
        return (self.scheme, self.host, self.port) == (other.scheme, other.host, other.port)

    @property
    def shown(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


def origin_of(url: str) -> str:
    """The scheme, host and port of ``url`` (what one gate of requests serves)."""
    return _Origin(url).shown


# -- connections ------------------------------------------------------------------------

_pool: dict[tuple, list] = {}
_pool_pid = None
_pool_lock = threading.Lock()


def _take(origin: _Origin, settings: _Settings):
    global _pool, _pool_pid
    key = (origin.scheme, origin.host, origin.port, settings.key)
    with _pool_lock:
        if _pool_pid != os.getpid():  # connections of a parent are not ours
            _pool, _pool_pid = {}, os.getpid()
        idle = _pool.get(key)
        if idle:
            return key, idle.pop(), True
    return key, _connect(origin, settings), False


def _give_back(key: tuple, conn) -> None:
    with _pool_lock:
        if _pool_pid == os.getpid():
            _pool.setdefault(key, []).append(conn)


def _connect(origin: _Origin, settings: _Settings):
    proxy = _proxy_for(origin, settings)
    host, port = (proxy.hostname, proxy.port or 80) if proxy else (origin.host, origin.port)
    if origin.scheme == "https":
        context = ssl.create_default_context()
        if settings.root_certificate:
            context.load_verify_locations(os.fspath(settings.root_certificate))
        if settings.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        conn = http.client.HTTPSConnection(host, port, timeout=settings.connect_timeout,
                                           context=context)
        if proxy:
            conn.set_tunnel(origin.host, origin.port)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=settings.connect_timeout)
    conn.fastdata_proxied = bool(proxy) and origin.scheme == "http"
    conn.connect()
    conn.sock.settimeout(settings.read_timeout)
    return conn


def _proxy_for(origin: _Origin, settings: _Settings):
    from urllib.request import getproxies, proxy_bypass

    url = settings.proxy_url or getproxies().get(origin.scheme)
    if not url or (not settings.proxy_url and proxy_bypass(origin.host)):
        return None
    return urlsplit(url if "://" in url else f"http://{url}")


# -- one request ------------------------------------------------------------------------

class _Answer:
    """A response with its body still to read, and the connection it came on."""

    def __init__(self, response, key, conn) -> None:
        self.response, self.key, self.conn = response, key, conn
        self.status = response.status

    def header(self, name: str) -> str | None:
        return self.response.getheader(name)

    def read(self, size: int, url: str) -> bytes:
        """Exactly ``size`` bytes of the body (fewer only when it ends first)."""
        return b"".join(self.chunks(size, url))

    def chunks(self, limit: int | None, url: str):
        """The body in chunks, cut off after ``limit`` bytes."""
        left = limit
        while left is None or left > 0:
            try:
                part = self.response.read(_CHUNK if left is None else min(left, _CHUNK))
            except (OSError, http.client.HTTPException):
                self.close()
                raise StorageError("connection dropped mid-transfer", path=url) from None
            if not part:
                return
            if left is not None:
                left -= len(part)
            yield part

    def finish(self) -> None:
        """Give the connection back when its body was read to the end, else drop it."""
        if self.response.isclosed() and not self.response.will_close:
            _give_back(self.key, self.conn)
        else:
            self.close()

    def close(self) -> None:
        self.conn.close()


def _send(method: str, origin: _Origin, settings: _Settings, headers: dict):
    """One request on a pooled (or new) connection; a kept-alive connection the
    server closed meanwhile is replaced once."""
    while True:
        key, conn, reused = _take(origin, settings)
        target = (f"http://{origin.host}:{origin.port}{origin.target}"
                  if conn.fastdata_proxied else origin.target)
        try:
            conn.request(method, target, headers=headers)
            return _Answer(conn.getresponse(), key, conn)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            conn.close()
            if not reused:
                raise


def request(method: str, url: str, options: dict | None = None, *,
            headers: dict | None = None) -> _Answer:
    """``method`` on ``url``: retried on failed connections and 429/5xx answers,
    redirects followed on the same origin only. The answer's body is unread.

    Raises:
        StorageError: no answer after the retries, a redirect to another host
            or scheme, or too many redirects.
    """
    settings = _Settings(options)
    start, attempt, current = time.monotonic(), 0, url
    origin = first = _Origin(url)
    redirects = 0
    while True:
        sent = {**settings.headers, **(headers or {})}
        if origin.auth and "Authorization" not in sent:
            sent["Authorization"] = origin.auth
        try:
            answer = _send(method, origin, settings, sent)
        except (OSError, http.client.HTTPException) as exc:
            if _may_retry(settings, attempt, start):
                attempt = _backoff(settings, attempt)
                continue
            raise StorageError(f"cannot reach the endpoint {origin.shown} ({_problem(exc)}, "
                               f"after retries)", path=url) from None
        if answer.status in _THROTTLED:
            adaptive.gate(origin.shown).throttle(answer.status)
        if answer.status in _RETRIED and _may_retry(settings, attempt, start):
            answer.close()
            attempt = _backoff(settings, attempt)
            continue
        if answer.status not in _REDIRECTS:
            return answer
        location = answer.header("Location") or ""
        answer.close()
        target = urljoin(current, location)
        moved = _Origin(target)
        if not moved.same(first):
            raise StorageError(
                f"the server redirects to {redact(target)}, another host or scheme; fastdata "
                f"follows redirects only on the same host, port and scheme, so that a dataset "
                f"cannot send its reads elsewhere: open the dataset by the URL it is served "
                f"at", path=url)
        redirects += 1
        if redirects > MAX_REDIRECTS:
            raise StorageError(f"more than {MAX_REDIRECTS} redirects", path=url)
        moved.auth = origin.auth
        current, origin = target, moved
        if answer.status == 303:
            method = "HEAD" if method == "HEAD" else "GET"


def _may_retry(settings: _Settings, attempt: int, start: float) -> bool:
    return attempt < settings.max_retries and time.monotonic() - start < settings.retry_timeout


def _backoff(settings: _Settings, attempt: int) -> int:
    time.sleep(min(settings.max_backoff, settings.init_backoff * 2 ** attempt))
    return attempt + 1


def _problem(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(exc, socket.gaierror):
        return "name not resolved"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    return f"connection failed: {type(exc).__name__}"


def refused(answer: _Answer, url: str) -> StorageError:
    """The error for an answer that is not the one asked for."""
    answer.close()
    status = answer.status
    if status == 404 or status == 410:
        return MissingObjectError("no such object", path=url)
    if status in (401, 403):
        return AccessDeniedError(f"access denied (the server refused the request: {status})",
                            path=url)
    if status == 416:
        return StorageError("byte range outside the object", path=url)
    return StorageError(f"request failed: HTTP {status} {answer.response.reason}", path=url)
