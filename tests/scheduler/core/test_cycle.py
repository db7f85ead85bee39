"""Gang placement in a scheduling pass: all members or none (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaware.scheduler.core.cluster import Allocation, ClusterState, NodeSpec
from gpuaware.scheduler.core.framework import Scheduler
from gpuaware.scheduler.core.policies import profile
from gpuaware.scheduler.core.workload import Workload
from gpuaware.scheduler.core.workload_mix import WorkloadMix


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.lists(st.integers(1, 8), min_size=1, max_size=6),
       st.integers(0, 3))
def test_a_gang_is_placed_whole_or_leaves_the_cluster_exactly_as_it_was(node_gpus, member_gpus, busy):
    from gpuaware.scheduler.core.cycle import place_gang

    cluster = ClusterState([NodeSpec(f"n{i}", 64_000, 512_000, g, "H100", 81920) for i, g in enumerate(node_gpus)])
    if busy and cluster.gpu_count[0] >= busy:
        cluster.allocate(Allocation("already", 0, list(range(busy)), [1000] * busy, 0, 0))
    before = (cluster.gpu_free.copy(), cluster.cpu_free.copy(), dict(cluster.allocations))
    members = [Workload(f"m{i}", 1000, 1024, g, gang="g") for i, g in enumerate(member_gpus)]
    scheduler = Scheduler(profile("gpuaware", WorkloadMix.of([Workload("w", 1000, 1024, 1, 1000)])))
    placed, reasons = place_gang(scheduler, cluster, members)
    cluster.check_invariants()
    if placed:
        assert not reasons and {d.workload.id for d in placed} == {m.id for m in members}
        assert all(m.id in cluster.allocations for m in members)
    else:
        assert reasons and "none of its" in reasons[0]
        assert (cluster.gpu_free == before[0]).all() and (cluster.cpu_free == before[1]).all()
        assert cluster.allocations == before[2]
    free_total = sum(max(0, g) for g in node_gpus) - (busy if busy and node_gpus[0] >= busy else 0)
    if sum(member_gpus) > free_total:
        assert not placed  # more GPUs asked than exist free: never a partial gang


class Refusing:
    """Hooks whose placements do not go after all (the live scheduler could not pick a claim's devices)."""

    def __init__(self, cluster: ClusterState):
        self.cluster, self.tried = cluster, []

    def evict(self, victim, preemptor, now):
        raise AssertionError("no eviction expected")

    def start(self, w, d, now):
        self.tried.append(w.id)
        self.cluster.release(w.id)
        return False

    def blocked(self, w, d, now):
        pass


def test_a_placement_that_did_not_go_is_not_charged_to_its_tenants_quota():
    from gpuaware.scheduler.core.cycle import PassStats, QueuePolicy, QueueState, schedule_pass
    from gpuaware.scheduler.core.queue import Tenant, TenantLedger

    c = ClusterState([NodeSpec("n0", 64000, 512 * 1024, 8, "H100", 80 * 1024)])
    ledger = TenantLedger({"t": Tenant("t", 1.0, 8000)}, c.total_gpu_milli, int(c.mem_cap.sum()))
    jobs = [Workload(f"j{i}", num_gpu=2, tenant="t") for i in range(3)]
    hooks = Refusing(c)
    schedule_pass(Scheduler(profile("gpuaware", WorkloadMix.of(jobs))), c,
                  QueueState(list(jobs), {}, {}, ledger, enforce_quota=True), QueuePolicy(), hooks, PassStats(), 0.0)
    assert hooks.tried == ["j0", "j1", "j2"]
    assert ledger.gpu_used.get("t", 0) == 0 and not c.allocations


def test_a_decision_in_an_order_by_learned_runtimes_names_the_duration_signal():
    import math

    from gpuaware.scheduler.core.cycle import PassStats, QueuePolicy, QueueState, schedule_pass
    from gpuaware.scheduler.core.runtime import SIGNAL, RuntimeEstimate

    for order, named in (("predicted", True), ("las", False)):
        c = ClusterState([NodeSpec("n0", 64000, 512 * 1024, 8, "H100", 80 * 1024)])
        job = Workload("j", num_gpu=1, runtime=RuntimeEstimate(math.log(600.0), 1.0))
        hooks = Starting(c)
        schedule_pass(Scheduler(profile("gpuaware", WorkloadMix.of([job]))), c, QueueState([job], {}, {}, None),
                      QueuePolicy(order=order), hooks, PassStats(), 0.0)
        assert (SIGNAL in hooks.started[0].signals) is named, order


class Starting(Refusing):
    """Hooks whose placements go: the decisions they were handed."""

    def __init__(self, cluster: ClusterState):
        super().__init__(cluster)
        self.started = []

    def start(self, w, d, now):
        self.started.append(d)
        return True
