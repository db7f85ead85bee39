"""The ``scheduler:`` section of the configuration (env ``GPUAWARE_SCHEDULER__*``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpuaware.scheduler.core.policy_specs import ORDERS, POLICIES

# client-go's leaderelection spreads a follower's tries over retry period x [1, 1.2].
LEASE_JITTER = 1.2


def check_lease_timings(lease_duration_s: float, renew_deadline_s: float, retry_period_s: float,
                        retry_field: str = "retry_period_s") -> None:
    """client-go's rule, lease > renew deadline > retry period x 1.2; the error names the field to change.

    The gap between the lease and the renew deadline is how long a leader that failed to renew has
    stopped before any follower may judge the lease lapsed; the retry period gives it more than one
    try before the deadline."""
    for field, value in (("lease_duration_s", lease_duration_s), ("renew_deadline_s", renew_deadline_s),
                         (retry_field, retry_period_s)):
        if not value > 0:
            raise ValueError(f"{field}: {value} must be positive")
    if not lease_duration_s > renew_deadline_s:
        raise ValueError(f"renew_deadline_s: {renew_deadline_s} must be below lease_duration_s {lease_duration_s}, "
                         "or a follower may take the lease while the leader still acts")
    if not renew_deadline_s > retry_period_s * LEASE_JITTER:
        raise ValueError(f"{retry_field}: {retry_period_s} must be below renew_deadline_s {renew_deadline_s} "
                         f"/ {LEASE_JITTER}, or the leader gets no second try before it must step down")


class SchedulerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field("gpuaware", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                      description="schedulerName of the pods this scheduler places")
    policy: str = Field("gpuaware", description=f"placement policy, one of {', '.join(POLICIES)}")
    queue_order: str = Field("fair", description=f"order within a priority, one of {', '.join(ORDERS)} "
                             "(docs/scheduler.md#queue-order)")
    pass_interval_s: float = Field(0.05, gt=0, le=10, description="batching window between scheduling passes")
    # A pass holds the loop, and so every Binding in flight: a short one keeps binds going.
    pass_budget: int = Field(64, ge=1, le=100_000, description="scheduling cycles per pass")
    # Each bind waits ~50-200 ms on the apiserver: 16 in flight capped a burst at ~160 pods/s (bench cluster).
    bind_workers: int = Field(64, ge=1, le=256, description="binds (and their API calls) in flight at once")
    # kube-scheduler's Events go through a client of their own at its clientConnection qps/burst (50/100 by
    # default): a burst of placements does not double its writes to the apiserver with as many Events. client-go's
    # broadcaster drops Events once 1000 wait; ours wait longer (~1.6 KB each, 8 MB for 5,000: ~100 s at 50/s),
    # so a burst of thousands of placements keeps its Events.
    event_qps: float = Field(50.0, ge=0, le=100_000, description="Events written per second after event_burst "
                                                                 "(0: no limit)")
    event_burst: int = Field(100, ge=1, le=100_000, description="Events written at once before event_qps applies")
    event_queue: int = Field(5000, ge=1, le=1_000_000,
                             description="Scheduled Events waiting for their turn, and as many others (written "
                                         "first); beyond, dropped and counted "
                                         "(gpuaware_scheduler_events_dropped_total)")
    checkpoint_timeout_s: float = Field(120.0, ge=0, le=3600,
                                        description="how long a checkpointable pod may take before it is evicted")
    eviction_timeout_s: float = Field(300.0, gt=0, le=86400,
                                      description="how long an eviction blocked by a PodDisruptionBudget is retried")
    eviction_retry_s: float = Field(5.0, gt=0, le=600)
    breaker_max_fraction: float = Field(0.5, gt=0, le=1,
                                        description="circuit breaker: at most this share of the nodes newly "
                                                    "quarantined for GPU health within breaker_window_s")
    breaker_window_s: float = Field(300.0, gt=0, le=86400)
    remediation_dry_run: bool = Field(False, description="decide and record cordons and moves for GPU health, "
                                                         "but make no API call")
    device_taints: bool = Field(False, description="DRA: also taint a critical GPU's devices with DeviceTaintRules "
                                                   "(resource.k8s.io/v1beta2, gate DRADeviceTaintRules) and lift them "
                                                   "when it recovers; RBAC in deploy/components/dra (docs/dra.md)")
    remediation_validate_s: float = Field(300.0, gt=0, le=86400,
                                          description="a GPU taken out of service for its health returns once it "
                                                      "has read PASS this long after its pods left (and after its "
                                                      "reset or reboot was requested)")
    unqueued: Literal["allow", "best-effort", "reject"] = Field(
        "best-effort", description="pods of namespaces in no GPUQueue: best-effort (at most medium priority, always "
        "preemptible, reclaimed from first), reject, or allow (as if in one unlimited queue)")
    dra: bool = Field(False, description="place pods with resourceClaims: watch ResourceSlices, ResourceClaims and "
                                         "DeviceClasses (resource.k8s.io/v1, Kubernetes 1.34+) and allocate the "
                                         "claims; RBAC in deploy/components/dra (docs/dra-scheduling.md)")
    stale_after_s: float = Field(90.0, gt=0, description="a GPU with no state this long is treated as degraded")
    runtime_stale_after_s: float = Field(86_400.0, ge=0, description="job runtime forecasts (job.runtime.v1) are "
                                         "used while the newest completion learned ended within this long; "
                                         "0: always (docs/forecasting.md#job-runtimes)")
    catch_up_stall_s: float = Field(30.0, gt=0, le=3600,
                                    description="on start, give up reading the state topics after this long "
                                                "without progress (however long a steady catch-up takes)")
    throttle_every_s: float = Field(30.0, gt=0, le=3600, description="how often power caps are reconsidered")
    node_power_budget_w: float | None = Field(None, gt=0,
                                              description="GPU power budget per node; None: only thermal caps")
    queue_status_every_s: float = Field(5.0, gt=0, le=600,
                                        description="how often GPUQueue and PodGroup status is written")
    leader_elect: bool = Field(False, description="hold a Lease so that one replica schedules")
    lease_name: str = "gpuaware-scheduler"
    lease_namespace: str = "gpuaware"
    lease_duration_s: float = Field(15.0, gt=1, le=300,
                                    description="how long followers wait, on their own clocks, for a silent leader")
    renew_deadline_s: float = Field(10.0, gt=0, le=300,
                                    description="the leader steps down (and exits) if it cannot renew for this long")
    renew_every_s: float = Field(5.0, gt=0.1, le=100,
                                 description="retry period: how often the leader renews and followers try to acquire")
    extender_port: int = Field(8888, ge=0, le=65535, description="HTTP port of the extender and /healthz; 0 disables")
    extender_tls_cert_file: str | None = Field(None, description="serve the extender over HTTPS with this PEM "
                                               "certificate (with extender_tls_key_file)")
    extender_tls_key_file: str | None = Field(None, description="the PEM key of extender_tls_cert_file")
    extender_client_ca_file: str | None = Field(None, description="mTLS: verbs need a client certificate this CA "
                                                "signed (kube-scheduler's extenders[].tlsConfig.certFile)")
    extender_token_file: str | None = Field(None, description="callers without a client certificate may send "
                                            "Authorization: Bearer with this file's token")
    # 2 MiB: the shipped nodeCacheCapable: true sends one pod (etcd stores at most 1.5 MiB of it) and node
    # names (~20 bytes each as JSON: ~0.3 MiB for 15,000 nodes). nodeCacheCapable: false sends whole Nodes
    # (~9 KB each: ~4.5 MiB for 500) and needs it raised.
    extender_max_body_mib: float = Field(2.0, gt=0, le=64, description="larger extender requests get 413")
    extender_one_node: bool = Field(True, description="/filter keeps, of the nodes where a gpuaware pod fits, the "
                                    "one the core picks and reserves its GPUs there for the /bind (kube-scheduler "
                                    "then binds it there without scoring or /prioritize); false: every node that "
                                    "fits, scored 0-10 by /prioritize, the GPUs reserved at /bind")
    api_server: str | None = Field(None, description="Kubernetes API URL; default: in-cluster config, then kubeconfig")

    @model_validator(mode="after")
    def _check(self) -> SchedulerSettings:
        if self.policy not in POLICIES:
            raise ValueError(f"policy: {self.policy!r} is not one of {', '.join(POLICIES)}")
        if self.queue_order not in ORDERS:
            raise ValueError(f"queue_order: {self.queue_order!r} is not one of {', '.join(ORDERS)} "
                             "(docs/scheduler.md#queue-order)")
        check_lease_timings(self.lease_duration_s, self.renew_deadline_s, self.renew_every_s, "renew_every_s")
        self._check_extender_access()
        return self

    def _check_extender_access(self) -> None:
        cert, key = self.extender_tls_cert_file, self.extender_tls_key_file
        if bool(cert) != bool(key):
            missing = "extender_tls_key_file" if cert else "extender_tls_cert_file"
            raise ValueError(f"{missing}: needed with {'extender_tls_cert_file' if cert else 'extender_tls_key_file'}")
        for name in ("extender_client_ca_file", "extender_token_file"):
            if getattr(self, name) and not cert:
                raise ValueError(f"{name}: needs extender_tls_cert_file and extender_tls_key_file (without TLS "
                                 "a client certificate cannot be asked for and a token is readable on the wire)")
        for name in ("extender_tls_cert_file", "extender_tls_key_file", "extender_client_ca_file",
                     "extender_token_file"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ValueError(f"{name}: {path} is not a readable file")
        if self.extender_token_file and not Path(self.extender_token_file).read_text().strip():
            raise ValueError(f"extender_token_file: {self.extender_token_file} is empty")
