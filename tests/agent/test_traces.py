"""The GenTD26 series loader (parsed into compact arrays; same series as before)."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from gpuaware.agent.traces import load_series


def test_series_are_per_pod_ordered_by_time_then_value(tmp_path):
    path = tmp_path / "s.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("value,timestamp_anon,container_ip\n3.0,120.0,b\n1.0,60.0,a\n5.0,60.0,b\n2.0,0.0,a\n4.0,60.0,b\n")
    series = load_series(str(path))
    assert list(series) == ["a", "b"]
    assert series["a"].typecode == "f"  # float32, as numpy's astype(float32) rounds
    assert series["a"].tolist() == [2.0, 1.0]
    assert series["b"].tolist() == [4.0, 5.0, 3.0]  # two rows at 60 s: by value, as sorting the pairs did


def test_a_bad_row_names_the_file(tmp_path):
    path = tmp_path / "bad.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("value,timestamp_anon,container_ip\nnope,1.0,a\n")
    with pytest.raises(ValueError, match=r"bad\.csv\.gz: bad row"):
        load_series(str(path))


def test_values_round_to_float32_as_numpy_does(tmp_path):
    path = tmp_path / "r.csv.gz"
    values = [0.1, 1 / 3, 123456.789, 2.5e-7]
    with gzip.open(path, "wt") as f:
        f.write("value,timestamp_anon,container_ip\n")
        f.writelines(f"{v!r},{i}.0,a\n" for i, v in enumerate(values))
    assert load_series(str(path))["a"].tolist() == np.array(values).astype(np.float32).tolist()
