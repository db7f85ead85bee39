"""A workload's GPU request."""

from __future__ import annotations

import pytest

from gpuaware.scheduler.core.workload import Workload


def test_a_plain_gpu_request_is_whole_gpus():
    w = Workload("plain", 1000, 1024, num_gpu=2)
    assert w.gpu_milli == 1000 and not w.shares_gpu and w.gpu_milli_total == 2000
    with pytest.raises(ValueError, match="fractions are for one GPU only"):
        Workload("bad", num_gpu=2, gpu_milli=500)
