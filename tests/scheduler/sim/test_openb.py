"""Loading the openb trace: the real cluster, and errors that name the file and the problem."""

from __future__ import annotations

import pytest

from gpuaware.scheduler.sim.openb import TraceError, load_nodes, load_pods
from tests.support import OPENB_NODES as NODES


def test_trace_errors_name_the_file_and_the_problem(tmp_path):
    bad = tmp_path / "pods.csv"
    bad.write_text("name,cpu_milli\nx,1\n")
    with pytest.raises(TraceError, match="missing columns"):
        load_pods(bad)
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,lots,1,1,1000\n")
    with pytest.raises(TraceError, match=r"pods\.csv:2"):
        load_pods(bad)
    with pytest.raises(TraceError, match="cannot read"):
        load_nodes(tmp_path / "absent.csv")


def test_the_openb_cluster_loads_with_its_6212_gpus():
    nodes = load_nodes(NODES)
    assert len(nodes) == 1213 and sum(n.gpus for n in nodes) == 6212
