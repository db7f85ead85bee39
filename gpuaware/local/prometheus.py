"""A local Prometheus (Debian's `prometheus` binary, when installed) with gpuaware's rules."""

from __future__ import annotations

import importlib.resources
import json
import shutil
import urllib.parse
import urllib.request
from pathlib import Path

from gpuaware.deploy.scrape import local_scrape_configs
from gpuaware.local.processes import ChildProcess, free_port

RULES = Path(str(importlib.resources.files("gpuaware.dashboards").joinpath("prometheus", "rules.yml")))


def available() -> bool:
    return shutil.which("prometheus") is not None


class LocalPrometheus(ChildProcess):
    """Scrapes ``targets`` (workload name -> ports on 127.0.0.1) every second and evaluates the rules.

    The shipped workloads are scraped through the scrape configs prometheus-operator generates from the
    shipped PodMonitors (``gpuaware.deploy.scrape``), so series carry the labels they get in a cluster."""

    def __init__(self, workdir: Path, targets: dict[str, list[int]], interval_s: int = 1, rules: Path = RULES,
                 alertmanager_port: int | None = None):
        self.port = free_port()
        config = {
            "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"},
            "rule_files": [str(rules)],
            "scrape_configs": local_scrape_configs(targets),
        }
        if alertmanager_port is not None:  # firing alerts are sent there (gpuaware.local.alertmanager)
            target = {"targets": [f"127.0.0.1:{alertmanager_port}"]}
            config["alerting"] = {"alertmanagers": [{"static_configs": [target]}]}
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(json.dumps(config, indent=2))  # JSON is YAML
        super().__init__("prometheus", [
            "prometheus", f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}"], workdir / "prometheus.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, **params: str) -> dict:
        query = "?" + urllib.parse.urlencode(params) if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as r:
            return json.loads(r.read())

    def query(self, expr: str) -> list:
        body = self.api("/api/v1/query", query=expr)
        if body.get("status") != "success":
            raise RuntimeError(f"query {expr!r} failed: {body}")
        return body["data"]["result"]

    def alerts(self) -> list[dict]:
        return self.api("/api/v1/alerts")["data"]["alerts"]

    def firing(self) -> set[str]:
        return {a["labels"]["alertname"] for a in self.alerts() if a["state"] == "firing"}
