"""What the stream workers' forecasters cost per row learned one at a time (``ForecastColumns.learn``) and together
(``gpuaware.stream.forecast_many.learn_many``, what a worker does with the minutes a take closes): ``python -m
gpuaware.bench.forecast_rows``.

Two copies of the same ``--rows`` rows (the workers' parameters, ``TrackerSettings``) are brought to ``--age`` values
learned, each row up to ``--spread`` values younger (GPUs met at different times, or silent for a while), then
``--steps`` more values are learned into each copy, one way each, in turns: one step one at a time, the same step
together, ``--rounds`` times over. JSON: ``rows``, ``age``, ``spread``, ``one_us_per_row`` and ``many_us_per_row``
(CPU µs, the median over the rounds), ``ratio`` (one / many), and ``same_rows`` (both copies' rows equal to the last
bit at the end).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from gpuaware.stream.forecast_columns import ForecastColumns
from gpuaware.stream.forecast_many import learn_many
from gpuaware.stream.gpu_state import TrackerSettings


def run(rows: int, age: int, spread: int, steps: int, rounds: int, seed: int = 0) -> dict:
    settings = TrackerSettings()
    one, many = (ForecastColumns(settings.horizons_min, residuals=settings.forecast_errors) for _ in range(2))
    rng = np.random.default_rng(seed)
    slots = [one.new(0.0, 100.0) for _ in range(rows)]
    for _ in range(rows):
        many.new(0.0, 100.0)
    ages = rng.integers(max(age - spread, 0), age + 1, rows)
    # Utilisation-like minutes: a level per row, noise, and runs of one value (idle GPUs).
    level = rng.uniform(0, 100, rows)
    values = np.clip(level + rng.normal(0, 10, (age + steps * rounds, rows)), 0, 100).round(1)
    values[:, rng.random(rows) < 0.2] = 0.0
    for k in range(age):
        live = np.flatnonzero(ages > k).tolist()
        if live:
            learn_many(many, [slots[i] for i in live], [float(values[k, i]) for i in live])
    for (wide_one, narrow_one), (wide_many, narrow_many) in zip(one.chunks, many.chunks, strict=True):
        wide_one[:] = wide_many
        narrow_one[:] = narrow_many
    one_us, many_us = [], []
    for r in range(rounds):
        spent_one = spent_many = 0.0
        for k in range(age + r * steps, age + (r + 1) * steps):
            ys = values[k].tolist()
            started = time.process_time()
            for slot, y in zip(slots, ys, strict=True):
                one.learn(slot, y, forecast=True)
            spent_one += time.process_time() - started
            started = time.process_time()
            learn_many(many, slots, ys)
            spent_many += time.process_time() - started
        one_us.append(spent_one / steps / rows * 1e6)
        many_us.append(spent_many / steps / rows * 1e6)
    same = all(a.tobytes() == b.tobytes() for pair in zip(one.chunks, many.chunks, strict=True)
               for a, b in zip(*pair, strict=True))
    one_median, many_median = statistics.median(one_us), statistics.median(many_us)
    return {"rows": rows, "age": age, "spread": spread, "one_us_per_row": round(one_median, 1),
            "many_us_per_row": round(many_median, 1), "ratio": round(one_median / many_median, 2),
            "same_rows": same}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m gpuaware.bench.forecast_rows", description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=250, help="Rows learned per step (a take's closed minutes x 2).")
    ap.add_argument("--age", type=int, default=300, help="Values each row has learned before measuring.")
    ap.add_argument("--spread", type=int, default=40, help="Rows up to this many values younger.")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    print(json.dumps(run(args.rows, args.age, args.spread, args.steps, args.rounds)))


if __name__ == "__main__":
    main()
