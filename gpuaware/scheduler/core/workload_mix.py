"""The workload mix: the pod shapes a scheduler has seen, and how often — what it expects to keep arriving.

FGD reads it as a distribution over task types; the model reservation reads it as the share of GPU
demand that only some GPU models may serve. The simulator builds it from a pod trace, the live
scheduler from the pods it watches.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuaware.scheduler.core.plugins.fgd import TaskTypes
from gpuaware.scheduler.core.workload import Workload

# (cpu milli, memory MiB, GPUs, milli per GPU (0 when no GPU), allowed GPU models (sorted; empty = any))
Shape = tuple[int, int, int, int, tuple[str, ...]]


def _gpu_milli(gpus: int, milli: int) -> int:
    """GPU compute a shape asks for: a fraction of one GPU, or whole GPUs."""
    return milli if gpus == 1 else 1000 * gpus


def shape_of(w: Workload) -> Shape:
    models = tuple(sorted(set(w.models))) if w.num_gpu else ()
    return (w.cpu_milli, w.memory_mib, w.num_gpu, w.gpu_milli if w.num_gpu else 0, models)


@dataclass
class WorkloadMix:
    counts: Counter = field(default_factory=Counter)  # Shape -> pods seen

    @classmethod
    def of(cls, workloads: Iterable[Workload]) -> WorkloadMix:
        return cls(Counter(shape_of(w) for w in workloads))

    def add(self, w: Workload) -> None:
        self.counts[shape_of(w)] += 1

    def __len__(self) -> int:
        return sum(self.counts.values())

    def task_types(self, top: int | None = 64) -> TaskTypes:
        """The ``top`` most common (cpu, memory, GPUs, milli) shapes, GPU models ignored."""
        shapes: Counter = Counter()
        for (cpu, mem, gpus, milli, _), n in self.counts.items():
            shapes[(cpu, mem, gpus, milli)] += n
        if not shapes:
            shapes[(1000, 1024, 1, 1000)] = 1
        return TaskTypes.from_counts(dict(shapes), top=top)

    def cpu_per_gpu(self) -> float:
        """Milli-CPU that GPU workloads ask for per whole GPU they ask for."""
        cpu = gpu = 0.0
        for (c, _, gpus, milli, _), n in self.counts.items():
            if gpus:
                cpu += n * c
                gpu += n * _gpu_milli(gpus, milli) / 1000
        return cpu / gpu if gpu else 0.0

    def model_demand(self) -> dict[frozenset[str], float]:
        """Share of all GPU demand (milli-GPU) that only the given set of GPU models may serve."""
        total = 0
        only: dict[frozenset[str], int] = defaultdict(int)
        for (_, _, gpus, milli, models), n in self.counts.items():
            demand = n * _gpu_milli(gpus, milli)
            total += demand
            if models and demand:
                only[frozenset(models)] += demand
        return {s: d / total for s, d in only.items()} if total else {}
