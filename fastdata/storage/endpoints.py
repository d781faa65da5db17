"""Where a store's requests go: the endpoint that obstore will use for a URL,
read from the same settings obstore reads (storage_options first, then the
environment), so that fastdata can allow plain http for it, name it in
messages and key the shard cache by it. No third-party imports.

* s3: ``endpoint`` (or ``aws_endpoint`` / ``aws_endpoint_url`` / ``endpoint_url``),
  AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, AWS_ENDPOINT.
* gs: ``base_url`` (or ``google_base_url``; fastdata also takes ``endpoint``),
  GOOGLE_BASE_URL, else the ``gcs_base_url`` of the service-account key
  (``service_account_key`` / GOOGLE_SERVICE_ACCOUNT_KEY, or the file named by
  ``service_account`` / GOOGLE_SERVICE_ACCOUNT / GOOGLE_SERVICE_ACCOUNT_PATH).
* az: with ``use_emulator`` / AZURE_STORAGE_USE_EMULATOR, Azurite at
  AZURITE_BLOB_STORAGE_URL (default http://127.0.0.1:10000; obstore then ignores
  any endpoint); else ``endpoint`` (or ``azure_storage_endpoint`` /
  ``azure_endpoint``), AZURE_STORAGE_ENDPOINT, AZURE_ENDPOINT.
"""

from __future__ import annotations

import json
import os

from fastdata.storage.urls import ParsedURL

#: storage_options names (obstore's, with their aliases) that set the endpoint.
ENDPOINT_OPTIONS = {
    "s3": ("endpoint", "aws_endpoint", "aws_endpoint_url", "endpoint_url"),
    "gs": ("endpoint", "base_url", "google_base_url"),
    "az": ("endpoint", "azure_storage_endpoint", "azure_endpoint"),
}
#: Every one of those names: an endpoint is shown in messages, never masked.
ENDPOINT_OPTION_NAMES = frozenset(n for names in ENDPOINT_OPTIONS.values() for n in names)
_ENDPOINT_VARS = {
    "s3": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"),
    "gs": ("GOOGLE_BASE_URL",),
    "az": ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT"),
}
_DEFAULT_NAMES = {"s3": "the S3 endpoint", "gs": "Google Cloud Storage",
                  "az": "Azure Blob Storage"}
_GCS_KEY_OPTIONS = ("service_account_key", "google_service_account_key")
_GCS_KEY_FILE_OPTIONS = ("service_account", "google_service_account",
                         "service_account_path", "google_service_account_path")
_GCS_KEY_FILE_VARS = ("GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH")
_AZURE_EMULATOR_OPTIONS = ("use_emulator", "azure_storage_use_emulator")
AZURITE_DEFAULT_URL = "http://127.0.0.1:10000"
AZURITE_ACCOUNT = "devstoreaccount1"


def endpoint_of(parsed: ParsedURL, storage_options: dict | None) -> str:
    """The endpoint requests go to, as shown in messages (never a credential)."""
    if parsed.scheme in ("http", "https"):
        return f"{parsed.scheme}://{parsed.bucket}"
    options = storage_options or {}
    if parsed.scheme == "az" and _azure_emulator(options):
        base = os.environ.get("AZURITE_BLOB_STORAGE_URL") or AZURITE_DEFAULT_URL
        account = options.get("account_name") or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
        return f"{base.rstrip('/')}/{account or parsed.account or AZURITE_ACCOUNT}"
    found = _first_set(options, ENDPOINT_OPTIONS[parsed.scheme], _ENDPOINT_VARS[parsed.scheme])
    if not found and parsed.scheme == "gs":
        found = _gcs_key_base_url(options)
    return found or _DEFAULT_NAMES[parsed.scheme]


def _first_set(options: dict, names, variables) -> str:
    for name in names:
        if options.get(name):
            return str(options[name])
    for var in variables:
        if os.environ.get(var):
            return os.environ[var]
    return ""


def _truthy(value) -> bool:
    # obstore's reading of a boolean setting given as text.
    return str(value).strip().lower() in ("1", "true", "on", "yes", "y")


def _azure_emulator(options: dict) -> bool:
    for name in _AZURE_EMULATOR_OPTIONS:
        if name in options:
            return _truthy(options[name])
    return _truthy(os.environ.get("AZURE_STORAGE_USE_EMULATOR", ""))


def _gcs_key_base_url(options: dict) -> str:
    """The ``gcs_base_url`` of the service-account key in use, if it has one (the
    way obstore is pointed at an emulator); "" when none is readable."""
    text = _first_set(options, _GCS_KEY_OPTIONS, ("GOOGLE_SERVICE_ACCOUNT_KEY",))
    if not text:
        path = _first_set(options, _GCS_KEY_FILE_OPTIONS, _GCS_KEY_FILE_VARS)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError:     # no file (or none named): obstore reports its own error
            return ""
    try:
        key = json.loads(text)
    except ValueError:
        return ""
    base = key.get("gcs_base_url") if isinstance(key, dict) else None
    return base if isinstance(base, str) else ""
