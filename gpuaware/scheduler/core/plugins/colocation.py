"""Score shared GPUs by their residents' workload fingerprint: keep interfering classes apart, pack
idle holders.

The stream fingerprints every GPU (``gpuaware/stream/fingerprint.py``: idle-holding-gpu, training-compute-bound,
...). How much two classes slow each other when they share a GPU comes from Gavel's co-location
measurements: each Gavel job type belongs to a fingerprint class (``FINGERPRINT_OF``), and a pair of
classes gets the mean measured combined speed of the job-type pairs between them. A GPU whose
residents hold memory but no compute (idle-holding) slows nobody: the best place for new shared work.
An empty GPU, an unknown class, or a GPU without live state scores the mean of the table: neutral.
The newcomer's class is its ``workload_class`` label, else its ``gavel_class`` label's class.
"""

from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.framework import Candidates, CycleContext
from gpuaware.scheduler.core.throughput import ThroughputTable

SIGNAL = "fingerprint"
IDLE_CLASSES = ("idle", "idle-holding-gpu")
COMPUTE, MEMORY = "training-compute-bound", "training-memory-bound"
# Gavel job type (its name before the batch size) -> the fingerprint its telemetry shows: convolutional
# nets and RL are SM-bound; language models, transformers and recommendation are memory-bound.
FINGERPRINT_OF = {"ResNet-18": COMPUTE, "ResNet-50": COMPUTE, "CycleGAN": COMPUTE, "A3C": COMPUTE,
                  "LM": MEMORY, "Transformer": MEMORY, "Recommendation": MEMORY}


def fingerprint_of(gavel_class: str) -> str | None:
    return FINGERPRINT_OF.get(gavel_class.split(" (")[0])


def class_speeds(table: ThroughputTable | None, gpu: str = "v100") -> dict[tuple[str, str], float]:
    """(class a, class b) -> mean combined speed (1 = no slowdown) of a and b sharing a GPU, from Gavel."""
    if table is None:
        return {}
    sums: dict[tuple[str, str], list[float]] = {}
    for (a, b), _ in table.pairs.get(gpu, {}).items():
        fa, fb = fingerprint_of(a), fingerprint_of(b)
        if fa and fb and " x" not in a and " x" not in b:
            both = (table.colocated_speed(a, b, gpu) + table.colocated_speed(b, a, gpu)) / 2
            sums.setdefault((fa, fb), []).append(both)
    return {k: float(np.mean(v)) for k, v in sums.items()}


class FingerprintColocation:
    name = "fingerprint-colocation"
    signal = SIGNAL

    def __init__(self, table: ThroughputTable | None = None):
        self.speeds = class_speeds(table)
        self.neutral = float(np.mean(list(self.speeds.values()))) if self.speeds else 1.0

    def speed(self, mine: str | None, resident: str) -> float:
        if resident in IDLE_CLASSES:
            return 1.0
        if not mine or not resident:
            return self.neutral
        return self.speeds.get((mine, resident), self.neutral)

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        w, c = ctx.workload, ctx.cluster
        out = np.full(len(cand), self.neutral)
        if not w.shares_gpu:
            return out
        mine = w.labels.get("workload_class") or fingerprint_of(w.labels.get("gavel_class", ""))
        n, g = cand.node, cand.gpu
        idx = np.flatnonzero(c.live[n, g] & (c.gpu_free[n, g] < c.gpu_cap[n, g]))
        residents = c.fingerprint[n[idx], g[idx]]
        for resident in set(residents.tolist()) - {""}:  # a few classes: one lookup each, not one per GPU
            out[idx[residents == resident]] = self.speed(mine, resident)
            ctx.signals.add(SIGNAL)
        return out
