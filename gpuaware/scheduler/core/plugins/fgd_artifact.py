"""FGD exactly as the ATC'23 artifact runs it (``hkust-adsl/kubernetes-scheduler-simulator``).

Our ``fgd`` (``fgd.py``) is the paper's idea on our own terms; this is the artifact's code, point by
point, so that the published figures can be reproduced and compared against:

- Task types (``typical_pods``) follow ``pkg/utils/frag.go: GetTypicalPods`` with the experiment
  configuration (``scripts/generate_config_and_run.py``: ``isInvolvedCpuPods: true``,
  ``podPopularityThreshold: 95``, ``podIncreaseStep: 1``, ``gpuResWeight: 0``): pods keyed by
  ``pkg/type/resource.go: PodResource`` (CPU, GPU milli, GPU count, GPU model string; no memory),
  CPU of 0 read as kube's non-zero default of 100 (``pkg/utils/utils.go: GetPodResource``), sorted by
  count (ties: the larger key first, ``TargetPodList.Less`` reversed), the most frequent kept until
  they cover 95 % of pods, their frequencies renormalised.
- A node's fragmentation (``node_fragmentation``) follows ``frag.go: NodeGpuShareFragAmountScore``
  (``NodeGpuShareFragAmount`` summed except Q3, with ``GetNodePodFrag``): for each type, the node's
  free GPU milli counts as fragment unless the type is GPU-using (``MilliGpu > 0``), the node's model
  is allowed (``utils.go: IsNodeAccessibleToPod``), enough GPUs have its milli free
  (``CanNodeHostPodOnGpuMemory``) and its CPU fits; then only the free milli on GPUs with less than
  its milli free counts. So CPU-only types count all free GPU (XL and XR alike), and a type the
  node's model cannot serve counts all of it (NoAccess). Memory is not looked at.
- The score (``score``) follows ``pkg/simulator/plugin/fgd_score.go:
  calculateGpuShareFragExtendScore``: ``int64(sigmoid((before - after) / 1000) * 100)``, an integer
  0-100, so near-equal nodes tie; a fractional pod is scored on each GPU it fits (the node takes its
  best GPU, the first index on ties: ``fragScore > score``), a whole-GPU or CPU-only pod on the node
  minus the pod (``NodeResource.Sub``: CPU and fully free GPUs).
- Ties between nodes go to the smallest node name, and the simulator prefixes every node name with
  its index in a seeded random permutation (``pkg/simulator/simulator.go: syncClusterResourceList``;
  vendor ``generic_scheduler.go: selectHost``): a fixed random node order, which the profile asks of
  the framework (``Profile.tie_order = "node-order"``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from gpuaware.scheduler.core.framework import Candidates, CycleContext
from gpuaware.scheduler.core.plugins.fgd import GpuFigures, NodeFigures

POPULARITY_PCT = 95  # generate_config_and_run.py: --pod-popularity-threshold
NONZERO_CPU_MILLI = 100  # kube's DefaultMilliCPURequest, what GetNonzeroRequests reads a 0 as
MAX_NODE_SCORE = 100  # framework.MaxNodeScore

# PodResource: (milli CPU, milli GPU per GPU (0 when none), GPU count, GPU model string ("" = any))
Key = tuple[int, int, int, str]


@dataclass
class ArtifactTypes:
    """The artifact's typical pods: keys and renormalised frequencies, most frequent first."""

    cpu: np.ndarray  # (T,)
    milli: np.ndarray
    num_gpu: np.ndarray
    models: list[tuple[str, ...]]  # allowed models per type, () = any
    count: np.ndarray  # pods of each type seen: whole numbers, so sums of count x milli are exact in float64

    def __post_init__(self) -> None:
        self.p = self.count / self.count.sum()
        self.gpu = self.milli > 0
        self.thresholds, self.threshold_of = np.unique(np.where(self.gpu, self.milli, 1), return_inverse=True)

    def access(self, node_models: np.ndarray) -> np.ndarray:
        """(N, T): the node's GPU model is allowed to the type (IsNodeAccessibleToPodByType)."""
        out = np.ones((len(node_models), len(self.models)), dtype=bool)
        for t, allowed in enumerate(self.models):
            if allowed:
                out[:, t] = np.isin(node_models, allowed)
        return out


def pod_key(cpu_milli: int, num_gpu: int, gpu_milli: int, models: tuple[str, ...]) -> Key:
    """``GetPodResource``: non-zero CPU, per-GPU milli (0 without GPUs), count, the model string."""
    return (cpu_milli or NONZERO_CPU_MILLI, gpu_milli if num_gpu else 0, num_gpu, "|".join(models) if num_gpu else "")


