"""Half-space trees, the agent's streaming anomaly detector."""

from __future__ import annotations

import numpy as np

from agent.anomaly import HalfSpaceTrees


def test_half_space_trees_score_outliers_above_inliers():
    rng = np.random.default_rng(0)
    hst = HalfSpaceTrees(n_features=4, seed=1, window_size=100)
    for x in rng.normal(0.3, 0.03, size=(400, 4)).clip(0, 1):
        hst.learn_one(x)
    inlier = np.mean([hst.score_one(x) for x in rng.normal(0.3, 0.03, size=(50, 4)).clip(0, 1)])
    outlier = hst.score_one(np.array([0.95, 0.05, 0.9, 0.95]))
    assert 0 <= inlier < outlier <= 1
