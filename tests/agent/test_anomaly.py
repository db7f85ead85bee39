"""Half-space trees, the agent's streaming anomaly detector."""

from __future__ import annotations

import numpy as np

from gpuaware.agent.anomaly import HalfSpaceTrees


def test_half_space_trees_score_outliers_above_inliers():
    rng = np.random.default_rng(0)
    hst = HalfSpaceTrees(n_features=4, seed=1, window_size=100)
    for x in rng.normal(0.3, 0.03, size=(400, 4)).clip(0, 1):
        hst.learn_one(x)
    inlier = np.mean([hst.score_one(x) for x in rng.normal(0.3, 0.03, size=(50, 4)).clip(0, 1)])
    outlier = hst.score_one(np.array([0.95, 0.05, 0.9, 0.95]))
    assert 0 <= inlier < outlier <= 1


def test_the_trees_and_scores_are_those_of_the_numpy_implementation():
    """Half-Space Trees became pure Python (numpy cost the agent 14 MiB): the same seed gives the same
    trees and the same scores, pinned from the numpy code (commit 17d25a6)."""
    import hashlib
    import random

    r = random.Random(5)
    points = [[min(1, max(0, r.gauss(0.3, 0.05))) for _ in range(4)] for _ in range(400)]
    hst = HalfSpaceTrees(n_features=4, seed=3, window_size=100)
    scores = []
    for i, p in enumerate(points):
        if i >= 100:
            scores.append(hst.score_one(p))
        hst.learn_one(p)
    assert hst.split_dim[2][:10] == [3, 1, 1, 1, 1, 2, 1, 1, 2, 2]
    assert hst.split_val[2][:5] == [0.9461725080549923, 0.37335774849143477, 0.37335774849143477,
                                    -0.25328450301713046, 1.0]
    assert scores[:3] == [0.22784251968503932, 0.34387401574803145, 0.18141732283464562]
    assert hashlib.sha256(repr(scores).encode()).hexdigest() == (
        "4d17b4ebda7d955bf8de5fb7c297dacff7244b26956b4cf485feee9e2d5d17a9")


def test_thermal_runaway_fires_when_reads_come_a_little_more_than_a_second_apart():
    """A live agent's reads jitter around its 1 s floor: the slope is taken from the newest read at least 3 s old,
    not from one exactly 3 s back (none is); a gap in the reads is no slope of now."""
    from gpuaware.agent.anomaly import ThermalRunaway
    from gpuaware.agent.readings import Reading
    from gpuaware.contract.events import HealthVerdict

    def first_finding(step_s: float, n: int = 12):
        det = ThermalRunaway()
        for i in range(n):
            r = Reading(ts=100.0 + i * step_s, temp_c=40.0 + 3.0 * i * step_s, power_w=70.0)
            f = det.score_one(r, 700.0, 87.0)
            det.learn_one(r)
            if f is not None:
                return i, f
        return None

    for step in (1.0, 1.013, 1.28):
        i, f = first_finding(step)
        assert i * step <= 5.0 and f.verdict is HealthVerdict.CRITICAL, step  # +3 °C/s from 40 °C: slowdown ahead
    assert first_finding(7.0) is None  # reads 7 s apart: more than twice the window, no slope
