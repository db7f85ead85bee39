"""Score: keep enough whole GPUs of each model for the demand that only that model can serve.

FGD (like any packing score) fills a scarce GPU model with work that could have run anywhere, and the
workloads that may run only there then find nothing free: on the openb ``gpuspec`` traces FGD has the
T4 and P100 nodes full by 30% load and fails T4- and P100-only pods from then on, with most of the
cluster still empty.

From the workload mix, ``demand[S]`` is the share of GPU demand allowed only on the models in S. If
what keeps arriving looks like the mix, model X must keep at least

    R_X = sum over S containing X of demand[S] * free_X / free_S

of the cluster's free whole GPUs (each set's demand split over its models by what they have free). A
placement that takes whole GPUs of X below that line scores the shortfall, in milli-GPU, against it.
A workload is not reserved against its own class, and filling a GPU already in use takes no whole
GPU, so it is never penalised: while every model has slack (always, on unconstrained traces) the
score is flat and the other scores decide.
"""

from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.framework import Candidates, CycleContext


class ModelReservation:
    name = "model_reservation"

    def __init__(self, demand: dict[frozenset[str], float]):
        self.demand = demand
        self._masks: dict[frozenset[str], np.ndarray] = {}
        self._model_names: tuple[str, ...] | None = None

    def _model_masks(self, model_names: tuple[str, ...]) -> dict[frozenset[str], np.ndarray]:
        if self._model_names != tuple(model_names):
            self._model_names = tuple(model_names)
            self._masks = {s: np.array([m in s for m in model_names]) for s in self.demand}
        return self._masks

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        c, w = ctx.cluster, ctx.workload
        if w.num_gpu == 0 or not self.demand:
            return np.zeros(len(cand))
        whole_free = (c.gpu_exists & (c.gpu_free >= 1000)).sum(axis=1) * 1000.0
        free = np.bincount(c.model_id, weights=whole_free, minlength=len(c.model_names))
        own = frozenset(w.models)
        share = np.zeros(len(free))
        for models, mask in self._model_masks(c.model_names).items():
            free_in_set = free[mask].sum()
            if models != own and free_in_set > 0:
                share += np.where(mask, self.demand[models] * free / free_in_set, 0.0)
        model = c.model_id[cand.node]
        if w.num_gpu == 1:
            taken = np.where(c.gpu_free[cand.node, cand.gpu] >= 1000, 1000.0, 0.0)
        else:
            taken = np.full(len(cand), 1000.0 * w.num_gpu)
        keep = share[model] * (free.sum() - taken)
        shortfall = np.maximum(0.0, keep - (free[model] - taken))
        return -np.where(taken > 0, shortfall, 0.0)
