"""The live view of `gpuaware up`, sized to the terminal.

The view is taller than most terminals; rich's ``Live`` redraws it by moving the cursor up its
height, so whatever does not fit (or any line written below it) scrolls away and leaves a copy of
its top behind. ``StackView`` therefore renders only what fits the height it is given: first the
row counts of the recent events and decisions shrink, then whole sections drop (named in the
last line). Log records go through ``Live``'s stderr while it is on (``logs_above``) so that they
print above the view instead of through it.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.columns import Columns
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpuaware.contract import topics
from gpuaware.scheduler.forecast_quality import report

if TYPE_CHECKING:
    from gpuaware.agent.runtime import AgentRuntime
    from gpuaware.local.stack import StackState
    from gpuaware.local.stack_scheduler import StackScheduler

# Tried in order until one fits: (event rows, decision rows, sections left out).
_OPTIONAL = ("runtimes", "stream", "tenants", "decisions", "events")
LAYOUTS = [(rows, min(rows, 6), _OPTIONAL[:dropped]) for dropped in range(len(_OPTIONAL) + 1)
           for rows in (8, 6, 4, 2)]


class StackView:
    """``frame()`` is a snapshot of the stack sized to the console; build it on the event loop's thread
    (it reads state the loop changes) and hand it to ``Live.update``."""

    def __init__(self, runtime: AgentRuntime, state: StackState, bootstrap: str, sched: StackScheduler | None = None):
        self.runtime = runtime
        self.state = state
        self.bootstrap = bootstrap
        self.sched = sched

    def frame(self, console: Console) -> Group:
        """The largest layout that fits the console's size (the smallest if none does: Live crops it)."""
        options = console.options.reset_height()
        parts: list[RenderableType] = []
        for events, decisions, dropped in LAYOUTS:
            parts = self.sections(events, decisions, dropped, console.width)
            if sum(len(console.render_lines(p, options, pad=False)) for p in parts) <= console.height:
                break
        return Group(*parts)

    def sections(self, event_rows: int = 8, decision_rows: int = 6, dropped: tuple[str, ...] = (),
                 width: int | None = None) -> list[RenderableType]:
        parts: list[RenderableType] = [self.fleet()]
        if "events" not in dropped:
            parts.append(self.events(event_rows, width))
        if "stream" not in dropped:
            parts.append(Columns([self.workload_classes(), self.demand_forecast()], padding=(0, 4)))
        if self.sched is not None:
            if "tenants" not in dropped:
                parts.append(self.tenants())
            if "decisions" not in dropped:
                parts.append(self.decisions(decision_rows, width))
            if "runtimes" not in dropped:
                parts.append(self.runtimes())
        parts.append(self.totals(dropped))
        return parts

    def fleet(self) -> Table:
        by_model: dict[str, Counter[str]] = {}
        util: dict[str, list[float]] = {}
        for core in self.runtime.cores:
            for t in core.tracks:
                c = by_model.setdefault(t.device.model, Counter())
                c["gpus"] += 1
                c["lost" if t.lost else t.health.band.value.lower()] += 1
                if t.last_watch is not None and t.last_watch.util_gpu is not None and not t.lost:
                    util.setdefault(t.device.model, []).append(t.last_watch.util_gpu)
        fleet = Table(title=f"gpuaware up — broker {self.bootstrap} — {time.monotonic() - self.state.started:.0f}s")
        for col in ("GPU model", "GPUs", "healthy", "degraded", "critical", "lost", "mean util %"):
            fleet.add_column(col, justify="right" if col != "GPU model" else "left")
        for model, c in sorted(by_model.items()):
            u = util.get(model, [])
            fleet.add_row(model, str(c["gpus"]), str(c["healthy"]), f"[yellow]{c['degraded']}",
                          f"[red]{c['critical']}", str(c["lost"]), f"{sum(u) / len(u):.1f}" if u else "-")
        return fleet

    def events(self, rows: int, width: int | None = None) -> Table:
        # A GPU is named by its node and index, as nvidia-smi does: simulated UUIDs share their tails.
        index = {t.device.uuid: t.device.index for c in self.runtime.cores for t in c.tracks}
        return _one_line_rows("recent events", ["time", "node", "GPU", "kind", "message"], [
            [time.strftime("%H:%M:%S", time.localtime(ev.ts_ms / 1000)), ev.node,
             str(index.get(ev.gpu_uuid, ev.gpu_uuid[-12:])), ev.kind.value, ev.message[:70]]
            for ev in list(reversed(self.state.events))[:rows]], width, right={"GPU"})

    def workload_classes(self) -> Table:
        classes = Counter(s.workload_class or "unknown" for s in self.state.gpu_states.values())
        title = "stream: GPUs per workload class"
        table = Table(title=title, min_width=len(title))
        table.add_column("workload class")
        table.add_column("GPUs", justify="right")
        for name, n in sorted(classes.items()):
            table.add_row(name, str(n))
        return table

    def demand_forecast(self) -> Table:
        title = "stream: busy GPUs forecast per model"
        table = Table(title=title, min_width=len(title))
        table.add_column("GPU model")
        table.add_column("now+5 min [80% interval]", justify="right")
        table.add_column("capacity", justify="right")
        forecast = self.state.forecast
        for d in (d for d in (forecast.models if forecast else []) if d.horizon_s == 300):
            table.add_row(d.model, f"{d.demand_gpus:.1f} [{d.lower:.1f}, {d.upper:.1f}]", f"{d.capacity_gpus:.0f}")
        return table

    def tenants(self) -> Table:
        assert self.sched is not None
        live = self.sched.live
        table = Table(title="scheduler: queues per tenant")
        for col in ("tenant", "pending (high/medium/low)", "running pods", "GPUs used", "quota"):
            table.add_column(col, justify="left" if col == "tenant" else "right")
        snap = live.snapshot
        running = Counter(r.workload.tenant for r in live.cache.running.values())
        for t in sorted(set(snap.gpus_quota) | set(snap.gpus_used)):
            pend = "/".join(str(snap.pending.get((t, p), 0)) for p in ("high", "medium", "low"))
            table.add_row(t, pend, str(running.get(t, 0)), f"{snap.gpus_used.get(t, 0.0):.1f}",
                          f"{snap.gpus_quota.get(t, 0.0):.0f}")
        return table

    def decisions(self, rows: int, width: int | None = None) -> Table:
        assert self.sched is not None
        return _one_line_rows("scheduler: recent decisions", ["action", "pod / GPU", "node", "why"], [
            [o.action.value, o.key[-28:], o.node or "",
             (f"[stream: {'+'.join(o.steered_by)}] " if o.steered_by else "") + "; ".join(o.reasons)[:70]]
            for o in list(self.sched.live.sink.recent)[-rows:][::-1]], width)

    def runtimes(self) -> Table:
        """Each of the last completions: the runtime estimate its pod was placed with against how long it ran."""
        assert self.sched is not None
        r = report(self.sched.live.stats.forecasts, self.sched.live.stats.runtimes, time.time())
        figures = (f"{r['completions_scored']} scored, Spearman {_num(r['spearman'])}, "
                   f"within p90 {_num(r['p90_coverage'])}" if r["completions_scored"] else "none completed yet")
        title = (f"scheduler: job runtimes, predicted vs actual ({figures}; {r['completions_published']} published, "
                 f"{r['runtime_keys'] or 0} keys learned)")
        table = Table(title=title, min_width=len(title))
        for col in ("pod", "estimate from", "p50 s", "p90 s", "actual s"):
            table.add_column(col, justify="left" if col in ("pod", "estimate from") else "right")
        for row in reversed(r["recent"]):
            table.add_row(row["pod"][-28:], row["level"], f"{row['p50_s']:.0f}", f"{row['p90_s']:.0f}",
                          f"{row['actual_s']:.0f}")
        return table

    def totals(self, dropped: tuple[str, ...] = ()) -> Text:
        runtime, state, sched = self.runtime, self.state, self.sched
        alerts = ", ".join(sorted(state.firing)) or ("none" if state.prometheus else "no Prometheus")
        placed = sched.live.stats.by_action()["PLACE"] if sched else 0
        text = (f"samples published {runtime.samples_published}   events {runtime.events_published}   "
                f"spooled {runtime.spool.depth}   gpu states {state.state_records[topics.GPU_STATE]}   "
                + (f"pods placed {placed}{steered(sched.live.stats)}" if sched else "scheduler off")
                + f"\nalerts firing: {alerts}")
        hidden = [d for d in dropped if d not in ("decisions", "runtimes") or sched is not None]
        if hidden:
            text += f"   (hidden to fit the terminal: {', '.join(hidden)})"
        return Text(text)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def steered(stats) -> str:
    """", 3 steered by the stream (thermal 3)": placements the stream's signals changed."""
    if not stats.steered_placements:
        return ", none steered by the stream"
    by = ", ".join(f"{s} {n}" for s, n in sorted(stats.steered.items()))
    return f", {stats.steered_placements} steered by the stream ({by})"


