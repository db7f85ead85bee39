"""Prometheus scrape configs as prometheus-operator generates them from the shipped PodMonitors.

Alert rules match the labels a target really gets (``job``, ``namespace``, ``pod``, ``node``,
``cluster``), and those come from the operator's relabelings, not from the monitor's name. The
relabel rules below follow prometheus-operator's ``generatePodMonitorConfig``
(pkg/prometheus/promcfg.go): ``job`` is ``<namespace>/<name>`` of the PodMonitor unless its
``jobLabel`` names a pod label with a value, ``endpoint`` is the port name, then the monitor's own
relabelings. Prometheus itself applies them: :func:`local_scrape_configs` replaces the Kubernetes
service discovery with static targets that carry the ``__meta_kubernetes_pod_*`` labels the pod
role would give the shipped pods, so a local Prometheus produces exactly the series a cluster's would.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "deploy" / "base"
MONITORS = BASE / "monitoring" / "podmonitors.yaml"
WORKLOADS = (BASE / "agent" / "daemonset.yaml", BASE / "stream" / "stream.yaml", BASE / "scheduler" / "scheduler.yaml")

# Spec field -> Prometheus relabel_config key (the operator's generateRelabelConfig).
_RELABEL_KEYS = {"sourceLabels": "source_labels", "separator": "separator", "targetLabel": "target_label",
                 "regex": "regex", "modulus": "modulus", "replacement": "replacement", "action": "action"}


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def namespace() -> str:
    """The namespace the base kustomization puts everything in."""
    return yaml.safe_load((BASE / "kustomization.yaml").read_text())["namespace"]


def pod_monitors() -> list[dict]:
    return [d for d in _documents(MONITORS) if d["kind"] == "PodMonitor"]


def workloads() -> list[dict]:
    return [d for path in WORKLOADS for d in _documents(path) if d["kind"] in {"DaemonSet", "Deployment"}]


def _user_relabelings(relabelings: list[dict]) -> list[dict]:
    out = []
    for r in relabelings:
        rule = {_RELABEL_KEYS[k]: v for k, v in r.items() if k in _RELABEL_KEYS}
        if "action" in rule:
            rule["action"] = rule["action"].lower()
        out.append(rule)
    return out


def pod_monitor_config(monitor: dict, endpoint: dict, index: int, ns: str) -> dict[str, Any]:
    """One scrape config, relabelings in the operator's order (TLS, auth and limits left out: none ship)."""
    spec = monitor["spec"]
    name = monitor["metadata"]["name"]
    monitor_ns = monitor["metadata"].get("namespace", ns)
    relabel: list[dict[str, Any]] = [
        {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
    ]
    if endpoint.get("filterRunning", True):
        relabel.append({"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
                        "regex": "(Failed|Succeeded)"})
    for key in sorted(spec["selector"].get("matchLabels", {})):
        relabel.append({"action": "keep", "source_labels": [f"__meta_kubernetes_pod_label_{_sanitize(key)}",
                                                            f"__meta_kubernetes_pod_labelpresent_{_sanitize(key)}"],
                        "regex": f"({spec['selector']['matchLabels'][key]});true"})
    if spec["selector"].get("matchExpressions"):
        raise ValueError(f"PodMonitor {name}: matchExpressions are not modelled; use matchLabels")
    port = endpoint.get("port", "")
    if port:
        relabel.append({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                        "regex": port})
    relabel += [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    ]
    for label in spec.get("podTargetLabels", []):
        relabel.append({"source_labels": [f"__meta_kubernetes_pod_label_{_sanitize(label)}"],
                        "target_label": _sanitize(label), "regex": "(.+)", "replacement": "${1}"})
    relabel.append({"target_label": "job", "replacement": f"{monitor_ns}/{name}"})
    if spec.get("jobLabel"):
        relabel.append({"source_labels": [f"__meta_kubernetes_pod_label_{_sanitize(spec['jobLabel'])}"],
                        "target_label": "job", "regex": "(.+)", "replacement": "${1}"})
    if port:
        relabel.append({"target_label": "endpoint", "replacement": port})
    relabel += _user_relabelings(endpoint.get("relabelings", []))
    # One shard: the operator's sharding rules keep every target.
    relabel += [{"source_labels": ["__address__"], "target_label": "__tmp_hash", "modulus": 1, "action": "hashmod"},
                {"source_labels": ["__tmp_hash"], "regex": "0", "action": "keep"}]
    config: dict[str, Any] = {"job_name": f"podMonitor/{monitor_ns}/{name}/{index}",
                              "honor_labels": bool(endpoint.get("honorLabels", False)),
                              "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": [monitor_ns]}}]}
    for key, field in (("scrape_interval", "interval"), ("scrape_timeout", "scrapeTimeout"), ("metrics_path", "path"),
                       ("scheme", "scheme")):
        if endpoint.get(field):
            config[key] = endpoint[field]
    config["relabel_configs"] = relabel
    if endpoint.get("metricRelabelings"):
        config["metric_relabel_configs"] = _user_relabelings(endpoint["metricRelabelings"])
    return config


