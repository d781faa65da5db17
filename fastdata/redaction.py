"""Credentials out of text that fastdata shows or writes.

A URL can carry a secret in two places: its user-info
(``https://user:password@host/...``) and its query (a presigned S3 or GCS
URL's ``X-Amz-Signature=...``, an Azure SAS token's ``sig=...``, an API
``token=...``). :func:`redact` masks both wherever a URL appears in a text:
the user-info becomes ``***@``, every query value ``***`` (the parameter names
stay, so a message still says what kind of URL it was). Errors, ``fastdata
info``, summaries, reports and manifests pass their text through it. No
imports beyond the standard library: ``fastdata.errors`` uses it.
"""

from __future__ import annotations

import re

MASK = "***"

# scheme://user[:password]@ ... the user-info ends at the first "@" before the path.
_USER_INFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@?#\"'<>]+@")
# The query of a URL: from "?" to the end of the URL (a fragment, space or quote).
_QUERY = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s?#\"'<>]*\?)([^\s#\"'<>]*)")
_VALUE = re.compile(r"(=)[^&;]*")


def _mask_query(match: re.Match) -> str:
    query = match.group(2)
    masked = _VALUE.sub(r"\1" + MASK, query) if "=" in query else (MASK if query else "")
    return match.group(1) + masked


def redact(text: str) -> str:
    """``text`` with the user-info and the query values of every URL in it masked."""
    if "://" not in text:
        return text
    return _QUERY.sub(_mask_query, _USER_INFO.sub(r"\1" + MASK + "@", text))


def redact_url(url):
    """A URL (or path) as it may be shown or recorded: :func:`redact` of it;
    anything that is not text is returned as it is."""
    return redact(url) if isinstance(url, str) else url
