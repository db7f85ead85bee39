"""The central remediation breaker and the lemon-node ledger."""

from __future__ import annotations

from gpuaware.scheduler.core.breaker import WEEK_S, QuarantineBreaker, RemediationLedger


def test_no_more_than_half_the_nodes_are_quarantined_in_five_minutes():
    b = QuarantineBreaker()
    assert [b.allow(f"n{i}", 10.0 + i, 10) for i in range(7)] == [True] * 5 + [False] * 2
    assert b.held == 2
    assert b.allow("n0", 20.0, 10)  # already quarantined in the window: no extra cost
    assert b.allow("n5", 10.0 + 301, 10)  # the window moved on


def test_a_one_node_cluster_can_still_quarantine_its_node():
    assert QuarantineBreaker().allow("only", 0.0, 1)


def test_five_remediations_in_a_week_make_a_lemon_and_older_ones_expire():
    ledger = RemediationLedger()
    gaps = [ledger.record("n1", t * 3600.0) for t in range(5)]
    assert gaps == [None, 3600.0, 3600.0, 3600.0, 3600.0]
    assert ledger.lemon("n1") and ledger.lemons() == ["n1"]
    ledger.record("n1", 4 * 3600.0 + WEEK_S + 1)
    assert not ledger.lemon("n1")