def _one_line_rows(title: str, columns: list[str], rows: list[list[str]], width: int | None,
                   right: frozenset[str] | set[str] = frozenset()) -> Table:
    """A table of one line per row: the last column (free text) gets what the others leave of ``width``
    and ends in an ellipsis, rather than every column being squeezed or the text wrapping."""
    table = Table(title=title)
    for col in columns[:-1]:
        table.add_column(col, no_wrap=True, justify="right" if col in right else "left")
    fixed = sum(max([len(col)] + [len(r[i]) for r in rows]) for i, col in enumerate(columns[:-1]))
    room = None if width is None else max(8, width - fixed - 3 * len(columns) - 1)  # padding 2 + border 1 each
    table.add_column(columns[-1], no_wrap=True, overflow="ellipsis", max_width=room)
    for r in rows:
        table.add_row(*r)
    return table


@contextmanager
def logs_above() -> Iterator[None]:
    """While ``Live`` redirects stderr, send the root logger's stderr handlers through it too.

    A handler keeps the stream it was created with; a line written there lands inside the live
    region, and the next redraw leaves a copy of the view's top behind.
    """
    proxy = sys.stderr
    real = getattr(proxy, "rich_proxied_file", None)
    moved = [h for h in logging.getLogger().handlers
             if real is not None and isinstance(h, logging.StreamHandler) and h.stream is real]
    for h in moved:
        h.setStream(proxy)
    try:
        yield
    finally:
        for h in moved:
            h.setStream(real)
