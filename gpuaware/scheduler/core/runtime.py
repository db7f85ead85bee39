"""What the core knows of a job's runtime: a log-normal estimate, conditioned on the time it has already run.

The estimate comes from outside the core: the stream's online runtime forecaster (``stream/runtime.py``; live,
through ``job.runtime.v1`` and ``scheduler/runtimes.py``), a duration the pod declares (``gpuaware.io/duration-s``:
exact, or ``calibrated`` once its owner's completions say how far off declarations run), or, in the simulator's
``oracle`` ceiling only, the job's true duration (``sigma`` 0). The core never sees a job's true duration otherwise.

    total runtime D ~ exp(N(mu, sigma^2));   quantile q of D given D > a (a: time already run)

``z90`` is the p90's standard score, kept calibrated by whoever learns the estimate (the forecaster moves it so
that 90% of completions end before their p90); 1.2816 is the normal's own.

Used for queue order (``predicted``: remaining GPU service), backfill and reservations (the p90 of the end) and
patient preemption (when running work frees room). ``PredictedEnds`` is the ``finish_at`` a pass reads: each
running job's expected end, computed when asked (a pass asks for few).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

SIGNAL = "duration"  # decisions made in an order by predicted runtimes name it
Z90 = 1.2815515655446004
Z999 = 3.090232306167813  # past the estimate's own p99.9 the estimate has failed: the end is unknown
_N = NormalDist()


@dataclass(frozen=True)
class RuntimeEstimate:
    mu: float  # mean of log(seconds)
    sigma: float  # standard deviation of log(seconds); 0: known exactly
    z90: float = Z90
    source: str = "forecast"  # forecast, declared or oracle
    level: str = ""  # a forecast's signature level (contract.runtime.LEVELS), for its quality by level

    @classmethod
    def exact(cls, seconds: float, source: str = "oracle") -> RuntimeEstimate:
        return cls(math.log(max(seconds, 1e-3)), 0.0, Z90, source)

    def overran(self, elapsed: float) -> bool:
        """It has run past anything the estimate expected (its p99.9, or an exact runtime): when it will end is
        unknown. Conditioning on such an ``elapsed`` would say it ends any moment, forever."""
        if elapsed <= 0.0:
            return False
        if self.sigma <= 0.0:
            return elapsed > math.exp(self.mu) * (1 + 1e-9) + 1e-6
        return elapsed > math.exp(self.mu + Z999 * self.sigma)

    def quantile(self, q: float, elapsed: float = 0.0) -> float:
        """The ``q`` quantile of the total runtime, given it has run ``elapsed`` seconds without ending;
        infinite once it has ``overran``."""
        if self.overran(elapsed):
            return math.inf
        if self.sigma <= 0.0:
            return max(math.exp(self.mu), elapsed)
        below = _N.cdf((math.log(elapsed) - self.mu) / self.sigma) if elapsed > 0 else 0.0
        p = min(below + (1.0 - below) * q, 1.0 - 1e-12)
        return max(math.exp(self.mu + self.sigma * _N.inv_cdf(p)), elapsed)

    def p50(self, elapsed: float = 0.0) -> float:
        return self.quantile(0.5, elapsed)

    def p90(self, elapsed: float = 0.0) -> float:
        return self.quantile(_N.cdf(self.z90), elapsed)

    def remaining(self, elapsed: float = 0.0, q: float = 0.5) -> float:
        return self.quantile(q, elapsed) - elapsed

    def mean_remaining(self, elapsed: float = 0.0) -> float:
        """The expected time left, given it has run ``elapsed`` seconds: E[D | D > a] - a. Ordering by this,
        not by a quantile, is what minimises mean wait when estimates differ in spread (the c-mu rule).
        Infinite once it has ``overran``."""
        if self.overran(elapsed):
            return math.inf
        if self.sigma <= 0.0:
            return max(math.exp(self.mu) - elapsed, 0.0)
        s = self.sigma
        mean = math.exp(self.mu + s * s / 2)
        if elapsed <= 0:
            return mean
        z = (math.log(elapsed) - self.mu) / s
        tail = 1.0 - _N.cdf(z)
        return max(mean * (1.0 - _N.cdf(z - s)) / tail - elapsed, 0.0)


def expected_duration(runtime: RuntimeEstimate | None, declared_s: float | None) -> float:
    """How long a job that has not started will run, for backfill: the estimate's p90, else what the user
    declared, else unknown (infinite: it cannot be shown to end before a reservation)."""
    if runtime is not None:
        return runtime.p90()
    return declared_s if declared_s else math.inf


class PredictedEnds(Mapping[str, float]):
    """``finish_at`` for a pass: each running job's expected end (now + the p90 of what remains given the
    seconds it has run), or infinity without an estimate. ``running``: id -> anything with ``workload.runtime``
    and ``elapsed(now)`` (``preemption.Running``)."""

    def __init__(self, running: Mapping[str, Any], now: float) -> None:
        self._running, self._now = running, now
        self._known: dict[str, float] = {}  # a pass asks for the same job's end many times

    def __getitem__(self, key: str) -> float:
        end = self._known.get(key)
        if end is None:
            r = self._running[key]
            runtime = r.workload.runtime
            if runtime is None:
                end = math.inf
            else:
                elapsed = r.elapsed(self._now)
                end = self._now + runtime.p90(elapsed) - elapsed
            self._known[key] = end
        return end

    def __iter__(self) -> Iterator[str]:
        return iter(self._running)

    def __len__(self) -> int:
        return len(self._running)
