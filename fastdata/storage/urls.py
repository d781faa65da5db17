"""Paths and URLs: which is which, and how to join, split and parse them.

No third-party imports: the dataset openers call these on every path.
"""

from __future__ import annotations

import os
import posixpath
from typing import NamedTuple
from urllib.parse import unquote, urlsplit

#: Schemes served by an object store or an HTTP server (never by the local disk).
REMOTE_SCHEMES = ("s3", "gs", "az", "abfs", "abfss", "http", "https")


class ParsedURL(NamedTuple):
    """A remote URL split into what picks the store and the key inside it."""

    scheme: str      # "s3", "gs", "az" (abfs/abfss too), "http" or "https"
    bucket: str      # bucket or container; for http(s), the "host[:port]"
    key: str         # the object's key (no leading "/"); for http(s), the path
    account: str     # Azure storage account named in an abfs URL, else ""


def _scheme(path) -> str:
    text = os.fspath(path)
    if not isinstance(text, str) or "://" not in text:
        return ""
    return text.split("://", 1)[0].lower()


def is_url(path) -> bool:
    """True for a remote URL (s3://, gs://, az://, abfs(s)://, http(s)://);
    False for a plain path and for a file:// URL (both are on the local disk)."""
    return _scheme(path) in REMOTE_SCHEMES


def is_http(path) -> bool:
    """True for an http:// or https:// URL."""
    return _scheme(path) in ("http", "https")


def local_path(path) -> str | None:
    """The local filesystem path of a plain path or a file:// URL; None for a
    remote URL."""
    text = os.fspath(path)
    scheme = _scheme(text)
    if scheme == "file":
        parts = urlsplit(text)
        # file:///abs/path and file://localhost/abs/path; file://rel/path is not standard
        # but keeps its leading component rather than losing it.
        host = parts.netloc if parts.netloc not in ("", "localhost") else ""
        return unquote(host + parts.path) if host else unquote(parts.path)
    if scheme in REMOTE_SCHEMES:
        return None
    return text


def parse_url(url: str) -> ParsedURL:
    """Split a remote URL into scheme, bucket (or container, or host) and key."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in REMOTE_SCHEMES:
        raise ValueError(f"not a remote URL: {url!r}")
    key = parts.path.lstrip("/")
    if scheme in ("http", "https"):
        return ParsedURL(scheme, parts.netloc, key, "")
    bucket, account = parts.netloc, ""
    if scheme in ("abfs", "abfss"):
        # abfs://container@account.dfs.core.windows.net/key
        if "@" in bucket:
            bucket, host = bucket.split("@", 1)
            account = host.split(".", 1)[0]
        scheme = "az"
    return ParsedURL(scheme, bucket, key, account)


def _split_root(url: str) -> tuple[str, str]:
    """("s3://bkt", "a/b") for a URL; ("", path) for a local path."""
    text = os.fspath(url)
    if "://" not in text:
        return "", text
    scheme, rest = text.split("://", 1)
    if scheme.lower() == "file":
        return "file://", rest
    netloc, _, path = rest.partition("/")
    return f"{scheme}://{netloc}", path


def join(url: str, *names: str) -> str:
    """``url`` with ``names`` appended, "/"-separated for URLs, os.path for paths."""
    root, path = _split_root(url)
    if not root:
        return os.path.join(path, *names)
    joined = posixpath.join(path, *names) if path else posixpath.join(*names) if names else ""
    return f"{root}/{joined}" if root != "file://" else root + joined


def dirname(url: str) -> str:
    """The "folder" of ``url`` (a URL stays a URL: dirname("s3://b/x/y") is "s3://b/x")."""
    root, path = _split_root(url)
    if not root:
        return os.path.dirname(path)
    parent = posixpath.dirname(path.rstrip("/"))
    if root == "file://":
        return root + parent
    return f"{root}/{parent}" if parent else root


def basename(url: str) -> str:
    """The last component of ``url`` ("y" for "s3://b/x/y")."""
    root, path = _split_root(url)
    if not root:
        return os.path.basename(path)
    return posixpath.basename(path.rstrip("/"))
