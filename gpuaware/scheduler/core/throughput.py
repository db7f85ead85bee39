"""Relative training throughput of workload classes on GPU models, seeded from Gavel and learned online.

Gavel (OSDI'20) measured steps/s of model types on K80, P100 and V100, alone and co-located in
pairs on one GPU. Models Gavel did not measure start from V100's figures scaled by their FP32
throughput relative to V100 (a rough prior, documented as such) and are corrected online from
observed throughput with ``learn_one``.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

GAVEL_MODELS = ("k80", "p100", "v100")
# FP32 TFLOPS (vendor data sheets), used only to place models Gavel did not measure.
FP32_TFLOPS = {"k80": 8.7, "p100": 9.3, "v100": 14.0, "t4": 8.1, "a10": 31.2, "a100": 19.5, "l4": 30.3,
               "h100": 67.0}
# Cluster model names -> the Gavel / spec key.
MODEL_KEYS = {"K80": "k80", "P100": "p100", "V100M16": "v100", "V100M32": "v100", "V100": "v100", "T4": "t4",
              "A10": "a10", "A100": "a100", "L4": "l4", "H100": "h100"}


def _job(key: str) -> str:
    name, scale = ast.literal_eval(key)
    return name if scale == 1 else f"{name} x{scale}"


@dataclass
class ThroughputTable:
    solo: dict[str, dict[str, float]]  # job class -> gpu key -> steps/s
    pairs: dict[str, dict[tuple[str, str], tuple[float, float]]]  # gpu key -> (a, b) -> (a steps/s, b steps/s)
    alpha: float = 0.2
    learned: dict[tuple[str, str], int] = field(default_factory=dict)

    @classmethod
    def from_gavel(cls, raw: Mapping[str, Any]) -> ThroughputTable:
        """From Gavel's ``simulation_throughputs.json``, parsed (the core reads no files)."""
        solo: dict[str, dict[str, float]] = {}
        pairs: dict[str, dict[tuple[str, str], tuple[float, float]]] = {}
        for gpu in GAVEL_MODELS:
            for job, entry in raw.get(gpu, {}).items():
                a = _job(job)
                if entry.get("null") is not None:
                    solo.setdefault(a, {})[gpu] = float(entry["null"])
                for other, both in entry.items():
                    if other != "null" and isinstance(both, list) and len(both) == 2:
                        pairs.setdefault(gpu, {})[(a, _job(other))] = (float(both[0]), float(both[1]))
        return cls(solo, pairs)

    def key(self, model: str) -> str:
        return MODEL_KEYS.get(model, model.lower())

    def throughput(self, job: str, model: str) -> float | None:
        per_gpu = self.solo.get(job)
        if not per_gpu:
            return None
        k = self.key(model)
        if k in per_gpu:
            return per_gpu[k]
        if "v100" in per_gpu and k in FP32_TFLOPS:
            return per_gpu["v100"] * FP32_TFLOPS[k] / FP32_TFLOPS["v100"]
        return None

    def relative(self, job: str, models: list[str]) -> list[float]:
        """Throughput on each model as a share of the best of them (1.0 = fastest); 1.0 when unknown."""
        values = [self.throughput(job, m) for m in models]
        best = max((v for v in values if v), default=None)
        return [1.0 if v is None or not best else v / best for v in values]

    def colocated_speed(self, job: str, other: str, model: str) -> float:
        """``job``'s speed when sharing a GPU with ``other``, as a share of running alone (1.0 if unmeasured)."""
        k = self.key(model) if self.key(model) in GAVEL_MODELS else "v100"
        both = self.pairs.get(k, {}).get((job, other))
        alone = self.solo.get(job, {}).get(k)
        if both is None or not alone:
            return 1.0
        return max(0.0, min(1.0, both[0] / alone))

    def learn_one(self, job: str, model: str, observed: float) -> None:
        """Fold an observed steps/s into the table (EWMA), so measurements replace the prior."""
        k = self.key(model)
        current = self.solo.setdefault(job, {}).get(k)
        self.solo[job][k] = observed if current is None else (1 - self.alpha) * current + self.alpha * observed
        self.learned[(job, k)] = self.learned.get((job, k), 0) + 1
