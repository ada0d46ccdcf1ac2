"""Running a dashboard's queries as Grafana would, against a real Prometheus, without Grafana.

Grafana's Prometheus datasource interpolates the template variables into each query (a
multi-value or "All" variable inside ``=~"$var"`` becomes a regex alternation, or the variable's
``allValue``), replaces the interval macros, and sends a range or an instant query to the
Prometheus HTTP API. This module does the same for every panel target, variable and annotation
of a generated dashboard, so tests and ``render`` see what a person would see in Grafana.
"""

from __future__ import annotations

import re
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deployer.monitoring.http import http_fetch
from deployer.secrets import mask_text

_LEGEND_LABEL = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::[a-z]+)?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_RE2_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


@dataclass(frozen=True)
class Target:
    """One query of a dashboard: which panel (or variable, annotation) it belongs to."""

    dashboard: str
    panel: str
    panel_type: str
    ref: str
    expr: str
    legend: str
    instant: bool

    @property
    def legend_labels(self) -> tuple[str, ...]:
        """The labels the legend names: every series must carry them."""
        return tuple(dict.fromkeys(_LEGEND_LABEL.findall(self.legend)))


def targets(uid: str, dashboard: Mapping[str, Any]) -> Iterator[Target]:
    """Every panel target of a dashboard, in panel order."""
    for panel in dashboard.get("panels", []):
        for t in panel.get("targets", []):
            yield Target(
                dashboard=uid,
                panel=panel.get("title", ""),
                panel_type=panel.get("type", ""),
                ref=t.get("refId", ""),
                expr=t["expr"],
                legend=t.get("legendFormat", ""),
                instant=bool(t.get("instant")),
            )


def annotation_targets(uid: str, dashboard: Mapping[str, Any]) -> Iterator[Target]:
    for a in dashboard.get("annotations", {}).get("list", []):
        if a.get("expr"):
            yield Target(uid, a["name"], "annotation", "", a["expr"], "", False)


_LABEL_VALUES = re.compile(r"^label_values\((?P<match>.*),\s*(?P<label>[A-Za-z_][A-Za-z0-9_]*)\)$")


def variable_queries(dashboard: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(variable name, series selector, label) of every ``label_values`` query variable."""
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        m = _LABEL_VALUES.match(str(v.get("query", "")).strip())
        if not m:
            raise ValueError(
                f"variable {v.get('name')}: not a label_values query: {v.get('query')}"
            )
        yield v["name"], m["match"].strip(), m["label"]


@dataclass(frozen=True)
class Values:
    """The template variables' values: a list of values each; ``None`` is "All"."""

    values: Mapping[str, Sequence[str] | None] = field(default_factory=dict)
    datasource: str = ""
    scrape_interval_s: float = 15.0
    step_s: float = 30.0
    range_s: float = 3600.0

    def of(self, name: str, dashboard: Mapping[str, Any]) -> str:
        if name == "datasource":
            return self.datasource
        if name == "__rate_interval":
            # Grafana: max($__interval + scrape interval, 4 x scrape interval)
            return f"{int(max(self.step_s + self.scrape_interval_s, 4 * self.scrape_interval_s))}s"
        if name == "__interval":
            return f"{int(self.step_s)}s"
        if name == "__range":
            return f"{int(self.range_s)}s"
        chosen = self.values.get(name)
        if chosen is None:
            var = next(
                (v for v in dashboard.get("templating", {}).get("list", []) if v["name"] == name),
                None,
            )
            if var is None:
                raise KeyError(f"no variable ${name} in the dashboard")
            return str(var.get("allValue") or ".*")
        if len(chosen) == 1:
            return _RE2_SPECIAL.sub(r"\\\\\1", chosen[0])
        return "(" + "|".join(_RE2_SPECIAL.sub(r"\\\\\1", c) for c in chosen) + ")"


def interpolate(expr: str, dashboard: Mapping[str, Any], values: Values) -> str:
    """``expr`` with every ``$var`` / ``${var}`` replaced as Grafana's Prometheus datasource
    replaces it (regex-escaped, alternation for several values)."""
    return _VARIABLE.sub(lambda m: values.of(m.group(1) or m.group(2), dashboard), expr)


class QueryError(RuntimeError):
    """Prometheus refused or did not answer a query."""


@dataclass
class Prometheus:
    """The Prometheus HTTP API at ``url`` (a replica, VictoriaMetrics or Thanos Query), asked
    through the one HTTP client (``deployer.monitoring.http``)."""

    url: str
    timeout: float = 20.0

    def _get(self, path: str, params: Mapping[str, str]) -> Any:
        full = f"{self.url.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
        r = http_fetch(full, timeout=self.timeout)
        what = f"{path} {params.get('query', '')}"
        if r.error is not None:
            raise QueryError(r.error)
        if not 200 <= r.status < 300:
            raise QueryError(mask_text(f"{what}: HTTP {r.status}: {r.body}"))
        try:
            body = r.json()
        except ValueError:
            raise QueryError(f"{what}: not JSON from {self.url}") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise QueryError(f"{params.get('query', '')}: {body}")
        return body["data"]

    def instant(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        data = self._get(
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
        )
        return data["result"]

    def series_labels(self, match: str, label: str) -> list[str]:
        data = self._get(f"/api/v1/label/{urllib.parse.quote(label)}/values", {"match[]": match})
        return sorted(data)


@dataclass
class Result:
    """What one target returned: its series (labels and points) and the legend check."""

    target: Target
    query: str
    series: list[dict[str, Any]]
    error: str | None = None

    @property
    def missing_legend_labels(self) -> list[tuple[dict[str, str], list[str]]]:
        out = []
        for s in self.series:
            missing = [k for k in self.target.legend_labels if not s["metric"].get(k)]
            if missing:
                out.append((s["metric"], missing))
        return out

    def legend(self, metric: Mapping[str, str]) -> str:
        if not self.target.legend:
            name = metric.get("__name__", "")
            rest = ", ".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__")
            return f"{name}{{{rest}}}" if rest else (name or self.query)
        return _LEGEND_LABEL.sub(lambda m: str(metric.get(m.group(1), "")), self.target.legend)


def run(
    prom: Prometheus,
    uid: str,
    dashboard: Mapping[str, Any],
    values: Values,
    *,
    end: float | None = None,
) -> list[Result]:
    """Every panel target of the dashboard, run as Grafana runs it."""
    end = time.time() if end is None else end
    out = []
    for t in targets(uid, dashboard):
        query = interpolate(t.expr, dashboard, values)
        try:
            if t.instant:
                series = prom.instant(query, at=end)
            else:
                series = prom.range(query, end - values.range_s, end, values.step_s)
            out.append(Result(t, query, series))
        except QueryError as exc:
            out.append(Result(t, query, [], error=str(exc)))
    return out
