"""The ``stream:`` section of the configuration (env ``GPUAWARE_STREAM__*``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class StreamSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    app_id: str = Field("gpuaware-stream", pattern=r"^[A-Za-z0-9._-]+$",
                        description="Faust app id: the consumer group and the prefix of internal topics")
    horizons_min: list[int] = Field(default_factory=lambda: [1, 5, 15], min_length=1,
                                    description="forecast horizons in minutes")
    min_publish_interval_ms: int = Field(1000, ge=0, description="a GPU's state is published at most this often")
    max_publish_interval_ms: int = Field(30_000, ge=1000, description="... and at least this often")
    publish_every_sample: bool = Field(
        True, description="a state for every new full sample (at most every min_publish_interval_ms); false: only "
                          "on a change past the steps (utilisation 5 points, framebuffer 5%, class, minute, health) "
                          "and at the max_publish_interval_ms refresh: ~30% fewer states, a sample that moves "
                          "nothing reaches the scheduler up to that refresh late")
    max_clock_skew_s: float = Field(30.0, ge=0, description="a sample stamped further ahead of the worker's clock "
                                                          "is rejected")
    gpu_rehome_after_s: float = Field(600.0, ge=0, description="a GPU UUID reported by another node is dead-lettered "
                                                              "until its node has been silent this long")
    node_identity: Literal["off", "required"] = Field(
        "required", description="required: telemetry and events must carry their node's ServiceAccount token, "
                                "checked with the apiserver (TokenReview); others are dead-lettered. off: any "
                                "client that can write the telemetry topics may speak for any node (docs/security.md); "
                                "only for a stack without an apiserver to ask (`gpuaware up` says so explicitly)")
    node_identity_users: list[str] = Field(
        default_factory=lambda: ["system:serviceaccount:gpuaware:gpuaware-agent"],
        description="ServiceAccounts whose node tokens prove a node")
    api_server: str | None = Field(None, description="Kubernetes API URL for TokenReviews; default: in-cluster config")
    node_state_interval_s: float = Field(5.0, gt=0, description="how often node rollups are considered")
    cluster_forecast_interval_s: float = Field(10.0, gt=0, description="how often per-model demand is published")
    runtime_max_keys: int = Field(100_000, ge=16, description="job runtime signature keys kept (about 200 bytes "
                                  "each), the least recently used dropped first (docs/forecasting.md#job-runtimes)")
    replication_factor: int | None = Field(
        None, ge=1, le=5, description="of the internal topics (changelog, re-keyed events): unset, the cluster's "
        "default.replication.factor, or its broker count (at most 3) where that is not readable")
    store: Literal["rocksdb", "memory"] = Field(
        "rocksdb", description="where the per-GPU table lives: rocksdb keeps it on disk under data_dir, so a restart "
                               "or a partition coming back replays only the changelog's tail; memory replays all of "
                               "it every time")
    standby_replicas: int = Field(1, ge=0, le=3, description="Faust standby table replicas per partition: another "
                                                            "worker keeps a warm copy, so a failover replays a tail "
                                                            "(each standby reads the changelog once more)")
    take_max_records: int = Field(500, ge=1, description="records a worker handles together (one table write per "
                                                        "node and at most one state per GPU for all of them); 1 "
                                                        "handles each record on its own")
    take_within_s: float = Field(0.05, gt=0, le=5, description="how long a worker waits to fill a take before "
                                                               "handling what it has (adds to sample-to-state latency)")
    node_entry_version: Literal[4, 5] = Field(
        5, description="the layout node entries are written in: 5, each GPU's snapshot as a row (less than half the "
                       "bytes and CPU); 4, as a dict, which workers of earlier releases read. Set 4 while a rolling "
                       "upgrade runs beside workers that write 4 (a worker before 5 finds no GPUs in a version 5 "
                       "entry and starts them afresh, history included), then 5 (docs/deploy.md, \"Upgrade\")")
    data_dir: str = Field("/tmp/gpuaware-stream", description="Faust's working directory (the rocksdb store's "
                                                              "files); one per worker")

    @field_validator("horizons_min")
    @classmethod
    def _horizons(cls, v: list[int]) -> list[int]:
        if any(h < 1 or h > 24 * 60 for h in v) or len(set(v)) != len(v):
            raise ValueError("horizons must be distinct whole minutes between 1 and 1440")
        return sorted(v)
