"""Plots for simulation reports (matplotlib, Agg backend: files only, no display)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from scheduler.sim.fragmentation import LOAD_POINTS


def plot_fragmentation(summaries: list[dict], path: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s in sorted(summaries, key=lambda s: -s["unallocated_pct"]["130"]):
        ys = [s["unallocated_pct"][str(x)] for x in LOAD_POINTS]
        style = {"linewidth": 2.5} if s["policy"] in ("gpuaware", "fgd") else {"linewidth": 1.2, "alpha": 0.8}
        ax.plot(LOAD_POINTS, ys, marker="o", label=f"{s['policy']} ({ys[-1]:.1f}% at 130%)", **style)
    ax.set_xlabel("arrived GPU load, % of cluster GPU capacity")
    ax.set_ylabel("GPU capacity unallocated, %")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