def operator_scrape_configs() -> list[dict[str, Any]]:
    """What the operator writes for the shipped PodMonitors (Kubernetes service discovery)."""
    ns = namespace()
    return [pod_monitor_config(m, ep, i, ns) for m in pod_monitors()
            for i, ep in enumerate(m["spec"]["podMetricsEndpoints"])]


def pod_meta_labels(workload: dict, ns: str, pod: str, node: str) -> list[dict[str, str]]:
    """The ``__meta_kubernetes_pod_*`` labels of Prometheus' pod role, one set per container port."""
    template = workload["spec"]["template"]
    common = {"__meta_kubernetes_namespace": ns, "__meta_kubernetes_pod_name": pod,
              "__meta_kubernetes_pod_node_name": node, "__meta_kubernetes_pod_phase": "Running",
              "__meta_kubernetes_pod_ready": "true",
              "__meta_kubernetes_pod_controller_kind": workload["kind"] if workload["kind"] == "DaemonSet"
              else "ReplicaSet",
              "__meta_kubernetes_pod_controller_name": workload["metadata"]["name"]}
    for key, value in template["metadata"].get("labels", {}).items():
        common[f"__meta_kubernetes_pod_label_{_sanitize(key)}"] = str(value)
        common[f"__meta_kubernetes_pod_labelpresent_{_sanitize(key)}"] = "true"
    out = []
    for container in template["spec"]["containers"]:
        for port in container.get("ports", []):
            out.append({**common, "__meta_kubernetes_pod_container_name": container["name"],
                        "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                        "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                        "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP")})
    return out


def local_scrape_configs(targets: dict[str, list[int]], node: str = "local") -> list[dict[str, Any]]:
    """Scrape configs for processes on 127.0.0.1 named by workload (``gpuaware-agent`` -> ports): the
    operator's configs with each workload's pods as static targets carrying their pod-role meta labels
    (the metrics port mapped to the local one). Names that are not a shipped workload (a stand-in
    dcgm-exporter) get a plain static job of that name."""
    ns = namespace()
    by_name = {w["metadata"]["name"]: w for w in workloads()}
    groups: list[dict[str, Any]] = []
    plain = []
    for name, ports in targets.items():
        if name not in by_name:
            plain.append({"job_name": name, "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports]}]})
            continue
        for i, port in enumerate(ports):
            for labels in pod_meta_labels(by_name[name], ns, f"{name}-{i}", node):
                # Only the metrics port listens locally; other ports get an address nothing scrapes (dropped).
                metrics = labels["__meta_kubernetes_pod_container_port_name"] == "metrics"
                groups.append({"targets": [f"127.0.0.1:{port if metrics else 0}"], "labels": labels})
    configs = []
    for config in operator_scrape_configs():
        local = {k: v for k, v in config.items() if k != "kubernetes_sd_configs"}
        local["static_configs"] = groups
        local.pop("scrape_interval", None)  # the local Prometheus' global interval
        configs.append(local)
    return configs + plain
