"""``gpuaware eval``: the pipeline's models scored against the real traces."""

from __future__ import annotations

import sys

import click

from gpuaware.cli.common import echo_figures


@click.group("eval")
def eval_group() -> None:
    """Evaluate the pipeline's models against the real traces; figures print as JSON.

    \b
    Example:
      gpuaware eval sampling --json
    """


@eval_group.command("sampling")
@click.option("--scenario", "scenarios", multiple=True,
              help="Scenario name, YAML or folder of YAMLs, e.g. 'unseen' for the held-out set (repeatable; "
                   "default: every library scenario in gpuaware/agent/scenarios).")
@click.option("--policy", "policy_path", default=None, help="Sampling policy YAML to evaluate (default policy).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def eval_sampling(scenarios: tuple[str, ...], policy_path: str | None, as_json: bool) -> None:
    """Adaptive sampling vs fixed 1 s sampling over the fault scenarios (simulated clock).

    Reports sample_reduction, util_mae_pct_points, faults_injected, faults_detected,
    detection_delay_p95_s, false_alarms (WARNING or worse) and false_alarms_per_gpu_day,
    verdict_accuracy (a CRITICAL forecast the agent withdrew judged at the grade it settled at;
    verdict_accuracy_worst by the worst grade), false_remediations, and per thermal fault or memory
    leak lead_time_s (first CRITICAL minus the true crossing of the limit; negative = before).

    \b
    Example:
      gpuaware eval sampling --scenario ecc --scenario stuck-dead --json
      gpuaware eval sampling --scenario unseen --json
      gpuaware eval sampling --scenario hard --json
    """
    from gpuaware.agent.evaluation import evaluate_scenarios
    from gpuaware.agent.sampling import PolicyError

    try:
        result = evaluate_scenarios(list(scenarios), policy_path)
    except (PolicyError, ValueError, FileNotFoundError) as exc:
        click.echo(f"gpuaware eval sampling: {exc}", err=True)
        sys.exit(2)
    echo_figures(result, as_json, 26, keys=("sample_reduction", "util_mae_pct_points", "faults_injected",
                                            "faults_detected", "detection_delay_p95_s", "false_alarms",
                                            "false_alarms_per_gpu_day", "verdict_accuracy", "verdict_accuracy_worst",
                                            "false_remediations",
                                            "predictive_faults", "flagged_120s_before", "lead_120s_possible"))


@eval_group.command("forecast")
@click.option("--series", "series_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="A GenTD26-style CSV(.gz): value, timestamp_anon, container_ip (one series per container).")
@click.option("--horizon", type=int, default=5, show_default=True, help="Steps ahead (one step = one sample).")
@click.option("--max-value", type=float, default=None,
              help="Physical upper bound for clamping (default: 100 for duty-cycle files, none otherwise).")
@click.option("--limit", type=int, default=None, help="Only the first N series (sorted by id).")
@click.option("--split", type=click.Choice(["all", "tune", "holdout"]), default="all", show_default=True,
              help="Which half of the series (by a stable hash of the id): settings are tuned on 'tune' only.")
@click.option("--columns", is_flag=True,
              help="The stream workers' forecaster (its state in numpy rows) rather than River's objects.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def eval_forecast(series_path: str, horizon: int, max_value: float | None, limit: int | None, split: str,
                  columns: bool, as_json: bool) -> None:
    """Prequential (predict, then learn) forecast evaluation over every series of a trace.

    Reports mae, persistence_mae (last value), ratio = mae / persistence_mae,
    interval_coverage_80 of the 80% interval, and us_per_update. Every series is learned from
    scratch; --split holdout scores only the half of the series the settings were not tuned on.

    \b
    Example:
      gpuaware eval forecast --series ../shared/traces/alibaba-gentd26/pod_gpu_duty_cycle_anon.csv.gz --json
    """
    from gpuaware.bench.forecast_eval import evaluate_forecast

    if horizon < 1:
        click.echo("gpuaware eval forecast: --horizon must be at least 1", err=True)
        sys.exit(2)
    try:
        result = evaluate_forecast(series_path, horizon, max_value, limit, split, columns)
    except (ValueError, OSError) as exc:
        click.echo(f"gpuaware eval forecast: {exc}", err=True)
        sys.exit(2)
    echo_figures(result, as_json, 22)
