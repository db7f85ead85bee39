"""A local OpenTelemetry Collector (the one ``realparts/build-otelcol.sh`` builds) that hands on what it receives.

The collector's OTLP receiver listens on 127.0.0.1 (HTTP; gRPC off); its ``otlp_http`` exporter sends every
batch on, JSON-encoded (``encoding: json``), to a small HTTP sink in this process, which keeps the
ExportMetricsServiceRequest bodies (:attr:`OtelCollector.received`). So a test reads what the collector
itself parsed and re-exported, not what the sender meant to send.
"""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from gpuaware.local.processes import ChildProcess, free_port, port_in_use
from gpuaware.local.realparts import cache_dir, pinned_versions

BUILD_SCRIPT = "realparts/build-otelcol.sh"


class CollectorMissing(RuntimeError):
    """The pinned collector is not built; ``realparts/build-otelcol.sh`` builds it."""


def find_collector() -> Path:
    """``$GPUAWARE_OTELCOL``, else the binary ``realparts/build-otelcol.sh`` builds, or :class:`CollectorMissing`."""
    explicit = os.environ.get("GPUAWARE_OTELCOL")
    version = pinned_versions().get("OTELCOL_VERSION", "unknown")
    path = Path(explicit) if explicit else cache_dir() / f"otelcol-{version}" / "bin" / "otelcol"
    if not os.access(path, os.X_OK):
        raise CollectorMissing(f"OpenTelemetry Collector {version} not built: {path} missing; run `{BUILD_SCRIPT}` "
                               "(or point GPUAWARE_OTELCOL at a collector with the otlp receiver and otlp_http "
                               "exporter)")
    return path


class _Sink(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int):
        self.bodies: list[dict] = []
        self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(inner) -> None:
                body = inner.rfile.read(int(inner.headers.get("Content-Length", 0)))
                with self.lock:
                    self.bodies.append(json.loads(body))
                inner.send_response(200)
                inner.send_header("Content-Type", "application/json")
                inner.send_header("Content-Length", "2")
                inner.end_headers()
                inner.wfile.write(b"{}")

            def log_message(inner, *args) -> None:
                pass

        super().__init__(("127.0.0.1", port), Handler)


class OtelCollector(ChildProcess):
    """The collector on free loopback ports, its received metrics collected by an in-process sink. ``tls``: the
    receiver's certificate and key, and the CA its clients' certificates must chain to (None: any client)."""

    def __init__(self, workdir: Path, binary: Path | None = None,
                 tls: tuple[Path, Path, Path | None] | None = None):
        self.binary = binary or find_collector()
        self.port = free_port()
        self.sink = _Sink(free_port())
        self.tls = tls
        http: dict = {"endpoint": f"127.0.0.1:{self.port}"}
        if tls is not None:
            cert, key, client_ca = tls
            http["tls"] = {"cert_file": str(cert), "key_file": str(key),
                           **({"client_ca_file": str(client_ca)} if client_ca is not None else {})}
        config = {
            "receivers": {"otlp": {"protocols": {"http": http}}},
            "exporters": {"otlp_http": {
                "metrics_endpoint": f"http://127.0.0.1:{self.sink.server_address[1]}/v1/metrics",
                "encoding": "json", "compression": "none", "retry_on_failure": {"enabled": False}}},
            "service": {
                "pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["otlp_http"]}},
                "telemetry": {"metrics": {"level": "none"}},  # no self-metrics listener on :8888
            },
        }
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "otelcol.yaml").write_text(json.dumps(config, indent=2))  # JSON is YAML
        super().__init__("otelcol", [str(self.binary), f"--config=file:{workdir / 'otelcol.yaml'}"],
                         workdir / "otelcol.log")

    @property
    def endpoint(self) -> str:
        """The base URL of the OTLP/HTTP receiver (``/v1/metrics`` is added by senders)."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def __enter__(self) -> OtelCollector:
        threading.Thread(target=self.sink.serve_forever, name="otlp-sink", daemon=True).start()
        self.start()
        deadline = time.monotonic() + 60
        while not port_in_use("127.0.0.1", self.port):
            if not self.running() or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"otelcol did not listen on {self.port}:\n{self.log_tail()}")
            time.sleep(0.1)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.sink.shutdown()
        self.sink.server_close()

    def received(self) -> list[dict]:
        """The ExportMetricsServiceRequest bodies (OTLP JSON) the collector sent on, oldest first."""
        with self.sink.lock:
            return list(self.sink.bodies)

    def version(self) -> str:
        import subprocess

        return subprocess.run([str(self.binary), "--version"], capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()
