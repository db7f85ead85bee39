"""A GPU's snapshot in a node entry as a row: its fields' values in a fixed order (``FIELDS``), where a dict wrote
every field's name again for every GPU of every entry.

A worker writes a node's entry for nearly every record it takes, with all of the node's GPUs in it. As dicts
(``GpuTracker.to_dict``) the entries were a fifth of a worker's logic and ~7.4 KB a node; as rows they are ~3.1 KB,
made in about half the CPU (``python -m gpuaware.bench.worker_cost``: ``samples_per_cpu_s``, ``table_bytes_per_s``;
docs/stream.md, "State"). ``row`` is what is written; ``snapshot`` gives the dict ``GpuTracker.from_dict`` reads
back, the same as ``to_dict(history=False)`` gave.

The layout belongs to the node entry's version (``gpuaware.stream.table_entries.SNAPSHOT_VERSION``):
tests/stream/test_snapshot_rows.py holds ``FIELDS``, the readings' ``NAMES`` and the fingerprint's fields to the
layout written, so that a change to any of them comes with a new version and a reader for the old one.
"""

from __future__ import annotations

import dataclasses
from operator import attrgetter
from typing import Any

from gpuaware.stream.fingerprint import WorkloadFingerprint
from gpuaware.stream.readings import NAMES, WIDTH

_HEAD = ("node", "model", "index", "fb_total_mib", "samples", "duplicates", "last_seq", "sample_ts_ms", "arrived_ms")
_MIDDLE = ("minute", "bucket", "health_score", "health_band", "health_components", "verdict", "verdict_reasons",
           "recommended_action", "recent_events")
_TAIL = ("last_published_ms", "last_point_ms")
# A row: the head's values, the smoothed readings (in ``NAMES`` order, null for none yet), the middle's, the
# fingerprint's fields (in ``FINGERPRINT`` order), the tail's.
FIELDS = (*_HEAD, "smoothed", *_MIDDLE, "fingerprint", *_TAIL)
FINGERPRINT = tuple(f.name for f in dataclasses.fields(WorkloadFingerprint))

# attrgetter of many names: one C call for a tuple of them.
_head, _middle, _tail, _fingerprint = attrgetter(*_HEAD), attrgetter(*_MIDDLE), attrgetter(*_TAIL), \
    attrgetter(*FINGERPRINT)
_READINGS = len(NAMES)
_SMOOTHED = FIELDS.index("smoothed")
_PRINT = FIELDS.index("fingerprint")


def row(t: Any) -> tuple:
    """GPU tracker ``t``'s snapshot as a row (a tuple; JSON writes it as an array)."""
    at = t.slot * WIDTH
    # The readings' row as it is: a reading not yet seen is NaN there, which JSON writes as null.
    return (*_head(t), t.readings.values[at:at + _READINGS].tolist(), *_middle(t), _fingerprint(t.fingerprint),
            *_tail(t))


def snapshot(uuid: str, values: list) -> dict[str, Any]:
    """The snapshot dict (``GpuTracker.to_dict(history=False)``'s) of GPU ``uuid`` from its row as read back;
    ValueError when it is not a row of this layout."""
    if not isinstance(values, list) or len(values) != len(FIELDS):
        raise ValueError(f"GPU {uuid}: a snapshot row has {len(FIELDS)} values, this one is {values!r:.80}")
    out = dict(zip(FIELDS, values, strict=True))
    out["uuid"] = uuid
    # null for a reading not seen yet (NaN where the value went through json's fallback: ``encode_value``)
    out["smoothed"] = {name: v for name, v in zip(NAMES, values[_SMOOTHED], strict=True) if v is not None and v == v}
    out["fingerprint"] = dict(zip(FINGERPRINT, values[_PRINT], strict=True))
    return out
