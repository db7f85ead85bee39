"""A small typed model of Grafana dashboard JSON (schemaVersion 39), just what gpuaware needs.

Plain dataclasses rather than grafanalib or the foundation SDK: no extra dependency to pin, the
JSON is readable, and a test checks every query against the metrics the code exports.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_COLUMNS = 24


@dataclass
class Target:
    expr: str
    legend: str = ""

    def to_json(self, ref: str, table: bool = False) -> dict[str, Any]:
        out = {"datasource": DATASOURCE, "expr": self.expr, "legendFormat": self.legend, "refId": ref}
        if table:  # one row per series now; a range query gives one frame per series, picked from a dropdown
            out.update(instant=True, range=False, format="table")
        return out


@dataclass
class Link:
    """A data link: Grafana fills ``${__field.labels.X}`` from the series clicked."""

    title: str
    url: str

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "url": self.url}


@dataclass
class Panel:
    title: str
    targets: list[Target]
    kind: str = "timeseries"  # timeseries | stat | heatmap | table | bargauge
    unit: str = "short"
    width: int = 12
    height: int = 8
    description: str = ""
    thresholds: list[tuple[float | None, str]] = field(default_factory=lambda: [(None, "green")])
    min: float | None = None
    max: float | None = None
    links: list[Link] = field(default_factory=list)

    def to_json(self, pid: int, x: int, y: int) -> dict[str, Any]:
        defaults: dict[str, Any] = {
            "unit": self.unit,
            "thresholds": {"mode": "absolute",
                           "steps": [{"value": v, "color": c} for v, c in self.thresholds]},
        }
        if self.links:
            defaults["links"] = [link.to_json() for link in self.links]
        if self.min is not None:
            defaults["min"] = self.min
        if self.max is not None:
            defaults["max"] = self.max
        return {
            "id": pid, "type": self.kind, "title": self.title, "description": self.description,
            "datasource": DATASOURCE, "gridPos": {"x": x, "y": y, "w": self.width, "h": self.height},
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}} if self.kind == "timeseries" else {},
            "targets": [t.to_json(chr(ord("A") + i), self.kind == "table") for i, t in enumerate(self.targets)],
        }


@dataclass
class Variable:
    name: str
    query: str  # label_values(...)
    label: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "label": self.label, "type": "query", "datasource": DATASOURCE,
                "query": {"query": self.query, "refId": "vars"}, "definition": self.query, "refresh": 2,
                "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "sort": 1}


@dataclass
class Annotation:
    """Events drawn over every time-series panel: a Prometheus query whose samples mark moments."""

    name: str
    expr: str
    title: str  # Grafana's titleFormat, e.g. "{{kind}} on {{Hostname}}/{{gpu}}"
    color: str = "red"
    tag_keys: str = "kind,Hostname,gpu"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "datasource": DATASOURCE, "enable": True, "expr": self.expr, "iconColor": self.color,
                "step": "30s", "titleFormat": self.title, "tagKeys": self.tag_keys, "useValueForTime": False}


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    panels: list[Panel]
    variables: list[Variable] = field(default_factory=list)
    tags: list[str] = field(default_factory=lambda: ["gpuaware"])
    annotations: list[Annotation] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        laid_out, x, y, row_h = [], 0, 0, 0
        for i, p in enumerate(self.panels, start=1):
            if x + p.width > GRID_COLUMNS:
                x, y, row_h = 0, y + row_h, 0
            laid_out.append(p.to_json(i, x, y))
            x, row_h = x + p.width, max(row_h, p.height)
        datasource = {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
                      "current": {}, "hide": 0}
        return {
            "uid": self.uid, "title": self.title, "description": self.description, "tags": self.tags,
            "schemaVersion": 39, "version": 1, "editable": True, "graphTooltip": 1,
            "time": {"from": "now-1h", "to": "now"}, "refresh": "30s", "timezone": "browser",
            "templating": {"list": [datasource, *(v.to_json() for v in self.variables)]},
            "annotations": {"list": [a.to_json() for a in self.annotations]}, "panels": laid_out,
            # The other gpuaware dashboards, keeping the time range and the variables they share.
            "links": [{"type": "dashboards", "tags": ["gpuaware"], "asDropdown": True, "title": "gpuaware",
                       "includeVars": True, "keepTime": True}],
        }

    def translated(self, expr: Callable[[str], str], text: Callable[[str], str]) -> Dashboard:
        """The same dashboard with every query rewritten by ``expr`` and every label reference
        (legends, variable queries, annotation titles) by ``text``: one definition, several schemas."""
        panels = [replace(p, targets=[Target(expr(t.expr), text(t.legend)) for t in p.targets],
                          links=[Link(text(k.title), text(k.url)) for k in p.links]) for p in self.panels]
        return replace(self, panels=panels,
                       variables=[replace(v, query=text(v.query)) for v in self.variables],
                       annotations=[replace(a, expr=expr(a.expr), title=text(a.title), tag_keys=text(a.tag_keys))
                                    for a in self.annotations])

    def queries(self) -> list[str]:
        return [t.expr for p in self.panels for t in p.targets] + [a.expr for a in self.annotations]

    def variable_references(self) -> set[str]:
        """Every ``$name`` its queries, variable queries and links use (Grafana's ``$__`` built-ins aside)."""
        texts = self.queries() + [v.query for v in self.variables] + [k.url for p in self.panels for k in p.links]
        return {m for t in texts for m in re.findall(r"\$\{?(\w+)", t) if not m.startswith("__")}

    def variable_names(self) -> set[str]:
        return {"datasource", *(v.name for v in self.variables)}
