"""Entry points of ``gpuaware simulate``: run an experiment for policies and seeds, write the report."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from gpuaware.scheduler.core.policy_specs import POLICIES
from gpuaware.scheduler.sim.dynamic import run_dynamic
from gpuaware.scheduler.sim.dynamic import summarize as summarize_dynamic
from gpuaware.scheduler.sim.fragmentation import run_fragmentation, summarize
from gpuaware.scheduler.sim.jobs import DynamicConfig
from gpuaware.scheduler.sim.openb import load_nodes, load_pods

Progress = Callable[[str, float], None]


def parse_seeds(text: str) -> list[int]:
    """'0-4' or '0,2,7' -> seeds."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    if not out:
        raise ValueError(f"no seeds in {text!r}")
    return out


def resolve_seeds(seeds: list[int], text: str | None) -> list[int]:
    """Seeds given one by one and as ``text`` ('0-4', '0,3'): their sorted union; 0-4 when neither is given."""
    values = list(seeds) or parse_seeds(text or "0-4")
    if text and seeds:
        values = sorted(set(values) | set(parse_seeds(text)))
    return values


def resolve_policies(names: list[str]) -> list[str]:
    if not names or names == ["all"]:
        return list(POLICIES)
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policy {unknown}; known: {', '.join(POLICIES)}")
    return names


def run_grid(run: Callable, summarize: Callable[[list], dict], policies: list[str], seeds: list[int],
             progress: Progress | None) -> list[dict]:
    """Every policy over every seed with the same core; one summary per policy."""
    summaries = []
    for policy in policies:
        runs = []
        for seed in seeds:
            label = f"{policy} seed {seed}"
            runs.append(run(policy, seed, (lambda f, label=label: progress(label, f)) if progress else None))
            if progress:
                progress(label, 1.0)
        summaries.append(summarize(runs))
    return summaries


def fragmentation_experiment(nodes_csv: str, pods_csv: str, policies: list[str], seeds: list[int],
                             out_dir: Path | None = None, progress: Progress | None = None,
                             protocol: str = "sample") -> dict:
    nodes = load_nodes(nodes_csv)
    pods = load_pods(pods_csv)
    summaries = run_grid(lambda policy, seed, cb: run_fragmentation(nodes, pods, policy, seed, cb, protocol=protocol),
                         lambda runs: summarize(runs, protocol), policies, seeds, progress)
    report = {"experiment": "fragmentation", "nodes": nodes_csv, "pods": pods_csv, "gpus": sum(n.gpus for n in nodes),
              "seeds": seeds, "results": summaries}
    title = f"{Path(pods_csv).stem}: {len(nodes)} nodes, {report['gpus']} GPUs, seeds {seeds}"
    return _write(report, out_dir, "plot_fragmentation", title)


def dynamic_experiment(nodes_csv: str, pods_csv: str, policies: list[str], seeds: list[int],
                       out_dir: Path | None = None, progress: Progress | None = None,
                       cfg: DynamicConfig | None = None) -> dict:
    nodes = load_nodes(nodes_csv)
    pods = load_pods(pods_csv)
    summaries = run_grid(lambda policy, seed, cb: run_dynamic(nodes, pods, policy, seed, cfg, cb), summarize_dynamic,
                         policies, seeds, progress)
    report = {"experiment": "dynamic", "nodes": nodes_csv, "pods": pods_csv, "seeds": seeds,
              "config": (cfg or DynamicConfig()).__dict__, "results": summaries}
    return _write(report, out_dir, "plot_dynamic", f"dynamic, {Path(report['pods']).stem}, seeds {seeds}")


def run_simulation(experiment: str, nodes_csv: str, pods_csv: str, policies: list[str], seeds: list[int],
                   out_dir: str | None = None, progress: Progress | None = None, protocol: str = "sample") -> dict:
    """The report of ``experiment`` ('fragmentation' or 'dynamic'), also written under ``out_dir`` if given.

    ``protocol`` ('sample' or 'artifact', fragmentation.py) picks the fragmentation experiment's arrivals."""
    runs = {"fragmentation": fragmentation_experiment, "dynamic": dynamic_experiment}
    if experiment not in runs:
        raise ValueError(f"unknown experiment {experiment!r}; known: {', '.join(runs)}")
    if protocol != "sample":
        if experiment != "fragmentation":
            raise ValueError(f"--protocol {protocol} applies to the fragmentation experiment only")
        return fragmentation_experiment(nodes_csv, pods_csv, policies, seeds, Path(out_dir) if out_dir else None,
                                        progress, protocol)
    return runs[experiment](nodes_csv, pods_csv, policies, seeds, Path(out_dir) if out_dir else None, progress)


def _write(report: dict, out_dir: Path | None, plotter: str, title: str) -> dict:
    """<experiment>-<pod trace>.json and .png under ``out_dir`` (nothing without one)."""
    if out_dir is None:
        return report
    from gpuaware.scheduler.sim import report as plots  # matplotlib only when a plot is asked for

    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{report['experiment']}-{Path(report['pods']).stem}"
    (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=2))
    report["plot"] = str(getattr(plots, plotter)(report["results"], out_dir / f"{stem}.png", title))
    return report
