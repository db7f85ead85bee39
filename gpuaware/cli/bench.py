"""``gpuaware bench``: benchmarks of the agent, the stream workers, the scheduler and the whole pipeline."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from gpuaware.cli.common import OPENB, Context, echo_figures, progress_to_stderr
from gpuaware.local.broker import LocalBroker
from gpuaware.plumbing import observability
from gpuaware.plumbing.kafka_settings import KafkaSettings


@click.group()
def bench() -> None:
    """Benchmarks that print JSON figures (never timed assertions in tests).

    \b
    Example:
      gpuaware bench agent --json
    """


@contextmanager
def _broker(obj: Context, **client: Any) -> Iterator[tuple[KafkaSettings, int | None]]:
    """(settings, broker pid or None) with bench logging set up: the broker named by
    --bootstrap-servers/GPUAWARE_KAFKA__BOOTSTRAP_SERVERS, else a fresh embedded one whose
    client settings take ``client``."""
    cfg = obj.config()
    observability.setup("bench", log_level="warning")
    if obj.flag_overrides.get("kafka.bootstrap_servers") or "GPUAWARE_KAFKA__BOOTSTRAP_SERVERS" in os.environ:
        yield cfg.kafka, None
    else:
        with LocalBroker(cfg.broker.model_copy(update={"port": 0})) as local:
            yield local.kafka_settings(**client), local.pid


def _int_list(text: str, minimum: int, param_hint: str, example: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
        if not values or min(values) < minimum:
            raise ValueError
    except ValueError:
        raise click.BadParameter(f"{text!r}: give numbers of {minimum} or more like {example}",
                                 param_hint=param_hint) from None
    return values


@bench.command("agent")
@click.option("--seconds", type=float, default=60.0, show_default=True, help="Measured wall time.")
@click.option("--gpus", type=int, default=8, show_default=True, help="Simulated GPUs on the node (sim only).")
@click.option("--collector", type=click.Choice(["sim", "nvml"]), default="sim", show_default=True,
              help="sim: simulated H100s; nvml: this machine's GPUs.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.pass_obj
def bench_agent_cmd(obj: Context, seconds: float, gpus: int, collector: str, as_json: bool) -> None:
    """The agent's own cost at a 1 s floor: CPU, memory, bytes per GPU sample, DCGM text size.

    Uses the broker named by --bootstrap-servers/GPUAWARE_KAFKA__BOOTSTRAP_SERVERS if given,
    otherwise starts the embedded broker for the run.

    \b
    Example:
      gpuaware bench agent --seconds 10 --gpus 8 --json
      gpuaware bench agent --collector nvml --json   # on a GPU node
    """
    from gpuaware.bench.agent_bench import bench_agent

    with _broker(obj) as (kafka, _):
        try:
            result = bench_agent(kafka, seconds=seconds, gpus=gpus, collector=collector)
        except RuntimeError as exc:  # NvmlCollector: no driver or no NVML on this machine
            raise click.ClickException(str(exc)) from None
    echo_figures(result, as_json, 28)


@bench.command("stream")
@click.option("--workers", "worker_counts", default="1,2", show_default=True,
              help="Worker counts to measure, comma-separated.")
@click.option("--gpus", type=int, default=1024, show_default=True, help="Simulated fleet size (8 GPUs per node).")
@click.option("--samples-per-batch", type=int, default=5, show_default=True,
              help="Samples per GPU in each node's batch (an agent flushing every 5 s at a 1 s floor).")
@click.option("--backlog", type=int, default=200_000, show_default=True, help="Samples in the throughput backlog.")
@click.option("--rate", type=float, default=2000.0, show_default=True,
              help="Samples/s produced live for the latency phase.")
@click.option("--latency-seconds", type=float, default=20.0, show_default=True, help="Length of the latency phase.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.pass_obj
def bench_stream_cmd(obj: Context, worker_counts: str, gpus: int, samples_per_batch: int, backlog: int, rate: float,
                     latency_seconds: float, as_json: bool) -> None:
    """GPU-samples/s through 1 and 2 stream workers (forecasting on) and p99 sample-to-state latency.

    Writes a backlog of synthetic fleet telemetry, starts the workers, and times how fast they
    apply it; then produces live at --rate and measures sample-to-gpu.state.v1 latency.
    Progress goes to stderr; the figures to stdout.

    \b
    Example:
      gpuaware bench stream --workers 1,2 --gpus 1024 --json
    """
    from gpuaware.bench.stream_bench import run_bench

    counts = _int_list(worker_counts, 1, "--workers", "1,2")
    with _broker(obj, session_timeout_ms=2000) as (kafka, _):
        result = run_bench(kafka, counts, gpus, samples_per_batch, backlog, rate, latency_seconds,
                           progress=progress_to_stderr("bench stream"))
    click.echo(json.dumps(result, indent=2) if as_json else json.dumps(result))


@bench.command("scheduler")
@click.option("--kube", type=click.Choice(["real", "fake"]), default="real", show_default=True,
              help="real: kube-apiserver, etcd, kube-scheduler and kwok (realparts/build-kube.sh builds them), "
                   "three modes side by side; fake: gpuaware alone on the fake API server, state through the broker.")
@click.option("--nodes", "node_csv", default=f"{OPENB}/openb_node_list_gpu_node.csv", show_default=True,
              help="Node CSV (kwok nodes, or the fake API server's).")
@click.option("--pods", "pod_csv", default=f"{OPENB}/openb_pod_list_default.csv", show_default=True,
              help="Pod CSV the pods are sampled from.")
@click.option("--burst", type=int, default=2000, show_default=True,
              help="Pods of the throughput phase (real: a backlog created before the scheduler starts).")
@click.option("--rate", type=float, default=200.0, show_default=True, help="Pods/s for the latency phase.")
@click.option("--seconds", type=float, default=15.0, show_default=True, help="Length of the latency phase.")
@click.option("--modes", default=None,
              help="real: the modes to run, comma-separated [default: kube_scheduler,extender,gpuaware; "
                   "with --dra kube_scheduler_dra,gpuaware_dra]; also ceiling (with --dra: ceiling_dra): a "
                   "binder that decides nothing, the most pods/s this control plane takes here; and "
                   "extender_ceiling: kube-scheduler through an extender that decides nothing.")
@click.option("--budgets", default="default,raised", show_default=True,
              help="real: API budgets, comma-separated: default (as shipped) and raised (--qps for all).")
@click.option("--qps", type=float, default=500.0, show_default=True,
              help="real: the raised budget's client QPS (burst twice that) for kube-scheduler and gpuaware.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--dra", is_flag=True,
              help="real: GPUs as DRA devices (a ResourceSlice per node) and pods with ResourceClaims: "
                   "kube-scheduler's DynamicResources plugin and gpuaware allocating them (docs/performance.md).")
@click.option("--dra-fraction", type=click.Choice(["whole", "memory"]), default="whole", show_default=True,
              help="--dra: a fractional trace pod's claim asks for a whole GPU, or for its share of the GPU's "
                   "memory (consumable capacity: shareable devices, allocated as shares by both modes).")
@click.option("--node-count", type=click.IntRange(min=1), default=None,
              help="real: only the first N GPU nodes of --nodes (quick runs) [default: all].")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.pass_obj
def bench_scheduler_cmd(obj: Context, kube: str, node_csv: str, pod_csv: str, burst: int, rate: float,
                        seconds: float, modes: str | None, budgets: str, qps: float, seed: int, dra: bool,
                        dra_fraction: str, node_count: int | None, as_json: bool) -> None:
    """Pods bound per second and p99 creation-to-binding on the 1,213-node openb cluster.

    --kube real (default): the real control plane with the trace's nodes as kwok nodes; in one run,
    on the same pods: kube-scheduler alone, kube-scheduler + gpuaware's extender, gpuaware as the
    scheduler, each with the default and with a raised equal API budget. JSON:
    {"runs": {budget: {"api_budget", "modes": {mode: {pods_per_s, p99_create_to_bind_s,
    unallocated_gpu_pct, pending, ...}}}}}.

    --dra: the same with GPUs as DRA devices and a ResourceClaim per GPU pod; modes
    kube_scheduler_dra (kube-scheduler's DynamicResources plugin) and gpuaware_dra; per mode also
    devices_allocated_twice and bound_pods_without_allocation, from the claims the apiserver holds.

    --kube fake: gpuaware alone on a fake kube-apiserver (its own process), every GPU's state
    through the broker. Progress goes to stderr; the figures to stdout.

    \b
    Example:
      gpuaware bench scheduler --burst 1000 --rate 200 --seconds 5 --json
      gpuaware bench scheduler --kube fake --burst 2000 --rate 200 --seconds 15 --json
      gpuaware bench scheduler --dra --budgets raised --burst 1000 --rate 100 --seconds 5 --json
    """
    for path in (node_csv, pod_csv):
        if not Path(path).is_file():
            raise click.BadParameter(f"{path}: no such file (the openb traces live in ../shared/traces)")
    if kube == "fake":
        if dra:
            raise click.BadParameter("--dra needs the real control plane", param_hint="--kube")
        if node_count is not None:
            raise click.BadParameter("only on the real control plane (the fake one runs every node)",
                                     param_hint="--node-count")
        from gpuaware.bench.scheduler_bench import run_bench

        with _broker(obj, session_timeout_ms=2000) as (kafka, _):
            result = run_bench(kafka, node_csv, pod_csv, burst, rate, seconds, seed,
                               progress=progress_to_stderr("bench scheduler"))
        echo_figures(result, as_json, 28)
        return
    from gpuaware.bench.kube_bench import MODES, OPT_IN_MODES, run_kube_bench
    from gpuaware.bench.kube_dra_bench import DRA_MODES, DRA_OPT_IN_MODES, run_dra_bench
    from gpuaware.local.kube_control_plane import BinariesMissing, find_binaries

    known = DRA_MODES if dra else MODES
    chosen = tuple(m for m in (modes or ",".join(known)).split(",") if m.strip())
    allowed = known + (DRA_OPT_IN_MODES if dra else OPT_IN_MODES)
    if not chosen or set(chosen) - set(allowed):
        raise click.BadParameter(f"{modes!r}: give some of {','.join(allowed)}", param_hint="--modes")
    if dra and dra_fraction == "memory" and "ceiling_dra" in chosen:
        raise click.BadParameter("ceiling_dra hands out whole devices: not with --dra-fraction memory",
                                 param_hint="--modes")
    if len(set(chosen)) != len(chosen):
        # A mode's pods are named after it: a second turn would meet the first one's pods and claims.
        raise click.BadParameter(f"{modes!r}: each mode once (run the command again for another turn)",
                                 param_hint="--modes")
    chosen_budgets = tuple(b for b in budgets.split(",") if b.strip())
    if not chosen_budgets or set(chosen_budgets) - {"default", "raised"}:
        raise click.BadParameter(f"{budgets!r}: give default, raised or both", param_hint="--budgets")
    try:
        find_binaries()
    except BinariesMissing as exc:
        raise click.ClickException(f"{exc}; or run this bench with --kube fake") from None
    observability.setup("bench", log_level="warning")
    if dra:
        result = run_dra_bench(node_csv, pod_csv, burst, rate, seconds, seed, chosen, chosen_budgets, qps,
                               node_count, dra_fraction, progress=progress_to_stderr("bench scheduler --dra"))
    else:
        result = run_kube_bench(node_csv, pod_csv, burst, rate, seconds, seed, chosen, chosen_budgets, qps,
                                node_count, progress=progress_to_stderr("bench scheduler"))
    click.echo(json.dumps(result, indent=2) if as_json else json.dumps(result))


@bench.command("pipeline")
@click.option("--sizes", default="4096,16384,50000,100000", show_default=True,
              help="Fleet sizes in GPUs, comma-separated.")
@click.option("--workers", "worker_counts", default="1,2", show_default=True,
              help="Stream worker counts measured at each size, comma-separated.")
@click.option("--seconds", type=float, default=30.0, show_default=True, help="Measured time per size and worker count.")
@click.option("--broker", type=click.Choice(["embedded", "apache"]), default="embedded", show_default=True,
              help="A fresh embedded broker, or Apache Kafka from the real parts (ignored with --bootstrap-servers).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.pass_obj
def bench_pipeline_cmd(obj: Context, sizes: str, worker_counts: str, seconds: float, broker: str,
                       as_json: bool) -> None:
    """The stream and the scheduler under a fleet's telemetry (load generator, stream workers, scheduler).

    Per size and worker count: samples/s published and applied, the stream's max consumer lag and
    whether it grows, p99 sample-to-state latency (with and beyond the agents' 5 s batching), the
    scheduler's cycle p99 with the fleet's live state, its feed lag and memory, CPU and memory of
    each process; and the largest fleet sustained. Progress on stderr, figures on stdout.

    \b
    Example:
      gpuaware bench pipeline --sizes 4096,50000 --workers 1 --seconds 30 --json
    """
    from gpuaware.bench.pipeline_bench import run_pipeline_bench

    fleet = _int_list(sizes, 8, "--sizes", "4096,50000")
    counts = tuple(_int_list(worker_counts, 1, "--workers", "1,2"))
    progress = progress_to_stderr("bench pipeline")
    with _pipeline_broker(obj, broker) as (kafka, broker_pid):
        result = run_pipeline_bench(kafka, fleet, seconds, broker_pid, counts, broker, progress=progress)
    click.echo(json.dumps(result, indent=2) if as_json else
               "\n".join(json.dumps(r) for r in result["results"])
               + f"\nlargest sustained: {result['largest_sustained_gpus']} GPUs")


@bench.command("scheduler-scale")
@click.option("--sizes", default="4096,50000,100000", show_default=True, help="Fleet sizes in GPUs, comma-separated.")
@click.option("--seconds", type=float, default=30.0, show_default=True, help="Measured time per size.")
@click.option("--states-per-gpu-s", type=float, default=0.12, show_default=True,
              help="Fresh gpu.state.v1 records per GPU per second (the stream's rate at the default sampling).")
@click.option("--pod-rate", type=float, default=20.0, show_default=True, help="openb pods created per second.")
@click.option("--pods", "pod_csv", default=f"{OPENB}/openb_pod_list_default.csv", show_default=True,
              help="The openb pod trace the pods are sampled from.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the pod sample and the GPU states.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as indented JSON.")
def bench_scheduler_scale_cmd(sizes: str, seconds: float, states_per_gpu_s: float, pod_rate: float, pod_csv: str,
                              seed: int, as_json: bool) -> None:
    """The scheduler alone with a fleet's live state: the fleet's gpu.state.v1 records fed straight to its
    feed path at the stream's rate, openb pods from a fake API server, no broker or stream workers.

    Per size: cycle p50/p99 (one pod's decision) wall and CPU, pass and state-apply p99, feed lag,
    CPU and RSS of the scheduler process. Progress on stderr, figures on stdout.

    \b
    Example:
      gpuaware bench scheduler-scale --sizes 4096,50000 --seconds 20 --json
    """
    from gpuaware.bench.scheduler_scale import run_scale_bench

    if not Path(pod_csv).exists():
        raise click.BadParameter(f"{pod_csv} does not exist", param_hint="--pods")
    fleet = _int_list(sizes, 8, "--sizes", "4096,50000")
    result = run_scale_bench(fleet, seconds, pod_csv, states_per_gpu_s, pod_rate, seed,
                             progress=progress_to_stderr("bench scheduler-scale"))
    click.echo(json.dumps(result, indent=2) if as_json else "\n".join(json.dumps(r) for r in result["results"]))


@contextmanager
def _pipeline_broker(obj: Context, broker: str) -> Iterator[tuple[KafkaSettings, int | None]]:
    """``_broker``, or a fresh Apache Kafka (real parts) with the contract's topics when ``broker`` is apache."""
    if broker != "apache" or obj.flag_overrides.get("kafka.bootstrap_servers") \
            or "GPUAWARE_KAFKA__BOOTSTRAP_SERVERS" in os.environ:
        with _broker(obj, session_timeout_ms=2000) as out:
            yield out
        return
    import asyncio

    from gpuaware.local.apache_kafka import ApacheKafka, available
    from gpuaware.plumbing.kafka_admin import ensure_topics

    missing = available()
    if missing:
        raise click.ClickException(f"--broker apache: {missing}")
    observability.setup("bench", log_level="warning")
    with ApacheKafka(full_jit=True) as kafka:
        settings = apache_client_settings(kafka)
        asyncio.run(ensure_topics(settings))
        yield settings, kafka.pid


APACHE_MIN_SESSION_TIMEOUT_MS = 6000  # Apache Kafka's group.min.session.timeout.ms default


def apache_client_settings(kafka: Any) -> KafkaSettings:
    """Client settings for a bench's Apache Kafka: the client's default session timeout (the
    embedded broker's benches use 2 s, which Apache Kafka refuses at group join)."""
    settings = kafka.kafka_settings()
    if settings.session_timeout_ms < APACHE_MIN_SESSION_TIMEOUT_MS:
        settings = settings.model_copy(update={"session_timeout_ms": APACHE_MIN_SESSION_TIMEOUT_MS})
    return settings
