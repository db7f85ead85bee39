"""Stream workers as supervised child processes (`gpuaware up`, `bench stream`, the tests)."""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

from pydantic import SecretStr

from gpuaware.local.processes import ChildProcess, free_port
from gpuaware.plumbing.kafka_settings import KafkaSettings


def worker_env(kafka: KafkaSettings, **stream: object) -> dict[str, str]:
    """The environment that points a `gpuaware` child at ``kafka`` (secrets included, never argv).

    Every Kafka setting goes over, derived from the model's fields, so SASL credentials, TLS files
    and whatever is added later cannot be forgotten here.
    """
    env = {}
    for name in type(kafka).model_fields:
        value = getattr(kafka, name)
        if value is None:
            continue
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        env[f"GPUAWARE_KAFKA__{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    env.update({f"GPUAWARE_STREAM__{k.upper()}": str(v) for k, v in stream.items()})
    return env


class StreamWorkerProcess(ChildProcess):
    """``gpuaware stream`` with its data dir at ``workdir/name``: one per worker, as RocksDB locks its files;
    a worker started again under the same name finds its table there and replays only the changelog's tail."""

    def __init__(self, kafka: KafkaSettings, app_id: str, workdir: Path, name: str, *, node_identity: str,
                 **stream: object):
        """``node_identity`` (``stream.node_identity``) has no default here: a worker started without an apiserver to
        check node tokens with must say ``"off"`` where it is started (docs/security.md says what that exposes)."""
        self.metrics_port = free_port()
        super().__init__(
            name,
            [sys.executable, "-m", "gpuaware", "--log-level", "warning", "stream", "--app-id", app_id,
             "--metrics-port", str(self.metrics_port), "--data-dir", str(workdir / name)],
            workdir / f"{name}.log", worker_env(kafka, node_identity=node_identity, **stream),
        )

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def counter(self, name: str) -> float:
        """The value of an unlabelled sample (0 while the endpoint is not up yet)."""
        try:
            text = self.metrics()
        except OSError:
            return 0.0
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return 0.0
