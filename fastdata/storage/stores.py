"""One obstore store per (process, scheme, bucket, settings), built from the
cloud's standard environment variables merged with ``storage_options``, for
s3://, gs:// and az:// (http(s):// is read by fastdata.storage.http).

obstore reads the standard variables itself (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION / AWS_DEFAULT_REGION,
AWS_ENDPOINT_URL; GOOGLE_SERVICE_ACCOUNT, GOOGLE_APPLICATION_CREDENTIALS;
AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_ACCOUNT_KEY, ...). This module adds
what it does not do: plain-http endpoints allowed when the endpoint says
http:// (wherever it is set: see endpoints.py), ``endpoint`` taken for GCS's
``base_url``, AWS_PROFILE (through boto3, when installed), bounded retries and
timeouts, and the split of ``storage_options`` into store, client and retry
settings. obstore is imported inside functions so that ``import fastdata``
stays light.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from datetime import timedelta

from fastdata.errors import StorageError
from fastdata.storage.endpoints import endpoint_of
from fastdata.storage.forked import mark_runtime
from fastdata.storage.urls import ParsedURL

#: storage_options keys that configure the HTTP client rather than the store.
CLIENT_KEYS = frozenset({
    "allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type",
    "default_headers", "http1_only", "http2_keep_alive_interval", "http2_keep_alive_timeout",
    "http2_keep_alive_while_idle", "http2_only", "pool_idle_timeout", "pool_max_idle_per_host",
    "proxy_url", "proxy_ca_certificate", "proxy_excludes", "randomize_addresses",
    "read_timeout", "root_certificate", "timeout", "user_agent",
})
#: storage_options keys for the retry policy.
RETRY_KEYS = frozenset({"max_retries", "retry_timeout", "init_backoff", "max_backoff"})
#: storage_options keys fastdata itself understands.
OWN_KEYS = frozenset({"profile"})

# A stopped server must give an error in seconds, a stalled one within a minute,
# while a large download may take as long as it needs (no overall timeout that
# a slow link would hit: read_timeout catches a stall between chunks instead).
DEFAULT_CLIENT = {
    "connect_timeout": timedelta(seconds=5),
    "read_timeout": timedelta(seconds=30),
    "timeout": timedelta(hours=6),
}
DEFAULT_RETRIES = {"max_retries": 4, "retry_timeout": 60.0, "init_backoff": 0.2,
                   "max_backoff": 4.0}

# AZURITE_ too: obstore reads AZURITE_BLOB_STORAGE_URL for the Azure emulator.
_ENV_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_", "AZURITE_")

_stores: dict[tuple, object] = {}
_lock = threading.Lock()


def get_store(parsed: ParsedURL, storage_options: dict | None = None):
    """The obstore store serving ``parsed``: built once per process and settings
    (a store never crosses a fork: its connection pool belongs to the parent)."""
    mark_runtime()
    key = (os.getpid(), parsed.scheme, parsed.bucket, parsed.account,
           _fingerprint(storage_options), _fingerprint(_cloud_environment()))
    with _lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = _build_store(parsed, dict(storage_options or {}))
        return store


def _cloud_environment() -> dict:
    # Part of the cache key: a changed AWS_ENDPOINT_URL must give a new store.
    return {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}


def _fingerprint(options: dict | None) -> str:
    text = json.dumps(options or {}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _split_options(options: dict) -> tuple[dict, dict, dict]:
    """storage_options as (store config, client options, retry settings)."""
    config, client, retry = {}, dict(DEFAULT_CLIENT), dict(DEFAULT_RETRIES)
    for name, value in options.items():
        if name in CLIENT_KEYS:
            client[name] = value
        elif name in RETRY_KEYS:
            retry[name] = value
        elif name not in OWN_KEYS:
            config[name] = value
    return config, client, retry


def _retry_config(retry: dict) -> dict:
    def seconds(value):
        return value if isinstance(value, timedelta) else timedelta(seconds=float(value))
    return {"max_retries": int(retry["max_retries"]),
            "retry_timeout": seconds(retry["retry_timeout"]),
            "backoff": {"init_backoff": seconds(retry["init_backoff"]),
                        "max_backoff": seconds(retry["max_backoff"]), "base": 2}}


def _build_store(parsed: ParsedURL, options: dict):
    from obstore.exceptions import BaseError
    from obstore.store import AzureStore, GCSStore, S3Store

    config, client, retry = _split_options(options)
    endpoint = endpoint_of(parsed, options)
    if endpoint.startswith("http://"):
        client.setdefault("allow_http", True)
    common = {"client_options": client, "retry_config": _retry_config(retry)}
    where = f"{parsed.scheme}://{parsed.bucket}"
    try:
        if parsed.scheme == "s3":
            provider = _aws_profile_provider(options)
            if provider is not None:
                common["credential_provider"] = provider
            return S3Store(parsed.bucket, config=config, **common)
        if parsed.scheme == "gs":
            # One name for the endpoint on every cloud: obstore calls GCS's "base_url".
            if "endpoint" in config:
                config.setdefault("base_url", config.pop("endpoint"))
            return GCSStore(parsed.bucket, config=config, **common)
        if parsed.account:
            config.setdefault("account_name", parsed.account)
        return AzureStore(parsed.bucket, config=config, **common)
    except (BaseError, ValueError, TypeError) as exc:
        name = type(exc).__name__
        if "UnknownConfigurationKey" in name or "Unknown" in str(exc)[:200]:
            raise StorageError(f"unknown storage option in {sorted(options)}; storage_options "
                               "take obstore's configuration names (e.g. 'endpoint', "
                               "'region', 'access_key_id')", path=where) from None
        raise StorageError(f"cannot configure the store: {name}", path=where) from None


def _aws_profile_provider(options: dict):
    """A boto3 credential provider when a named AWS profile is asked for (obstore
    reads no ~/.aws files itself); None when keys come from the environment."""
    profile = options.get("profile") or os.environ.get("AWS_PROFILE")
    if not profile or options.get("access_key_id") or os.environ.get("AWS_ACCESS_KEY_ID"):
        return None
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        raise StorageError(f"AWS profile {profile!r} needs boto3 (pip install boto3), or set "
                           "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY instead") from None
    return Boto3CredentialProvider(boto3.Session(profile_name=profile))


def store_and_key(url: str, storage_options: dict | None = None):
    """The store serving ``url`` and the object's key in it."""
    from fastdata.storage.urls import parse_url

    parsed = parse_url(url)
    return get_store(parsed, storage_options), parsed.key


def origin_of_store(url: str, storage_options: dict | None = None) -> str:
    """What one gate of requests serves (fastdata.storage.adaptive): a
    bucket at its endpoint."""
    from fastdata.storage.urls import parse_url

    parsed = parse_url(url)
    return f"{endpoint_of(parsed, storage_options)}/{parsed.bucket}"
