"""A local Alertmanager (Debian's `prometheus-alertmanager`, when installed) with gpuaware's inhibit rules."""

from __future__ import annotations

import importlib.resources
import json
import shutil
import urllib.request
from pathlib import Path

import yaml

from gpuaware.local.processes import ChildProcess, free_port

INHIBIT_RULES = Path(str(importlib.resources.files("gpuaware.dashboards").joinpath("alertmanager",
                                                                                     "inhibit_rules.yml")))


def binary() -> str | None:
    return shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


class LocalAlertmanager(ChildProcess):
    """One Alertmanager on 127.0.0.1, no cluster peers, every alert routed to a receiver that drops it: what
    it holds is what would page (``active``) and what the inhibit rules mute (``suppressed``)."""

    def __init__(self, workdir: Path, inhibit_rules: Path = INHIBIT_RULES):
        self.port = free_port()
        config = {"route": {"receiver": "null", "group_by": ["alertname"]}, "receivers": [{"name": "null"}],
                  **yaml.safe_load(inhibit_rules.read_text())}
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "alertmanager.yml").write_text(yaml.safe_dump(config))
        super().__init__("alertmanager", [
            binary() or "alertmanager", f"--config.file={workdir / 'alertmanager.yml'}",
            f"--storage.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address="], workdir / "alertmanager.log")

    def call(self, path: str, body: list | None = None) -> list | None:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as r:
            text = r.read()
        return json.loads(text) if text else None

    def alerts(self) -> list[dict]:
        return self.call("/api/v2/alerts") or []

    def active(self) -> set[str]:
        """Names of the alerts that would page: received, neither inhibited nor silenced."""
        return {a["labels"]["alertname"] for a in self.alerts() if a["status"]["state"] == "active"}
