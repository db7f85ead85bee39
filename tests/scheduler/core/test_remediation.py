"""The remediation chain's state machine: request after the drain, a validation window of PASS, escalation."""

from __future__ import annotations

import pytest

from gpuaware.contract.events import HealthAction, HealthVerdict
from gpuaware.scheduler.core.remediation import Chain, EvictionMode, Next, Step, eviction_mode

PASS, CRIT = HealthVerdict.PASS, HealthVerdict.CRITICAL
NONE, DRAIN, RESET, REBOOT = HealthAction.NONE, HealthAction.DRAIN, HealthAction.RESET_GPU, HealthAction.REBOOT_NODE


def test_a_reset_is_requested_only_once_drained_and_validated_after_a_full_window_of_pass():
    c = Chain("n0", 3, RESET, ["XID 48"], cordoned_at=0.0, validate_s=60.0)
    assert c.observe(CRIT, RESET, ["XID 48"], 5.0) == Next.NOTHING and c.step == Step.DRAINING
    c.drained(10.0)
    assert c.observe(CRIT, RESET, ["XID 48"], 11.0) == Next.REQUEST and c.step == Step.REQUESTED
    assert c.observe(CRIT, RESET, ["XID 48"], 12.0) == Next.NOTHING  # requested once
    assert c.observe(PASS, NONE, [], 100.0) == Next.NOTHING and c.step == Step.VALIDATING
    assert c.observe(PASS, NONE, [], 140.0) == Next.NOTHING
    # One bad reading in the window: the window starts again (and the hand-off stands again).
    assert c.observe(HealthVerdict.WARNING, RESET, ["XID 48"], 150.0) == Next.NOTHING and c.step == Step.REQUESTED
    assert c.failed_validations == 1
    assert c.observe(PASS, NONE, [], 160.0) == Next.NOTHING
    assert c.observe(PASS, NONE, [], 219.0) == Next.NOTHING
    assert c.observe(PASS, NONE, [], 220.0) == Next.VALIDATED and c.step == Step.IN_SERVICE
    assert c.repair_s() == 220.0
    assert c.observe(CRIT, RESET, [], 230.0) == Next.NOTHING  # returned: a new fault starts a new chain


def test_a_drain_needs_no_hand_off_and_an_info_watch_verdict_does_not_pass():
    c = Chain("n0", 0, DRAIN, ["thermal_peer"], cordoned_at=0.0, validate_s=30.0)
    c.drained(1.0)
    assert c.observe(HealthVerdict.INFO, HealthAction.WATCH, [], 2.0) == Next.NOTHING and c.passing_since is None
    assert c.observe(PASS, HealthAction.WATCH, [], 3.0) == Next.NOTHING and c.step == Step.VALIDATING
    assert c.observe(PASS, NONE, [], 33.0) == Next.VALIDATED and c.requested is None


def test_a_stronger_action_during_the_chain_escalates_the_request():
    c = Chain("n0", 1, DRAIN, ["stuck_busy"], cordoned_at=0.0, validate_s=30.0)
    c.drained(1.0)
    assert c.observe(CRIT, RESET, ["XID 95"], 2.0) == Next.REQUEST and c.requested == RESET
    # A reboot takes the whole node: the drain starts again, wider, before the reboot is asked for.
    assert c.observe(CRIT, REBOOT, ["XID 79"], 3.0) == Next.NOTHING and c.step == Step.DRAINING
    c.drained(3.5)
    assert c.observe(CRIT, REBOOT, ["XID 79"], 4.0) == Next.ESCALATE and c.requested == REBOOT
    assert c.observe(CRIT, RESET, ["XID 95"], 5.0) == Next.NOTHING and c.action == REBOOT  # never weaker
    assert c.reasons == ["XID 95"]


def test_eviction_modes_parse_and_a_bad_one_names_its_field_and_the_allowed_values():
    assert eviction_mode(None, "spec.evictionMode") == EvictionMode.CHECKPOINT_THEN_EVICT
    assert eviction_mode("never", "spec.evictionMode") == EvictionMode.NEVER
    with pytest.raises(ValueError, match=r"^spec.evictionMode: 'drop' is not an eviction mode "
                                         r"\(one of evict, checkpoint-then-evict, never\)$"):
        eviction_mode("drop", "spec.evictionMode")