def typical_pods(counts: dict[Key, float], popularity_pct: float = POPULARITY_PCT) -> ArtifactTypes:
    """``GetTypicalPods`` (step 1, CPU pods involved, no GPU weight) over pod counts by key."""
    total = float(sum(counts.values()))
    # sort.Reverse(TargetPodList): the highest count first; equal counts: the larger key first.
    items = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    expected, cum, kept = popularity_pct * total / 100.0, 0.0, []
    for key, n in items:
        if cum >= expected:
            break
        cum += n
        kept.append((key, n))
    return ArtifactTypes(np.array([k[0] for k, _ in kept], dtype=np.int64),
                         np.array([k[1] for k, _ in kept], dtype=np.int64),
                         np.array([k[2] for k, _ in kept], dtype=np.int64),
                         [tuple(m for m in k[3].split("|") if m) for k, _ in kept],
                         np.array([n for _, n in kept], dtype=np.float64))


def typical_pods_of(shapes: Iterable[tuple[tuple, float]]) -> ArtifactTypes:
    """From workload-mix shapes ((cpu, mem, gpus, milli, models), count): memory dropped, keys merged."""
    counts: Counter = Counter()
    for (cpu, _, gpus, milli, models), n in shapes:
        counts[pod_key(cpu, gpus, milli, tuple(models))] += n
    if not counts:
        counts[pod_key(1000, 1, 1000, ())] = 1
    return typical_pods(dict(counts))


def artifact_fragmentation(gpus: GpuFigures, cpu: np.ndarray, access: np.ndarray, types: ArtifactTypes) -> np.ndarray:
    """(R,) fragmentation of R node states: NodeGpuShareFragAmountScore (access: (R, T)), weighted by the
    types' pod counts rather than their frequencies, so every sum is of whole numbers and exact: a state's
    figure does not depend on the rows it was computed with, and an unchanged state scores exactly 50, as
    it does in Go (which sums the same terms in the same order for both). Divide by ``count.sum()`` for
    the expected fragmentation."""
    total = gpus.total[:, None]
    d = types.threshold_of
    q3 = (types.gpu[None, :] & access & (gpus.usable[:, d] >= types.num_gpu[None, :])
          & (cpu[:, None] >= types.cpu[None, :]))
    return np.where(q3, gpus.below[:, d], total) @ types.count


def quantize(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """``int64(sigmoid((before - after) / 1000) * MaxNodeScore)``: Go's conversion truncates."""
    return np.trunc(MAX_NODE_SCORE / (1.0 + np.exp(-(before - after) / 1000.0)))


class ArtifactFragmentationGradient:
    name = "fgd-artifact"

    def __init__(self, types: ArtifactTypes):
        self.types = types
        self._access: np.ndarray | None = None  # (N, T) of the cluster the node figures are of
        self._nodes = NodeFigures(types.thresholds, lambda c, figures, rows: artifact_fragmentation(
            figures, c.cpu_free[rows], self._access[rows], types), self._new_cluster)

    def _new_cluster(self, c) -> None:
        self._access = self.types.access(c.models)

    def node_fragmentation(self, c) -> np.ndarray:
        """Every node's fragmentation now, recomputed only where a node changed."""
        return self._nodes.node_fragmentation(c)

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        c, w, t = ctx.cluster, ctx.workload, self.types
        before = self.node_fragmentation(c)
        inverse = None
        if w.num_gpu == 1 and w.gpu_milli < 1000:
            # One after-state per node and free share: GPUs of a node with equal free score alike.
            keys = cand.node * 2048 + c.gpu_free[cand.node, cand.gpu]
            _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
            n, g = cand.node[first], cand.gpu[first]
            gpus = self._nodes.gpus.rows(n).after_taking(c.gpu_free[n, g], w.gpu_milli, t.thresholds)
        else:
            n = cand.node
            gpus = self._nodes.gpus.rows(n)
            if w.num_gpu:
                # NodeResource.Sub takes k fully free GPUs: k GPUs fewer at every threshold (all <= 1000), and
                # a GPU left with 0 adds nothing below any threshold.
                k = w.num_gpu
                gpus = GpuFigures(gpus.total - 1000 * k, gpus.below, gpus.usable - k, gpus.full - k, gpus.partial)
        after = artifact_fragmentation(gpus, c.cpu_free[n] - w.cpu_milli, self._access[n], t)
        total = t.count.sum()
        s = quantize(before[n] / total, after / total)
        return s if inverse is None else s[inverse.ravel()]
