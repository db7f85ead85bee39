"""Markdown tables of the simulator's JSON reports (docs/results/*.json), for docs/scheduling.md.

    python -m gpuaware.bench.scheduling_tables docs/results
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

LOADS = ("80", "90", "100", "110", "120", "130")


def fragmentation_table(report: dict) -> str:
    rows = ["| policy | " + " | ".join(f"{x}%" for x in LOADS) + " | decisions/s | p99 ms |",
            "| --- |" + " ---: |" * (len(LOADS) + 2)]
    for s in sorted(report["results"], key=lambda s: s["unallocated_pct"]["130"]):
        cells = " | ".join(f"{s['unallocated_pct'][x]:.2f}" for x in LOADS)
        rows.append(f"| {s['policy']} | {cells} | {s['decisions_per_s']:.0f} | {s['p99_decision_ms']:.2f} |")
    return "\n".join(rows)


def traces_table(reports: list[dict]) -> str:
    rows = ["| pod trace | fgd 100% | gpuaware 100% | fgd 130% | gpuaware 130% | gpuaware lower at both |",
            "| --- | ---: | ---: | ---: | ---: | --- |"]
    for r in sorted(reports, key=lambda r: r["pods"]):
        res = {s["policy"]: s for s in r["results"]}
        if not {"fgd", "gpuaware"} <= set(res):
            continue
        f, g = res["fgd"]["unallocated_pct"], res["gpuaware"]["unallocated_pct"]
        ok = g["100"] < f["100"] and g["130"] < f["130"]
        rows.append(f"| {Path(r['pods']).stem.removeprefix('openb_pod_list_')} | {f['100']:.2f} | {g['100']:.2f} | "
                    f"{f['130']:.2f} | {g['130']:.2f} | {'yes' if ok else 'no'} |")
    return "\n".join(rows)


def dynamic_table(report: dict) -> str:
    keys = ("queue_wait_mean_s", "queue_wait_p95_s", "mean_jct_s")
    rows = ["| policy | wait mean high/med/low (s) | wait p95 high/med/low (s) | JCT high/med/low (s) | busy share | "
            "Jain | preempt | migrate | consolidate | killed by faults | throttles | decisions/s |",
            "| --- |" + " ---: |" * 11]
    for s in report["results"]:
        cells = [" / ".join(f"{s[k][p]:.0f}" if s[k][p] is not None else "-" for p in ("high", "medium", "low"))
                 for k in keys]
        rows.append(f"| {s['policy']} | {' | '.join(cells)} | {s['busy_share_of_allocated']:.3f} | "
                    f"{s['jain_fairness']:.4f} | {s['preemptions']} | {s['migrations']} | {s['consolidations']} | "
                    f"{s['killed_by_faults']} | {s['throttles']} | {s['decisions_per_s']:.0f} |")
    return "\n".join(rows)


def main(folder: str) -> None:
    # The folder also holds other benchmarks' figures (pipeline-*.json): only the simulator's reports have an experiment
    reports = [r for p in sorted(Path(folder).glob("*.json")) if "experiment" in (r := json.loads(p.read_text()))]
    for r in reports:
        if r["experiment"] == "fragmentation" and len(r["results"]) > 2:
            print(f"### Fragmentation, {Path(r['pods']).stem}, seeds {r['seeds']}\n\n{fragmentation_table(r)}\n")
    frag = [r for r in reports if r["experiment"] == "fragmentation"]
    print(f"### gpuaware vs FGD on every openb pod trace\n\n{traces_table(frag)}\n")
    for r in reports:
        if r["experiment"] == "dynamic":
            print(f"### Dynamic, {Path(r['pods']).stem}, seeds {r['seeds']}\n\n{dynamic_table(r)}\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/results")
