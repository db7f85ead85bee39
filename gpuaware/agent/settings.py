from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


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
                                   "DCGM_FI_DRIVER_VERSION), as 4.9 (ratios, bytes, Hz, J; hostname, driver_version) "
                                   "or as 4.10 (4.9 with DCGM_FI_PROF_PCIE_{TX,RX}_BYTES_PER_SECOND)")
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
    pod_uids: bool = Field(False, description="follow the UIDs of this node's pods (an informer on spec.nodeName) "
                                              "so shared GPUs get per-pod series; needs list/watch of pods, "
                                              "granted by deploy/components/agent-pod-uids (off: least privilege)")
