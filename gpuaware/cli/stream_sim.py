"""The stream's real parts for ``gpuaware simulate``: the stream's runtime forecaster (the dynamic experiment,
``--ablation durations``), its usage forecaster and fingerprinter and the agent's physical model
(``--ablation stream``), handed to the simulator as callables (the scheduler layer imports neither
``stream`` nor ``agent``)."""

from __future__ import annotations

from gpuaware.scheduler.sim.stream_model import StreamConfig, StreamModel

# openb GPU models -> the agent's physical models (the agent has no P100, A10 or the undisclosed G1-G3:
# the closest board of the same class).
AGENT_MODEL = {"T4": "T4", "A10": "L4", "P100": "V100", "V100M16": "V100", "V100M32": "V100"}


def physics(model: str, util: float, temp_c: float, dt_s: float) -> tuple[float, float, float]:
    from gpuaware.agent.collectors.sim import MODELS, physical_step

    spec = MODELS[AGENT_MODEL.get(model, "V100")]
    power, temp = physical_step(spec, util, temp_c, dt_s)
    return power, temp, spec.board_power_w


def forecaster(horizon: int, upper: float | None):
    from gpuaware.stream.forecast import ExpertForecaster

    return ExpertForecaster(horizon=horizon, upper_bound=upper)


def fingerprinter():
    from gpuaware.stream.fingerprint import WorkloadFingerprint

    return WorkloadFingerprint()


def make_runtime():
    """The stream's online runtime forecaster, fresh (``--ablation durations`` and the dynamic experiment)."""
    from gpuaware.stream.runtime import RuntimeForecaster

    return RuntimeForecaster()


def make_stream(parts: frozenset[str]) -> StreamModel:
    from gpuaware.agent.traces import gentd26
    from gpuaware.scheduler.sim.jobs import gavel_table

    util, mem = gentd26()
    series = [(util[p], mem[p]) for p in sorted(set(util) & set(mem))]
    return StreamModel(series, forecaster, physics, fingerprinter, gavel_table(), StreamConfig(parts=parts))
