"""The agent's core loop: the batches it builds decode and carry every sample taken exactly once."""

from __future__ import annotations

from gpuaware.agent.core import AgentCore, BatchBuilder
from gpuaware.agent.sampling import SamplingPolicy
from gpuaware.contract import events
from tests.support import sim_cluster


def test_batches_are_decodable_and_carry_every_sample_once():
    cluster, clock = sim_cluster(nodes=1, gpus_per_node=4)
    core = AgentCore(cluster.node(0), SamplingPolicy(), clock=lambda: clock[0])
    builder = BatchBuilder(core.node, core.devices)
    taken, published = [], []
    for s in range(120):
        clock[0] = float(s)
        out = core.tick(float(s))
        taken += [(core.devices[i].uuid, seq) for i, seq, _ in out.samples]
        builder.add(out.samples)
        if s % 5 == 4 and (batch := builder.build()) is not None:
            decoded = events.decode(events.encode(batch))
            assert decoded == batch and decoded.batch_seq == len(published) + 1
            published.append(decoded)
    keys = [(b.gpus[x.gpu].uuid, x.seq) for b in published for x in b.samples]
    assert sorted(keys) == sorted(taken) and len(set(keys)) == len(keys) == core.samples_taken
