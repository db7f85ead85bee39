"""The keys a job's runtime is learned and looked up under, most specific first.

The stream's runtime forecaster learns each completed job's runtime under every key of its signature, and
predicts from the most specific key with history, shrunk towards the keys above it. The writer (the stream)
and any reader must derive the same keys from a job, so they are part of the contract:

- ``owner:<tenant>/<owner>``: what a pod says it belongs to: its ``gpuaware.io/job`` annotation, else the
  ``app.kubernetes.io/name`` or ``job-name`` label, else its controller's name (a Job's or a ReplicaSet's, the
  generated suffix dropped); absent for a bare pod (and in the openb trace, which names no owner);
- ``tenant:<tenant>|<shape>``: the tenant (namespace or queue) and the request's shape;
- ``shape:<shape>``: GPUs x milli-GPU, the CPU and memory requests in powers of two, QoS, allowed GPU models;
- ``*``: every job.

Each key's statistics (``KeyStats``: count, mean and M2 of log runtime) are what ``job.runtime.v1`` carries,
keyed by signature key, and ``posterior`` is how any reader turns them into a job's runtime distribution, so that
the writer (the stream's forecaster) and a reader (the scheduler's feed) compute the same estimate from the same
records.

A duration a pod declares (``gpuaware.io/duration-s``) is calibrated the same way: ``declared_keys`` (per owner,
then per tenant) hold the statistics of log(actual / declared) over completed jobs that declared one, and
``calibrated`` turns them into a log-normal centred at declared x the learned ratio, with the learned spread.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GLOBAL = "*"
LEVELS = ("owner", "tenant", "shape", "global")
ANN_JOB = "gpuaware.io/job"
PRIOR_MU = math.log(3600.0)  # before any completion: an hour, give or take a factor of e^1.5
PRIOR_SIGMA = 1.5
DECLARED_PRIOR_SIGMA = 0.5  # before the first calibrated completion: a declared duration off by a factor e^0.5
MIN_SIGMA = 0.05
_GENERATED = re.compile(r"-[a-z0-9]{5,10}$")  # a ReplicaSet's pod-template hash, a Job's generated suffix


@dataclass(frozen=True)
class JobFeatures:
    tenant: str
    num_gpu: int
    gpu_milli: int
    cpu_milli: int
    memory_mib: int
    qos: str
    models: tuple[str, ...] = ()
    owner: str | None = None


def _pow2(x: int) -> int:
    """The power of two at or above ``x`` (0 stays 0): requests of the same order share a key."""
    return 0 if x <= 0 else 1 << max(0, math.ceil(math.log2(x)))


def shape(f: JobFeatures) -> str:
    return (f"{f.num_gpu}x{f.gpu_milli if f.num_gpu else 0}|c{_pow2(f.cpu_milli)}|m{_pow2(f.memory_mib)}"
            f"|{f.qos}|{','.join(sorted(f.models)) or 'any'}")


def signature_keys(f: JobFeatures) -> list[str]:
    """The keys of ``f``'s signature, most specific first; the last is always ``*``."""
    s = shape(f)
    keys = [f"owner:{f.tenant}/{f.owner}"] if f.owner else []
    exact = f"{s}|{f.cpu_milli}|{f.memory_mib}"  # the same request to the milli-CPU and MiB: often the same job
    return [*keys, f"tenant:{f.tenant}|{exact}", f"shape:{exact}", f"shape:{s}", GLOBAL]


def level(key: str) -> str:
    """Which of ``LEVELS`` a key is at."""
    return "global" if key == GLOBAL else key.split(":", 1)[0]


def owner_of(pod: Mapping[str, Any]) -> str | None:
    """What a pod says it belongs to, for the ``owner`` key (the module's docstring); None: nothing."""
    meta = pod.get("metadata") or {}
    ann, labels = meta.get("annotations") or {}, meta.get("labels") or {}
    for name in (ann.get(ANN_JOB), labels.get("app.kubernetes.io/name"), labels.get("job-name")):
        if name:
            return str(name)
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("name"):
            name = str(ref["name"])
            return _GENERATED.sub("", name) if ref.get("kind") == "ReplicaSet" else name
    return None


class KeyStats:
    """Count, mean and sum of squared deviations (Welford) of the log runtimes learned at one key."""

    __slots__ = ("m2", "mean", "n")

    def __init__(self, n: int = 0, mean: float = 0.0, m2: float = 0.0) -> None:
        self.n, self.mean, self.m2 = n, mean, m2

    def update(self, x: float) -> None:
        self.n += 1
        delta = x - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (x - self.mean)

    @property
    def var(self) -> float:
        return self.m2 / (self.n - 1) if self.n > 1 else 0.0


@dataclass(frozen=True)
class Posterior:
    mu: float  # mean of log(seconds)
    sigma: float  # standard deviation of log(seconds)
    level: str  # the most specific level with history (LEVELS), or "prior"
    n: int  # completions at that key


def posterior(keys: Sequence[str], stats: Mapping[str, KeyStats], prior_weight: float = 2.0,
              prior: tuple[float, float] = (PRIOR_MU, PRIOR_SIGMA)) -> Posterior:
    """A job's log-runtime distribution from the statistics of its signature ``keys`` (most specific first):
    from ``*`` down, each key's mean and variance shrunk towards the estimate above it by ``prior_weight``
    completions (empirical Bayes: a key with few completions says little). ``prior``: (mu, sigma) before any."""
    mu, var, lvl, n = prior[0], prior[1] ** 2, "prior", 0
    for key in reversed(keys):
        s = stats.get(key)
        if s is None or s.n == 0:
            continue
        own_var = s.var if s.n > 1 else var
        mu = (s.n * s.mean + prior_weight * mu) / (s.n + prior_weight)
        var = (max(s.n - 1, 0) * own_var + prior_weight * var) / (max(s.n - 1, 0) + prior_weight)
        lvl, n = level(key), s.n
    # The spread of the next runtime: the key's variance and the uncertainty of its mean (few completions).
    var *= 1.0 + 1.0 / (n + prior_weight)
    return Posterior(mu, max(math.sqrt(var), MIN_SIGMA), lvl, n)


def declared_keys(tenant: str, owner: str | None) -> list[str]:
    """The keys a declared duration's calibration is learned under, most specific first: the owner's (when the pod
    names one), then the tenant's."""
    return ([f"declared:{tenant}/{owner}"] if owner else []) + [f"declared:{tenant}"]


def calibrated(declared_s: float, keys: Sequence[str], stats: Mapping[str, KeyStats],
               prior_weight: float = 2.0) -> Posterior | None:
    """A declared duration as a log-normal: log(declared) plus the learned log(actual / declared) at ``keys``
    (``declared_keys``), shrunk towards 0 (the declaration taken at its word) with ``DECLARED_PRIOR_SIGMA``;
    None before any completion at those keys (then the declared duration stands as exact)."""
    if not any((s := stats.get(k)) is not None and s.n > 0 for k in keys):
        return None
    p = posterior(keys, stats, prior_weight, prior=(0.0, DECLARED_PRIOR_SIGMA))
    return Posterior(math.log(declared_s) + p.mu, p.sigma, p.level, p.n)
