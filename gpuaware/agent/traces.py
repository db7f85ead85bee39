"""The Alibaba GenTD26 per-pod GPU series (1-minute steps), loaded once into float32 arrays."""

from __future__ import annotations

import csv
import gzip
from array import array
from functools import cache

from gpuaware.plumbing.traces import traces_dir

DUTY_CYCLE = "pod_gpu_duty_cycle_anon.csv.gz"
MEMORY_USED = "pod_gpu_memory_used_bytes_anon.csv.gz"


@cache
def load_series(path: str) -> dict[str, array]:
    """pod id -> float32 values ordered by time (one per minute).

    Parsed into compact per-pod arrays as it is read: a dict and two boxed floats per row
    (csv.DictReader, lists of tuples) took 16 MiB of the agent's resident memory for 0.9 MB of
    series, and CPython keeps most of that heap after it is freed (docs/performance.md). ``array('f')``
    rounds as numpy's float32 does, without numpy's 14 MiB in the agent.
    """
    rows: dict[str, tuple[array, array]] = {}
    with gzip.open(path, "rt", newline="") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        try:
            value_at, ts_at, pod_at = (header.index(c) for c in ("value", "timestamp_anon", "container_ip"))
        except ValueError as exc:
            raise ValueError(f"{path}: header {header!r} lacks value, timestamp_anon or container_ip") from exc
        for r in reader:
            try:
                ts, value = float(r[ts_at]), float(r[value_at])
                pod = r[pod_at]
            except (IndexError, ValueError) as exc:
                raise ValueError(f"{path}: bad row {r!r}: {exc}") from exc
            cols = rows.get(pod)
            if cols is None:
                cols = rows[pod] = (array("d"), array("d"))
            cols[0].append(ts)
            cols[1].append(value)
    out = {}
    for pod, (ts, values) in sorted(rows.items()):
        out[pod] = array("f", [v for _, v in sorted(zip(ts, values, strict=True))])  # by time, then value
    return out


def gentd26() -> tuple[dict[str, array], dict[str, array]]:
    base = traces_dir() / "alibaba-gentd26"
    return load_series(str(base / DUTY_CYCLE)), load_series(str(base / MEMORY_USED))
