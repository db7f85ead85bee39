"""Power and thermal throttling decisions."""

from __future__ import annotations

import numpy as np
import pytest


def test_throttling_caps_low_priority_power_first_and_hot_gpus_always():
    from gpuaware.scheduler.core.throttle import throttle_decisions

    power = np.array([[300.0, 250.0, 100.0]])
    temp = np.array([[60.0, 60.0, 90.0]])
    exists = np.ones((1, 3), dtype=bool)
    prio = np.array([[2, 0, 0]])
    actions = throttle_decisions(power, temp, exists, np.array([550.0]), prio)
    assert [(a.gpu, a.reason.split(":")[0]) for a in actions] == [(2, "thermal"), (1, "power")]
    assert actions[1].cap_w == pytest.approx(175.0)
    assert throttle_decisions(power, temp * 0 + 50, exists, np.array([1000.0]), prio) == []
