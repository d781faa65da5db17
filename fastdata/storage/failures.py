"""obstore's exceptions as one-line StorageErrors that name the URL and what to
do, with nothing in them that could be a credential."""

from __future__ import annotations

import contextlib
import os
import re

from fastdata.errors import AccessDeniedError, MissingObjectError, StorageError
from fastdata.redaction import redact as redact_urls
from fastdata.storage.endpoints import ENDPOINT_OPTION_NAMES, endpoint_of
from fastdata.storage.urls import parse_url

_CREDENTIAL_HINTS = {
    "s3": "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_PROFILE",
    "gs": "check GOOGLE_APPLICATION_CREDENTIALS / GOOGLE_SERVICE_ACCOUNT",
    "az": "check AZURE_STORAGE_ACCOUNT_KEY / AZURE_STORAGE_SAS_TOKEN",
    "http": "the server refused the request",
    "https": "the server refused the request",
}
_SECRET_VARS = re.compile(r"(SECRET|TOKEN|KEY|PASSWORD|SAS|CREDENTIAL)", re.IGNORECASE)
# Query parameters of signed URLs and header-like "name=value" pairs that carry secrets.
_SECRET_PAIRS = re.compile(
    r"(?i)((?:x-amz-[a-z-]*|sig|signature|se|sp|sv|token|key|secret|password|credential)"
    r"[=:]\s*)[^&\s\"',;]+")


def redact(text: str, storage_options: dict | None = None) -> str:
    """``text`` with every known secret value and signed-URL parameter masked."""
    secrets = [str(v) for k, v in (storage_options or {}).items()
               if k not in ENDPOINT_OPTION_NAMES and isinstance(v, (str, bytes))
               and len(str(v)) >= 4]
    secrets += [v for k, v in os.environ.items()
                if _SECRET_VARS.search(k) and k.startswith(("AWS_", "GOOGLE_", "AZURE_"))
                and len(v) >= 4]
    for secret in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(secret, "***")
    return _SECRET_PAIRS.sub(r"\1***", redact_urls(text))


def _first_line(exc: BaseException) -> str:
    text = str(exc).split("\n", 1)[0]
    # obstore appends the server's whole response body after " - "; keep the cause.
    return text[:300]


def _connection_problem(text: str) -> str | None:
    lowered = text.lower()
    for needle, words in (("connection refused", "connection refused"),
                          ("dns error", "name not resolved"),
                          ("failed to lookup", "name not resolved"),
                          ("timed out", "timed out"), ("timeout", "timed out"),
                          ("connection reset", "connection reset"),
                          ("error sending request", "connection failed"),
                          ("error decoding response body", "connection dropped mid-transfer"),
                          ("incompletemessage", "connection dropped mid-transfer"),
                          ("connection closed", "connection dropped mid-transfer")):
        if needle in lowered:
            return words
    return None


def storage_error(exc: BaseException, url: str, storage_options: dict | None = None,
                  ) -> StorageError:
    """The StorageError to raise for ``exc``, an obstore failure on ``url``."""
    from obstore.exceptions import (NotFoundError, PermissionDeniedError,
                                    UnauthenticatedError)

    parsed = parse_url(url)
    debug = str(exc)
    kind = StorageError
    if isinstance(exc, (NotFoundError, FileNotFoundError)):
        if "NoSuchBucket" in debug:
            message = f"no such bucket {parsed.bucket!r} at {endpoint_of(parsed, storage_options)}"
        else:
            message, kind = "no such object", MissingObjectError
    elif isinstance(exc, (PermissionDeniedError, UnauthenticatedError)) or " 403 " in debug:
        message = f"access denied ({_CREDENTIAL_HINTS[parsed.scheme]})"
        kind = AccessDeniedError
    elif " 416 " in debug or "Range" in _first_line(exc) and "not satisf" in debug.lower():
        message = "byte range outside the object"
    else:
        problem = _connection_problem(debug)
        if problem is not None:
            endpoint = endpoint_of(parsed, storage_options)
            message = f"cannot reach the endpoint {endpoint} ({problem}, after retries)"
        else:
            message = f"request failed: {_first_line(exc)}"
    return kind(redact(message, storage_options), path=redact(url, storage_options))


@contextlib.contextmanager
def translated(url: str, storage_options: dict | None = None):
    """Turn obstore's exceptions raised inside the block into a StorageError."""
    from obstore.exceptions import BaseError
    try:
        yield
    except StorageError:
        raise
    except (BaseError, FileNotFoundError, ConnectionError, TimeoutError) as exc:
        raise storage_error(exc, url, storage_options) from None
