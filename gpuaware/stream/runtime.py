"""The online runtime forecaster: each job's runtime learned from completions, per signature, River-style.

``learn_one(keys, seconds)`` when a job completes (keys: ``contract.runtime.signature_keys``, most specific
first); ``predict_one(keys)`` for a job about to be placed. Learning is in completion order: a prediction
never sees the job it predicts, nor any job that has not ended yet.

Model: log runtime is normal within a key (``contract.runtime.KeyStats``: count, mean, sum of squared
deviations), and a job's estimate is ``contract.runtime.posterior`` over its keys (each shrunk towards the one
above it), the same function the scheduler's feed applies to the records this publishes. The p90's standard
score ``z90`` is moved after every completion, before it is learned, towards the value at which 90% of
completions end within their p90 (online quantile tracking of the standardised residual, as a conformal
interval's width is kept): over all completions, not per key, and for the p90 at arrival.

A declared duration is calibrated by ``learn_declared``: log(actual / declared) under the ``declared:`` keys
(``contract.runtime.declared_keys``), kept with the other keys (the same LRU, state and topic).

Memory: a key holds three numbers (about 170 to 200 bytes with its dict entry, its ``KeyStats`` and its key
string); at most ``max_keys`` keys are kept, the least recently used dropped first (``*`` never), and the keys
dropped are listed in ``evicted`` until the owner takes them (the stream publishes a tombstone for each).
``state()`` is every key's statistics, what ``job.runtime.v1`` carries (``gpuaware.stream.runtime_topic``);
``restore`` rebuilds exactly the same model.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from gpuaware.contract.runtime import GLOBAL, KeyStats, posterior

Z90 = 1.2815515655446004
Z90_MIN, Z90_MAX = 0.5, 4.0


@dataclass(frozen=True)
class Prediction:
    mu: float  # mean of log(seconds)
    sigma: float  # standard deviation of log(seconds)
    z90: float
    level: str  # the most specific level with history (contract.runtime.LEVELS), or "prior"
    n: int  # completions at that key

    @property
    def p50_s(self) -> float:
        return math.exp(self.mu)

    @property
    def p90_s(self) -> float:
        return math.exp(self.mu + self.z90 * self.sigma)


class RuntimeForecaster:
    def __init__(self, prior_weight: float = 2.0, max_keys: int = 100_000, rate: float = 0.05) -> None:
        if prior_weight <= 0 or max_keys < 1 or not 0 < rate < 1:
            raise ValueError("prior_weight must be > 0, max_keys >= 1 and rate in (0, 1)")
        self.prior_weight, self.max_keys, self.rate = prior_weight, max_keys, rate
        self.keys: OrderedDict[str, KeyStats] = OrderedDict()
        self.z90 = Z90
        self.learned = 0
        self.evicted: list[str] = []  # keys dropped since the owner last took them

    def predict_one(self, keys: Sequence[str]) -> Prediction:
        """The runtime of a job with signature ``keys`` (most specific first). A query: it changes nothing."""
        p = posterior(keys, self.keys, self.prior_weight)
        return Prediction(p.mu, p.sigma, self.z90, p.level, p.n)
    def learn_one(self, keys: Sequence[str], seconds: float, skip: Collection[str] = ()) -> None:
        """A job with signature ``keys`` completed after running ``seconds`` (``skip``: keys that learned it
        already)."""
        if not seconds > 0 or not math.isfinite(seconds):
            raise ValueError(f"a runtime must be a positive number of seconds, not {seconds!r}")
        x = math.log(seconds)
        p = self.predict_one(keys)
        # Quantile tracking: up by 0.9 x rate when the completion ran past its p90, down by 0.1 x rate
        # otherwise; it rests where 10% run past.
        self.z90 += self.rate * ((1.0 if x > p.mu + p.z90 * p.sigma else 0.0) - 0.1)
        self.z90 = min(max(self.z90, Z90_MIN), Z90_MAX)  # never a p90 below the median, nor one of no use
        self._update([k for k in keys if k not in skip], x)
        self.learned += 1

    def learn_declared(self, keys: Sequence[str], actual_s: float, declared_s: float,
                       skip: Collection[str] = ()) -> None:
        """A job that declared ``declared_s`` ran ``actual_s``: log(actual / declared) at its ``declared:`` keys."""
        if not (actual_s > 0 and declared_s > 0 and math.isfinite(actual_s) and math.isfinite(declared_s)):
            raise ValueError(f"runtimes must be positive numbers of seconds, not {actual_s!r}, {declared_s!r}")
        self._update([k for k in keys if k not in skip], math.log(actual_s / declared_s))

    def _update(self, keys: Sequence[str], x: float) -> None:
        for key in keys:
            s = self.keys.get(key)
            if s is None:
                s = self.keys[key] = KeyStats()
            else:
                self.keys.move_to_end(key)
            s.update(x)
        while len(self.keys) > self.max_keys:
            oldest = next(iter(self.keys))
            if oldest == GLOBAL:
                self.keys.move_to_end(oldest)
                continue
            del self.keys[oldest]
            self.evicted.append(oldest)

    def state(self) -> dict[str, tuple[int, float, float]]:
        """Every key's (count, mean, M2), least recently used first, and ``z90`` under ``#z90``."""
        out = {key: (s.n, s.mean, s.m2) for key, s in self.keys.items()}
        out["#z90"] = (self.learned, self.z90, 0.0)
        return out

    def restore(self, records: Iterable[tuple[str, tuple[int, float, float]]]) -> None:
        """Rebuild from ``state()``'s records, in order: what was learned before is replaced, and at most
        ``max_keys`` keys are kept (the most recently used)."""
        self.keys.clear()
        self.evicted.clear()
        self.z90, self.learned = Z90, 0
        for key, (n, mean, m2) in records:
            if key == "#z90":
                self.learned, self.z90 = int(n), float(mean)
            else:
                self.keys[key] = KeyStats(int(n), float(mean), float(m2))
                self.keys.move_to_end(key)
        while len(self.keys) > self.max_keys:
            del self.keys[next(k for k in self.keys if k != GLOBAL)]
