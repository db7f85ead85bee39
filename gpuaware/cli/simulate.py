"""``gpuaware simulate``: the scheduling experiments on the openb traces, with a progress bar."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click

from gpuaware.cli.common import OPENB


@click.command()
@click.option("--experiment", type=click.Choice(["fragmentation", "dynamic"]), default="fragmentation",
              show_default=True, help="fragmentation: the ATC'23 FGD protocol; dynamic: lifetimes, tenants, faults.")
@click.option("--nodes", "nodes_csv", default=f"{OPENB}/openb_node_list_gpu_node.csv", show_default=True,
              help="Node CSV (sn, cpu_milli, memory_mib, gpu, model).")
@click.option("--pods", "pods_csv", default=f"{OPENB}/openb_pod_list_default.csv", show_default=True,
              help="Pod CSV of the openb columns.")
@click.option("--policy", "policies", multiple=True, help="Policy (repeatable, or 'all'; default all).")
@click.option("--seed", "seed_list", type=int, multiple=True, help="A seed (repeatable).")
@click.option("--seeds", default=None,
              help="Seeds as '0-4' or '0,3' (default 0-4, 0-9 with --protocol artifact, unless --seed is given).")
@click.option("--protocol", type=click.Choice(["sample", "artifact"]), default="sample", show_default=True,
              help="fragmentation arrivals: sample = pods drawn with replacement, mean over seeds; artifact = "
                   "the FGD artifact's (whole trace shuffled, random copies up to 130%), median over seeds.")
@click.option("--out", "out_dir", default=None, help="Directory for the JSON report and PNG plots.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on stdout.")
@click.option("--ablation", type=click.Choice(["stream", "durations"]), default=None,
              help="With --experiment dynamic. stream: gpuaware with all stream-driven parts, without each, without "
                   "all (on the GenTD26 usage, Gavel slowdowns, the agent's physical model and the stream's "
                   "forecaster), and two ceilings: overcommit by forecasts that are never wrong. durations: queue "
                   "order fifo, las (runtimes unknown), predicted (the online runtime forecaster), and two ceilings: "
                   "features_oracle (the forecaster having read every pod's runtime ahead) and oracle (true "
                   "runtimes).")
@click.option("--workers", type=int, default=1, show_default=True, help="Processes for --ablation (same figures).")
@click.option("--variants", default=None,
              help="--ablation durations: only these variants, comma-separated (default all); the report has the "
                   "comparisons they allow.")
def simulate(experiment: str, nodes_csv: str, pods_csv: str, policies: tuple[str, ...], seed_list: tuple[int, ...],
             seeds: str | None, protocol: str, out_dir: str | None, as_json: bool, ablation: str | None,
             workers: int, variants: str | None) -> None:
    """Replay the openb traces through the scheduling core and report the figures.

    Progress goes to stderr; with one policy, --json prints that policy's figures (policy,
    unallocated_pct, decisions_per_s, p99_decision_ms), otherwise a report with every policy.

    \b
    Example:
      gpuaware simulate --experiment fragmentation --policy fgd --seeds 0-4 --json --out docs/results
      gpuaware simulate --policy fgd-artifact --protocol artifact --json
      gpuaware simulate --experiment dynamic --ablation stream --seeds 0-4 --json --out docs/results
    """
    if ablation:
        _ablation(ablation, experiment, nodes_csv, pods_csv, seed_list, seeds, out_dir, workers, variants)
        return
    from gpuaware.scheduler.sim.experiments import resolve_policies, resolve_seeds, run_simulation
    from gpuaware.scheduler.sim.openb import TraceError

    try:
        names = resolve_policies(list(policies))
        default = "0-9" if protocol == "artifact" and not seed_list else None
        seed_values = resolve_seeds(list(seed_list), seeds or default)
        with _progress_bar(len(names) * len(seed_values)) as progress:
            report = run_simulation(experiment, nodes_csv, pods_csv, names, seed_values, out_dir, progress, protocol)
    except (TraceError, ValueError) as exc:
        click.echo(f"gpuaware simulate: {exc}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(report["results"][0] if len(names) == 1 else report, indent=2))
        return
    for r in report["results"]:
        click.echo(json.dumps(r))


def _ablation(name: str, experiment: str, nodes_csv: str, pods_csv: str, seed_list: tuple[int, ...],
              seeds: str | None, out_dir: str | None, workers: int, variants: str | None = None) -> None:
    """An ablation's report (``variants.<name>``, ...) on stdout, and under ``out_dir`` if given."""
    from pathlib import Path

    from gpuaware.cli.stream_sim import make_runtime, make_stream
    from gpuaware.scheduler.sim.ablation import run_ablation, runs
    from gpuaware.scheduler.sim.durations import VARIANTS, run_durations
    from gpuaware.scheduler.sim.experiments import resolve_seeds
    from gpuaware.scheduler.sim.openb import TraceError, load_nodes, load_pods

    if experiment != "dynamic":
        click.echo(f"gpuaware simulate: --ablation {name} needs --experiment dynamic", err=True)
        sys.exit(2)
    try:
        seed_values = resolve_seeds(list(seed_list), seeds)
        chosen = [v.strip() for v in variants.split(",") if v.strip()] if variants else None
        if chosen is not None and name != "durations":
            raise ValueError("--variants is for --ablation durations")
        if chosen is not None and set(chosen) - set(VARIANTS):
            raise ValueError(f"unknown durations variant(s) {', '.join(sorted(set(chosen) - set(VARIANTS)))}; "
                             f"known: {', '.join(VARIANTS)}")
        nodes, pods = load_nodes(nodes_csv), load_pods(pods_csv)
        count = len(runs()) if name == "stream" else len(chosen or VARIANTS)
        with _progress_bar(count * len(seed_values)) as progress:
            if name == "stream":
                report = run_ablation(nodes, pods, seed_values, make_stream, progress=progress, workers=workers)
            else:
                report = run_durations(nodes, pods, seed_values, make_runtime, progress=progress, workers=workers,
                                       variants=chosen)
    except (TraceError, ValueError, FileNotFoundError) as exc:
        click.echo(f"gpuaware simulate: {exc}", err=True)
        sys.exit(2)
    report["pods"] = pods_csv
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / f"ablation-{name}-{Path(pods_csv).stem}.json").write_text(json.dumps(report, indent=2))
    click.echo(json.dumps(report, indent=2))


@contextmanager
def _progress_bar(runs: int) -> Iterator[Callable[[str, float], None]]:
    """A transient bar on stderr, advanced once per finished run (a run may report its end more than once)."""
    from rich.console import Console
    from rich.progress import Progress

    with Progress(transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task("simulating", total=runs)
        done: set[str] = set()

        def progress(label: str, fraction: float) -> None:
            bar.update(task, description=label)
            if fraction >= 1.0 and label not in done:
                done.add(label)
                bar.advance(task)

        yield progress
