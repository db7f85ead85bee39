"""Plots for simulation reports (matplotlib, Agg backend: files only, no display)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from gpuaware.scheduler.sim.fragmentation import LOAD_POINTS


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


def plot_dynamic(summaries: list[dict], path: Path, title: str) -> Path:
    """Queue wait (mean, p95) and mean JCT of each priority class, per policy."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    policies = [s["policy"] for s in summaries]
    classes = ("high", "medium", "low")
    width = 0.8 / len(classes)
    for ax, (key, label) in zip(axes, (("queue_wait_mean_s", "mean queue wait (s)"),
                                       ("queue_wait_p95_s", "p95 queue wait (s)"), ("mean_jct_s", "mean JCT (s)")),
                                strict=True):
        for k, cls in enumerate(classes):
            values = [s[key][cls] or 0.0 for s in summaries]
            ax.bar([i + (k - 1) * width for i in range(len(policies))], values, width, label=cls)
        ax.set_xticks(range(len(policies)))
        ax.set_xticklabels(policies, rotation=45, ha="right", fontsize=8)
        ax.set_title(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(title="priority", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
