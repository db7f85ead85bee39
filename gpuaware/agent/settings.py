from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from gpuaware.contract.dcgm import LEGACY, MIN_LABEL_BUDGET, agent_labels, pod_label_name


def otlp_metrics_url(endpoint: str) -> str:
    """The OTLP/HTTP metrics URL for ``endpoint``: a collector's base URL (``http://host:4318``, as
    OTEL_EXPORTER_OTLP_ENDPOINT takes it) gets ``/v1/metrics``; a URL already ending in it is kept."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"agent.otlp_metrics_endpoint {endpoint!r}: give an http:// or https:// URL of an OTLP/HTTP "
                         "receiver, e.g. http://otel-collector:4318 (OTLP/gRPC on 4317 is not spoken)")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise ValueError(f"agent.otlp_metrics_endpoint {endpoint!r}: {exc}") from None
    base = endpoint.rstrip("/")
    return base if parts.path.rstrip("/").endswith("/v1/metrics") else base + "/v1/metrics"


class AgentSettings(BaseModel):
    """The ``agent:`` section of the configuration (env ``GPUAWARE_AGENT__*``)."""

    model_config = ConfigDict(extra="forbid")

    collector: Literal["nvml", "sim"] = "nvml"
    node_name: str | None = Field(None, description="defaults to NODE_NAME (downward API), then the hostname")
    scenario: str = Field("baseline", description="sim: a scenario name from gpuaware/agent/scenarios or a YAML path")
    sim_nodes: int | None = Field(None, ge=1, le=4096, description="sim: override the scenario's node count")
    sim_gpus_per_node: int | None = Field(None, ge=1, le=16)
    policy_path: str | None = Field(None, description="sampling policy YAML, hot-reloaded")
    spool_dir: str = "/var/lib/gpuaware/spool"
    spool_max_mib: int = Field(256, ge=1, le=65536)
    node_token_path: str | None = Field(None, description="projected ServiceAccount token (audience gpuaware-stream) "
                                                          "sent with every record as proof of the node "
                                                          "(docs/security.md); unset: none sent")
    cordon_poll_s: float = Field(15.0, ge=0, le=3600,
                                 description="how often the node's cordoned-GPU annotation is read (0: never)")
    api_server: str | None = Field(None, description="Kubernetes API URL for reading the node; default: in-cluster "
                                                      "config when running in a pod, else the kubeconfig KUBECONFIG "
                                                      "names, else no reads")
    metrics_schema: Literal["dcgm-legacy", "dcgm-4.9", "dcgm-4.10"] = Field(
        "dcgm-legacy", description="DCGM families as dcgm-exporter <= 4.8 writes them (%, MiB, MHz, mJ; Hostname, "
                                   "DCGM_FI_DRIVER_VERSION), as 4.9 (DCGM 4.7 names where confirmed, with Hz, J, "
                                   "ratio; hostname, DCGM_FI_SYSTEM_DRIVER_VERSION; docs/agent.md) or as 4.10 (4.9 "
                                   "with DCGM_FI_PROF_PCIE_{TX,RX}_BYTES_PER_SECOND)")
    metrics_scrape_labels: int = Field(
        9, ge=0, le=100, description="the labels a series gains between /metrics and the store that counts them: "
                                     "__name__ and, from the shipped PodMonitor, namespace, pod, container, "
                                     "endpoint, job, instance, cluster and node")
    metrics_label_budget: int = Field(
        30, le=1000, description="the most labels any series carries where it is stored (Mimir's and Grafana "
                                 "Cloud's default limit is 30): /metrics carries at most this less "
                                 "metrics_scrape_labels; that must hold the "
                                 f"{MIN_LABEL_BUDGET} labels the agent itself may put on a DCGM series; "
                                 "allowlisted pod labels fill the rest, in the list's order")
    metrics_pod_labels: list[str] = Field(
        default_factory=list, description="Kubernetes pod label keys copied onto the GPU's DCGM series as "
                                          "label_<key> (e.g. app.kubernetes.io/name -> label_app_kubernetes_io_name);"
                                          " default none; read by the pod informer of agent.pod_uids (its RBAC); "
                                          "env: comma-separated")
    dcgm_exporter: Literal["replace", "beside"] = Field(
        "replace", description="replace: the agent exports DCGM_* itself; beside: the GPU Operator's dcgm-exporter "
                               "runs too and the agent's copies are named gpuaware_dcgm_* so nothing counts twice")
    power_capper_socket: str | None = Field(None, description="nvml: ask the power capper container on this unix "
                                                              "socket to set power limits (the agent may not; "
                                                              "docs/security.md); unset: NVML directly")
    pod_resources_socket: str = Field("/var/lib/kubelet/pod-resources/kubelet.sock",
                                      description="kubelet PodResources API; GPU metrics get pod labels when present")
    resource_slices: bool = Field(False, description="publish this node's GPUs as DRA ResourceSlices (driver "
                                                     "gpu.nvidia.com) for nodes without NVIDIA's DRA driver; needs "
                                                     "deploy/components/agent-resource-slices (docs/dra.md)")
    resource_slices_retry_s: float = Field(30.0, gt=0, le=3600,
                                           description="a failed ResourceSlice publish is tried again after this long")
    resource_slices_shareable: bool = Field(False, description="publish the GPUs as shareable (allowMultipleAllocations"
                                                               ": claims take GPU-memory shares, DRA consumable "
                                                               "capacity, Kubernetes 1.34+ with DRAConsumableCapacity"
                                                               "); only where the workloads share GPUs safely")
    otlp_metrics_endpoint: str | None = Field(
        None, description="OTLP/HTTP receiver the GPU metrics are also pushed to, as hw.* names where the "
                          "OpenTelemetry conventions define them (docs/agent.md), e.g. http://otel-collector:4318 "
                          "(/v1/metrics is added); unset: off, /metrics only")
    otlp_metrics_interval_s: float = Field(15.0, ge=1, le=3600, description="how often the OTLP metrics are pushed")
    otlp_metrics_certificate: str | None = Field(
        None, description="PEM CA bundle that verifies an https:// OTLP receiver; unset: the system's CAs. Headers "
                          "(an API key) come from OTEL_EXPORTER_OTLP_METRICS_HEADERS, e.g. from a Secret")
    otlp_metrics_client_certificate: str | None = Field(
        None, description="PEM client certificate for an OTLP receiver that asks for one (mutual TLS); with "
                          "otlp_metrics_client_key")
    otlp_metrics_client_key: str | None = Field(None, description="PEM key of otlp_metrics_client_certificate")
    pod_uids: bool = Field(False, description="follow the UIDs of this node's pods (an informer on spec.nodeName) "
                                              "so shared GPUs get per-pod series; needs list/watch of pods, "
                                              "granted by deploy/components/agent-pod-uids (off: least privilege)")

    @field_validator("otlp_metrics_endpoint")
    @classmethod
    def _otlp_endpoint_is_a_url(cls, v: str | None) -> str | None:
        if v is not None:
            otlp_metrics_url(v)
        return v

    @model_validator(mode="after")
    def _otlp_tls_needs_https(self) -> AgentSettings:
        files = {"otlp_metrics_certificate": self.otlp_metrics_certificate,
                 "otlp_metrics_client_certificate": self.otlp_metrics_client_certificate,
                 "otlp_metrics_client_key": self.otlp_metrics_client_key}
        given = [k for k, v in files.items() if v]
        if not given:
            return self
        if not (self.otlp_metrics_endpoint or "").startswith("https://"):
            raise ValueError(f"agent.{given[0]} is for TLS: give agent.otlp_metrics_endpoint as an https:// URL")
        if bool(self.otlp_metrics_client_certificate) != bool(self.otlp_metrics_client_key):
            raise ValueError("agent.otlp_metrics_client_certificate and agent.otlp_metrics_client_key go together")
        return self

    @field_validator("metrics_label_budget")
    @classmethod
    def _budget_holds_the_agents_labels(cls, v: int, info: ValidationInfo) -> int:
        scrape = info.data.get("metrics_scrape_labels", 0)
        if v - scrape < MIN_LABEL_BUDGET:
            raise ValueError(f"{v} less the {scrape} labels the scrape adds (metrics_scrape_labels) is fewer than the "
                             f"{MIN_LABEL_BUDGET} labels the agent itself may put on one DCGM series "
                             f"({', '.join(agent_labels(LEGACY))}); give at least {MIN_LABEL_BUDGET + scrape}")
        return v

    @property
    def metrics_labels_on_page(self) -> int:
        """The most labels one series on /metrics carries."""
        return self.metrics_label_budget - self.metrics_scrape_labels

    @field_validator("metrics_pod_labels", mode="before")
    @classmethod
    def _pod_labels_from_env(cls, v: object) -> object:
        """An env variable gives the list comma-separated."""
        return [k.strip() for k in v.split(",") if k.strip()] if isinstance(v, str) else v

    @field_validator("metrics_pod_labels")
    @classmethod
    def _pod_labels_are_label_keys(cls, v: list[str]) -> list[str]:
        names = [pod_label_name(k) for k in v]
        if len(set(names)) != len(names):
            raise ValueError(f"{v} names one metric label twice once '.', '/' and '-' become '_'")
        return v
