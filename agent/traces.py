"""The Alibaba GenTD26 per-pod GPU series (1-minute steps), loaded once into numpy arrays."""

from __future__ import annotations

import csv
import gzip
from functools import cache

import numpy as np

from plumbing.traces import traces_dir

DUTY_CYCLE = "pod_gpu_duty_cycle_anon.csv.gz"
MEMORY_USED = "pod_gpu_memory_used_bytes_anon.csv.gz"


@cache
def load_series(path: str) -> dict[str, np.ndarray]:
    """pod id -> float32 values ordered by time (one per minute)."""
    rows: dict[str, list[tuple[float, float]]] = {}
    with gzip.open(path, "rt", newline="") as f:
        for r in csv.DictReader(f):
            try:
                rows.setdefault(r["container_ip"], []).append((float(r["timestamp_anon"]), float(r["value"])))
            except (KeyError, ValueError) as exc:
                raise ValueError(f"{path}: bad row {r!r}: {exc}") from exc
    return {pod: np.array([v for _, v in sorted(pts)], dtype=np.float32) for pod, pts in sorted(rows.items())}


def gentd26() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    base = traces_dir() / "alibaba-gentd26"
    return load_series(str(base / DUTY_CYCLE)), load_series(str(base / MEMORY_USED))
