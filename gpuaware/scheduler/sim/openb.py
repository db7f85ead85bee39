"""Readers for the Alibaba openb GPU cluster trace (ATC'23 FGD paper), and any CSV of the same columns."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from gpuaware.scheduler.core.cluster import NodeSpec
from gpuaware.scheduler.core.workload import Workload

# Published memory sizes; G1-G3 are undisclosed types whose memory is unknown (0: not tracked).
GPU_MEMORY_MIB = {"P100": 16384, "T4": 15360, "V100M16": 16384, "V100M32": 32768, "A10": 23028}

NODE_COLUMNS = {"sn", "cpu_milli", "memory_mib", "gpu", "model"}
# The multigpuNN resamplings carry only these; gpu_spec, qos and the times are optional.
POD_COLUMNS = {"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"}


class TraceError(ValueError):
    pass


def _rows(path: Path, needed: set[str]) -> list[dict[str, str]]:
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = needed - set(reader.fieldnames or [])
            if missing:
                raise TraceError(f"{path}: missing columns {sorted(missing)}")
            return list(reader)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror}") from exc


def load_nodes(path: str | Path, gpu_only: bool = True) -> list[NodeSpec]:
    out = []
    for i, r in enumerate(_rows(Path(path), NODE_COLUMNS), start=2):
        try:
            gpus = int(r["gpu"])
            if gpu_only and gpus == 0:
                continue
            out.append(NodeSpec(r["sn"], int(r["cpu_milli"]), int(r["memory_mib"]), gpus, r["model"] or "none",
                                GPU_MEMORY_MIB.get(r["model"], 0)))
        except ValueError as exc:
            raise TraceError(f"{path}:{i}: {exc}") from exc
    if not out:
        raise TraceError(f"{path}: no nodes")
    return out


@dataclass
class TracePod:
    workload: Workload
    creation_s: float
    deletion_s: float | None
    scheduled_s: float | None


def _time(row: dict[str, str], key: str) -> float | None:
    value = row.get(key)
    return float(value) if value not in ("", None) else None


def load_pods(path: str | Path) -> list[TracePod]:
    out = []
    for i, r in enumerate(_rows(Path(path), POD_COLUMNS), start=2):
        try:
            num_gpu = int(r["num_gpu"])
            milli = int(r["gpu_milli"]) if num_gpu == 1 else 1000
            w = Workload(r["name"], int(r["cpu_milli"]), int(r["memory_mib"]), num_gpu, max(1, min(milli, 1000)),
                         models=tuple(m for m in (r.get("gpu_spec") or "").split("|") if m), qos=r.get("qos") or "BE")

            out.append(TracePod(w, _time(r, "creation_time") or 0.0, _time(r, "deletion_time"),
                                _time(r, "scheduled_time")))
        except ValueError as exc:
            raise TraceError(f"{path}:{i}: {exc}") from exc
    if not out:
        raise TraceError(f"{path}: no pods")
    return out

