"""A node entry's rows (gpuaware/stream/snapshot_rows.py)."""

from __future__ import annotations

import json

from gpuaware.stream import snapshot_rows
from gpuaware.stream.processor import StreamProcessor
from gpuaware.stream.readings import NAMES
from gpuaware.stream.table_entries import SNAPSHOT_VERSION, encode_value
from tests.support import telemetry_batch

T0 = 1_700_000_000_000


def test_the_row_layout_is_the_one_its_snapshot_version_writes() -> None:
    """Rows are read by position: a field, a reading or a fingerprint field added, dropped or moved needs a new
    ``SNAPSHOT_VERSION`` and a reader for the rows written before (gpuaware/stream/processor.py)."""
    assert SNAPSHOT_VERSION == 5
    assert snapshot_rows.FIELDS == (
        "node", "model", "index", "fb_total_mib", "samples", "duplicates", "last_seq", "sample_ts_ms", "arrived_ms",
        "smoothed", "minute", "bucket", "health_score", "health_band", "health_components", "verdict",
        "verdict_reasons", "recommended_action", "recent_events", "fingerprint", "last_published_ms", "last_point_ms")
    assert NAMES == ("util_gpu", "util_mem", "fb_used_mib", "power_w", "temp_c", "sm_clock_mhz")
    assert snapshot_rows.FINGERPRINT == ("alpha", "min_samples", "n", "util_mean", "util_var", "util_mem_mean",
                                         "fb_share", "fb_growth", "power_w", "last_fb", "last_ts_ms", "agreement",
                                         "last_class")


def test_a_row_read_back_is_the_snapshot_dict_of_the_gpu() -> None:
    """Through JSON, a GPU's row gives what ``to_dict(history=False)`` gives, readings not yet seen included."""
    proc = StreamProcessor({})
    for seq in range(1, 40):
        proc.on_telemetry(telemetry_batch("n", seq, T0 + seq * 5_000, util=(7 * seq) % 100, gpus=3), 0,
                          T0 + seq * 5_000)
    fresh = proc.tracker("GPU-x-0", 0)  # met, nothing learned: every reading NaN, a null in its row
    for t in [*proc.trackers.values(), fresh]:
        back = json.loads(encode_value(snapshot_rows.row(t)))
        assert snapshot_rows.snapshot(t.uuid, back) == json.loads(encode_value(t.to_dict(history=False)))
    assert json.loads(encode_value(snapshot_rows.row(fresh)))[snapshot_rows.FIELDS.index("smoothed")] == \
        [None] * len(NAMES)


def test_a_reading_not_seen_reads_back_as_not_seen_through_either_encoder() -> None:
    """orjson writes NaN as null; json's fallback (``encode_value``, for what orjson cannot write) as ``NaN``."""
    proc = StreamProcessor({})
    t = proc.tracker("GPU-x-0", 0)
    for text in (encode_value(snapshot_rows.row(t)), json.dumps(snapshot_rows.row(t)).encode()):
        assert snapshot_rows.snapshot(t.uuid, json.loads(text))["smoothed"] == {}
