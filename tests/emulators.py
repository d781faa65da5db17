"""Cloud storage emulators for the gs:// and az:// tests, each a subprocess on a
port of 127.0.0.1 it binds itself, killed at teardown; the fixtures are re-exported by
conftest.py. Each skips its tests when its emulator is not installed.

* ``gcs_server`` (session): gcp-storage-emulator, in memory; ``gcs_env`` points
  obstore's GCS client at it with GOOGLE_SERVICE_ACCOUNT_KEY, a key whose
  ``gcs_base_url`` is the emulator and whose ``disable_oauth`` skips tokens.
  The emulator serves Google's JSON API, but obstore speaks the XML API, of
  which the emulator has only GET and PUT, answered without the ETag and
  Last-Modified headers obstore requires, and no HEAD, listing or DELETE: a
  missing object and the endpoint settings can be tested against it, reading
  or writing an object cannot.
* ``azure_server`` (session): Azurite's Blob service, in memory; ``azure_env``
  points obstore at it with Azurite's well-known account and key and
  AZURE_STORAGE_ENDPOINT (fastdata allows its http:// itself).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
from email.utils import formatdate
from pathlib import Path

import optional
import pytest
from ci_needs import missing
from servers import wait_until_listening

#: Azurite's built-in account and key (public, documented by Microsoft).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/"
               "K1SZFPTOtr/KBHBeksoGMGw==")
AZURITE_NPM_BIN = "/opt/azurite/node_modules/.bin/azurite-blob"


class EmulatorProcess:
    """``command()`` serving on a port of 127.0.0.1 it binds itself (``port``
    0 until it listens), run in a temporary folder that also holds its output
    (``log_path``)."""

    what = "emulator"

    def __init__(self) -> None:
        self.port = 0
        self.workdir = tempfile.mkdtemp(prefix=f"{self.what}-")
        self.log_path = Path(self.workdir, "server.log")
        self.proc: subprocess.Popen | None = None
        self.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.workdir)
        self.port = wait_until_listening(self.proc, self.what, self.log_path,
                                         on_failure=self.stop)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    def request(self, method: str, path: str, body: bytes = b"",
                headers: dict | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()


class GCSEmulator(EmulatorProcess):
    what = "gcp-storage-emulator"

    def __init__(self) -> None:
        optional.skip_if_missing("gcp-storage-emulator")
        super().__init__()
        self.env = {"GOOGLE_SERVICE_ACCOUNT_KEY": json.dumps(self.service_account_key())}

    def service_account_key(self) -> dict:
        """The key that sends obstore's requests here, unauthenticated."""
        return {"gcs_base_url": self.endpoint, "disable_oauth": True, "client_email": "",
                "private_key": "", "private_key_id": ""}

    def command(self) -> list[str]:
        return [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
                "--port", str(self.port), "--in-memory", "--quiet"]

    def make_bucket(self, name: str) -> str:
        status, body = self.request("POST", "/storage/v1/b?project=test",
                                    json.dumps({"name": name}).encode(),
                                    {"Content-Type": "application/json"})
        if status not in (200, 409):            # 409: it exists already
            raise RuntimeError(f"cannot create bucket {name}: {status} {body[:200]!r}")
        return f"gs://{name}"


def azurite_command() -> str | None:
    """Azurite's Blob service: on PATH, or where .ci/run installs it with npm."""
    found = shutil.which("azurite-blob")
    if found is None and os.access(AZURITE_NPM_BIN, os.X_OK):
        found = AZURITE_NPM_BIN
    return found


class AzuriteServer(EmulatorProcess):
    what = "azurite"

    def __init__(self) -> None:
        self.binary = azurite_command()
        if self.binary is None or shutil.which("node") is None:
            missing("Azurite is not installed (npm install --prefix /opt/azurite azurite@3)")
        super().__init__()
        self.account_url = f"{self.endpoint}/{AZURITE_ACCOUNT}"
        self.env = {"AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT,
                    "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY,
                    "AZURE_STORAGE_ENDPOINT": self.account_url}

    def command(self) -> list[str]:
        return [self.binary, "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
                "--inMemoryPersistence", "--skipApiVersionCheck", "--disableTelemetry",
                "--silent"]

    def make_container(self, name: str) -> str:
        """Create container ``name`` (obstore cannot): a PUT signed with Shared Key."""
        headers = {"x-ms-date": formatdate(usegmt=True), "x-ms-version": "2021-08-06"}
        # Shared Key string-to-sign: verb, 11 empty standard headers (a zero
        # Content-Length counts as empty), the x-ms-* headers, the resource.
        signed = "\n".join(["PUT"] + [""] * 11) + "\n"
        signed += "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
        signed += f"/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}/{name}\nrestype:container"
        digest = hmac.new(base64.b64decode(AZURITE_KEY), signed.encode(), hashlib.sha256)
        headers["Authorization"] = (f"SharedKey {AZURITE_ACCOUNT}:"
                                    f"{base64.b64encode(digest.digest()).decode()}")
        status, body = self.request("PUT", f"/{AZURITE_ACCOUNT}/{name}?restype=container",
                                    b"", headers)
        if status not in (201, 409):            # 409: it exists already
            raise RuntimeError(f"cannot create container {name}: {status} {body[:200]!r}")
        return f"az://{name}"


def _set_env(monkeypatch, prefixes: tuple[str, ...], env: dict) -> None:
    """Only ``env`` among the variables with these prefixes."""
    for name in list(os.environ):
        if name.startswith(prefixes):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="session")
def gcs_server():
    server = GCSEmulator()
    yield server
    server.stop()


@pytest.fixture
def gcs_env(monkeypatch, gcs_server):
    """GOOGLE_SERVICE_ACCOUNT_KEY pointing at ``gcs_server``; returns the server."""
    _set_env(monkeypatch, ("GOOGLE_",), gcs_server.env)
    return gcs_server


@pytest.fixture(scope="session")
def azure_server():
    server = AzuriteServer()
    yield server
    server.stop()


@pytest.fixture
def azure_env(monkeypatch, azure_server):
    """The AZURE_STORAGE_* variables pointing at ``azure_server``; returns it."""
    _set_env(monkeypatch, ("AZURE_", "AZURITE_"), azure_server.env)
    return azure_server
