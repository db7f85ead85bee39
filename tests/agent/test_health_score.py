"""The GPU health score: how faults lower it, how it recovers, and a band that does not flap."""

from __future__ import annotations

import pytest

from gpuaware.agent.health_score import HealthScorer
from gpuaware.agent.readings import Reading
from gpuaware.contract.events import HealthBand
from tests.support import reading


def test_health_drops_on_a_double_bit_error_and_recovers_as_it_ages():
    h = HealthScorer(slowdown_temp_c=87)
    h.learn_one(reading(0))
    assert h.update_band() is None and h.score == 100
    h.learn_one(Reading(ts=1, ecc_dbe_volatile=1, temp_c=60))
    assert h.score <= 40
    assert h.update_band() == (HealthBand.HEALTHY, HealthBand.CRITICAL)
    h.learn_one(Reading(ts=1 + 6 * 3600, ecc_dbe_volatile=1, temp_c=60))
    assert h.score == pytest.approx(70, abs=1)
    assert h.update_band() == (HealthBand.CRITICAL, HealthBand.DEGRADED)
    h.learn_one(Reading(ts=1 + 24 * 3600, ecc_dbe_volatile=1, temp_c=60))
    assert h.score > 95 and h.update_band() == (HealthBand.DEGRADED, HealthBand.HEALTHY)
    assert h.components()["ecc"] == pytest.approx(h.score)


def test_health_band_does_not_flap_at_a_boundary():
    h = HealthScorer()
    h.penalties["thermal"] = 21.0
    h.update_band()
    assert h.band is HealthBand.DEGRADED
    h.penalties["thermal"] = 19.0  # score 81: past 80, but not by the 3-point margin
    assert h.update_band() is None
    h.penalties["thermal"] = 16.0
    assert h.update_band() == (HealthBand.DEGRADED, HealthBand.HEALTHY)
