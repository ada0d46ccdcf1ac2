"""Draw every panel of every generated dashboard from real query results, without Grafana.

    python -m deployer.monitoring.dashboards.render -i INVENTORY --prometheus URL --out DIR

runs each panel's queries as Grafana would (``proof.py``: the variables set to "All", or to the
values given with ``--var name=value``; the node drill-down on one host) against a real
Prometheus API (a replica, VictoriaMetrics or Thanos Query), and writes, per dashboard, one PNG
per panel (``DIR/<uid>/<NN>-<title>.png``), the whole dashboard laid out as Grafana lays it out
(``DIR/<uid>.png``) and ``DIR/summary.json`` (each query as sent, its series and the legend
labels missing from any of them). Drawn with matplotlib, in Grafana's spirit rather than pixel
for pixel: time series with the alert thresholds as lines, stats, bar gauges, tables, state
timelines and the utilization heatmap.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC
from pathlib import Path
from typing import Any

from deployer.monitoring.dashboards.proof import Prometheus, Result, Values, run

PALETTE = [
    "#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1", "#BA43A9", "#705DA0",
    "#508642", "#CCA300", "#447EBC", "#C15C17", "#890F02", "#0A437C", "#6D1F62", "#584477",
]  # fmt: skip
COLORS = {"green": "#73BF69", "orange": "#FF9830", "red": "#F2495C", "blue": "#5794F2"}
BACKGROUND, PANEL, TEXT, GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"


def _color(name: str) -> str:
    return COLORS.get(name, name)


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:60]


def _points(series: Mapping[str, Any]) -> tuple[list[float], list[float]]:
    pairs = series.get("values") or ([series["value"]] if "value" in series else [])
    xs, ys = [], []
    for t, v in pairs:
        try:
            y = float(v)
        except ValueError:
            continue
        xs.append(float(t))
        ys.append(y)
    return xs, ys


def _last(series: Mapping[str, Any]) -> float | None:
    _, ys = _points(series)
    return ys[-1] if ys else None


def _steps(panel: Mapping[str, Any]) -> list[tuple[float | None, str]]:
    t = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {})
    return [(s.get("value"), s.get("color", "green")) for s in t.get("steps", [])]


def _threshold_color(panel: Mapping[str, Any], value: float | None) -> str:
    color = "green"
    for v, c in _steps(panel):
        if v is None or (value is not None and value >= v):
            color = c
    return _color(color)


def _dashed(panel: Mapping[str, Any]) -> set[str]:
    out: set[str] = set()
    for o in panel.get("fieldConfig", {}).get("overrides", []):
        if o.get("matcher", {}).get("id") == "byNames":
            out.update(o["matcher"].get("options", {}).get("names", []))
    return out


def _unit_label(panel: Mapping[str, Any]) -> str:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
    return {
        "percent": "%", "percentunit": "ratio", "celsius": "°C", "watt": "W", "bytes": "bytes",
        "rotmhz": "MHz", "cps": "/s",
    }.get(unit, "" if unit == "short" else unit)  # fmt: skip


def _style(ax: Any, title: str) -> None:
    ax.set_facecolor(PANEL)
    ax.set_title(title, color=TEXT, fontsize=9, loc="left")
    ax.tick_params(colors=TEXT, labelsize=7)
    for s in ax.spines.values():
        s.set_color(GRID)


def _message(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, color=TEXT, ha="center", va="center", fontsize=9,
            transform=ax.transAxes, wrap=True)  # fmt: skip
    ax.set_xticks([])
    ax.set_yticks([])


def _series(results: Sequence[Result]) -> list[tuple[str, Mapping[str, Any]]]:
    return [(r.legend(s["metric"]), s) for r in results for s in r.series]


def _timeseries(ax: Any, panel: Mapping[str, Any], results: Sequence[Result]) -> None:
    from datetime import datetime

    import matplotlib.dates as mdates

    rows = _series(results)
    if not rows:
        return _message(ax, "No data")
    dashed = _dashed(panel)
    for i, (name, s) in enumerate(sorted(rows, key=lambda r: r[0])):
        xs, ys = _points(s)
        when = [datetime.fromtimestamp(x, UTC) for x in xs]
        if name in dashed:
            ax.plot(when, ys, color=COLORS["red"], linestyle="--", linewidth=1, label=name)
        else:
            ax.plot(when, ys, color=PALETTE[i % len(PALETTE)], linewidth=1, label=name)
    custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
    if custom.get("thresholdsStyle", {}).get("mode") == "line":
        for v, c in _steps(panel):
            if v is not None:
                ax.axhline(v, color=_color(c), linewidth=1.2, linestyle="-")
    d = panel.get("fieldConfig", {}).get("defaults", {})
    low, high = ax.get_ylim()
    if "min" in d:
        low = d["min"]
    if "max" in d:
        high = d["max"]
    # a little room under the floor: a line at 0 (an idle GPU) stays visible above the axis
    ax.set_ylim(low - 0.03 * ((high - low) or 1), high)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))
    ax.grid(color=GRID, linewidth=0.5)
    ax.set_ylabel(_unit_label(panel), color=TEXT, fontsize=7)
    handles, labels = ax.get_legend_handles_labels()
    if len(labels) > 12:
        handles, labels = handles[:12], [*labels[:11], f"... {len(labels) - 11} more"]
    leg = ax.legend(handles, labels, fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0),
                    frameon=False)  # fmt: skip
    for t in leg.get_texts():
        t.set_color(TEXT)


def _stat(ax: Any, panel: Mapping[str, Any], results: Sequence[Result]) -> None:
    rows = _series(results)
    if not rows:
        return _message(ax, "No data")
    ax.set_xticks([])
    ax.set_yticks([])
    n = len(rows)
    for i, (name, s) in enumerate(rows):
        value = _last(s)
        text = "No data" if value is None else f"{value:g}"
        x = (i + 0.5) / n
        ax.text(x, 0.45, text, color=_threshold_color(panel, value), ha="center", va="center",
                fontsize=26 if n == 1 else 16, fontweight="bold", transform=ax.transAxes)  # fmt: skip
        if n > 1 or results[0].target.legend:
            ax.text(x, 0.12, name, color=TEXT, ha="center", fontsize=7, transform=ax.transAxes)


def _bargauge(ax: Any, panel: Mapping[str, Any], results: Sequence[Result]) -> None:
    rows = [(n, _last(s)) for n, s in _series(results)]
    rows = [(n, v) for n, v in rows if v is not None]
    if not rows:
        return _message(ax, "No data")
    rows.sort(key=lambda r: r[0])
    d = panel.get("fieldConfig", {}).get("defaults", {})
    names = [n for n, _ in rows]
    values = [v for _, v in rows]
    ax.barh(range(len(names)), values, color=[_threshold_color(panel, v) for v in values],
            height=0.5)  # fmt: skip
    ax.set_xlim(d.get("min", 0), d.get("max", max(values) * 1.1 or 1))
    ax.set_yticks([])
    ax.invert_yaxis()
    for i, (name, v) in enumerate(rows):
        ax.text(0, i - 0.3, name, color=TEXT, va="bottom", fontsize=7)
        ax.text(ax.get_xlim()[1], i, f"{v:.3g} ", color=TEXT, va="center", ha="right", fontsize=7)
    ax.grid(color=GRID, linewidth=0.5, axis="x")


def _table(ax: Any, panel: Mapping[str, Any], results: Sequence[Result]) -> None:
    hidden = set(
        next(
            (t["options"].get("excludeByName", {}) for t in panel.get("transformations", [])
             if t.get("id") == "organize"),
            {},
        )
    )  # fmt: skip
    merged: dict[tuple, dict[str, str]] = {}
    columns: list[str] = []
    for r in results:
        col = f"Value #{r.target.ref}" if len(results) > 1 else "Value"
        for s in r.series:
            labels = {k: v for k, v in s["metric"].items() if k not in hidden}
            key = tuple(sorted(labels.items()))
            row = merged.setdefault(key, dict(labels))
            v = _last(s)
            row[col] = "" if v is None else _number(v)
            for k in [*labels, col]:
                if k not in columns:
                    columns.append(k)
    columns = [c for c in columns if c not in hidden]
    if not merged:
        return _message(ax, "No data")
    ax.set_xticks([])
    ax.set_yticks([])
    body = [[row.get(c, "") for c in columns] for row in list(merged.values())[:14]]
    tbl = ax.table(cellText=body, colLabels=columns, loc="upper center", cellLoc="left")
    tbl.auto_set_font_size(False)
    tbl.set_fontsize(6)
    for cell in tbl.get_celld().values():
        cell.set_facecolor(PANEL)
        cell.set_edgecolor(GRID)
        cell.get_text().set_color(TEXT)
    if len(merged) > 14:
        ax.text(0.99, 0.01, f"{len(merged) - 14} more rows", color=TEXT, fontsize=6,
                ha="right", transform=ax.transAxes)  # fmt: skip


def _number(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1e4 else f"{v:.4g}"


def _mapping(panel: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for m in panel.get("fieldConfig", {}).get("defaults", {}).get("mappings", []):
        for k, res in m.get("options", {}).items():
            out[k] = (res.get("text", k), _color(res.get("color", "green")))
    return out


def _state_timeline(
    ax: Any, panel: Mapping[str, Any], results: Sequence[Result], span: tuple[float, float]
) -> None:
    rows = sorted(_series(results), key=lambda r: r[0])
    if not rows:
        return _message(ax, "No data (nothing in that state)")
    states = _mapping(panel)
    shown = rows[:20]
    for i, (_name, s) in enumerate(shown):
        xs, ys = _points(s)
        for j, (x, y) in enumerate(zip(xs, ys, strict=True)):
            end = xs[j + 1] if j + 1 < len(xs) else x + 30
            key = str(int(y)) if float(y).is_integer() else str(y)
            color = states.get(key, ("", "#808080"))[1]
            ax.barh(i, end - x, left=x, height=0.8, color=color, linewidth=0)
    ax.set_yticks(range(len(shown)), [n for n, _ in shown], fontsize=6)
    ax.set_xlim(*span)
    ax.invert_yaxis()
    ticks = [span[0] + (span[1] - span[0]) * k / 4 for k in range(5)]
    ax.set_xticks(ticks, [time.strftime("%H:%M", time.gmtime(t)) for t in ticks])
    legend = "  ".join(f"{text}" for text, _ in states.values())
    if len(rows) > len(shown):
        legend += f"   ({len(rows) - len(shown)} more rows)"
    ax.text(0.0, -0.18, legend, color=TEXT, fontsize=6, transform=ax.transAxes)


def _heatmap(ax: Any, panel: Mapping[str, Any], results: Sequence[Result]) -> None:
    import numpy as np

    rows = _series(results)
    if not rows:
        return _message(ax, "No data")
    calc = panel.get("options", {}).get("calculation", {}).get("yBuckets", {})
    size = float(calc.get("value") or 10)
    times = sorted({x for _, s in rows for x in _points(s)[0]})
    index = {t: i for i, t in enumerate(times)}
    top = max(100.0, max((max(_points(s)[1] or [0]) for _, s in rows), default=0))
    nb = int(np.ceil(top / size))
    grid = np.zeros((nb, len(times)))
    for _, s in rows:
        for x, y in zip(*_points(s), strict=True):
            grid[min(int(y // size), nb - 1), index[x]] += 1
    masked = np.ma.masked_equal(grid, 0)  # an empty bucket is background, as in Grafana
    ax.imshow(masked, aspect="auto", origin="lower", cmap="Oranges", vmin=0,
              extent=(0, len(times), 0, nb * size))  # fmt: skip
    ticks = [0, len(times) // 2, max(len(times) - 1, 0)]
    ax.set_xticks(ticks, [time.strftime("%H:%M", time.gmtime(times[t])) for t in ticks])
    ax.set_ylabel(_unit_label(panel) + f" (buckets of {size:g}; cells: GPUs)", color=TEXT,
                  fontsize=7)  # fmt: skip


def draw(
    ax: Any, panel: Mapping[str, Any], results: Sequence[Result], span: tuple[float, float]
) -> None:
    _style(ax, panel.get("title", ""))
    errors = [r.error for r in results if r.error]
    if errors:
        return _message(ax, "Query error:\n" + errors[0][:200])
    kind = panel.get("type")
    if kind == "timeseries":
        _timeseries(ax, panel, results)
    elif kind == "stat":
        _stat(ax, panel, results)
    elif kind == "bargauge":
        _bargauge(ax, panel, results)
    elif kind == "table":
        _table(ax, panel, results)
    elif kind == "state-timeline":
        _state_timeline(ax, panel, results, span)
    elif kind == "heatmap":
        _heatmap(ax, panel, results)
    else:
        _message(ax, f"panel type {kind}")


def render_dashboard(
    uid: str,
    dashboard: Mapping[str, Any],
    results: Sequence[Result],
    out: Path,
    span: tuple[float, float],
) -> list[Path]:
    """One PNG per panel and one of the whole dashboard; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_panel: dict[str, list[Result]] = {}
    for r in results:
        by_panel.setdefault(r.target.panel, []).append(r)
    panels = [p for p in dashboard.get("panels", []) if p.get("type") != "row"]
    written: list[Path] = []
    (out / uid).mkdir(parents=True, exist_ok=True)
    for n, panel in enumerate(panels, start=1):
        g = panel["gridPos"]
        fig = plt.figure(figsize=(max(g["w"] / 2, 6), max(g["h"] / 2, 2.5)), facecolor=BACKGROUND)
        left = 0.22 if panel["type"] == "state-timeline" else 0.08
        width = 0.62 if panel["type"] == "timeseries" else 0.96 - left
        ax = fig.add_axes((left, 0.14, width, 0.74))
        draw(ax, panel, by_panel.get(panel["title"], []), span)
        path = out / uid / f"{n:02d}-{_slug(panel['title'])}.png"
        fig.savefig(path, dpi=100, facecolor=BACKGROUND)
        plt.close(fig)
        written.append(path)
    # the whole dashboard, on Grafana's grid (24 columns, rows of 30 px)
    top = 2  # grid rows above the panels for the dashboard's title
    height = top + max(
        (p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"]), default=1
    )
    fig = plt.figure(figsize=(24, height * 0.45), facecolor=BACKGROUND)
    fig.text(0.005, 1 - 0.8 / height, f"{dashboard.get('title', uid)}  (uid {uid})", color=TEXT,
             fontsize=16)  # fmt: skip
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        if panel.get("type") == "row":
            fig.text(g["x"] / 24 + 0.005, 1 - (top + g["y"] + 0.7) / height, panel.get("title", ""),
                     color=TEXT, fontsize=11, fontweight="bold")  # fmt: skip
            continue
        # room on the left for a state timeline's row names
        inset = g["w"] / 24 * 0.12 if panel["type"] == "state-timeline" else 0.0
        left = g["x"] / 24 + 0.03 + inset
        bottom = 1 - (top + g["y"] + g["h"]) / height + 0.35 / height
        width = g["w"] / 24 * (0.72 if panel["type"] == "timeseries" else 0.93) - 0.02 - inset
        ax = fig.add_axes((left, bottom, width, (g["h"] - 1.1) / height))
        draw(ax, panel, by_panel.get(panel["title"], []), span)
    path = out / f"{uid}.png"
    fig.savefig(path, dpi=60, facecolor=BACKGROUND)
    plt.close(fig)
    written.append(path)
    return written


def summary(results: Sequence[Result]) -> list[dict[str, Any]]:
    return [
        {
            "dashboard": r.target.dashboard,
            "panel": r.target.panel,
            "type": r.target.panel_type,
            "ref": r.target.ref,
            "query": r.query,
            "legend_labels": list(r.target.legend_labels),
            "series": len(r.series),
            "missing_legend_labels": [m for _, m in r.missing_legend_labels],
            "error": r.error,
        }
        for r in results
    ]


def render_all(
    dashboards: Mapping[str, Mapping[str, Any]],
    prom: Prometheus,
    out: Path,
    values_for: Mapping[str, Values],
    *,
    end: float | None = None,
) -> dict[str, list[Result]]:
    """Query and draw every dashboard; ``values_for[uid]`` sets its variables."""
    end = time.time() if end is None else end
    out.mkdir(parents=True, exist_ok=True)
    all_results: dict[str, list[Result]] = {}
    for uid, dash in dashboards.items():
        values = values_for[uid]
        results = run(prom, uid, dash, values, end=end)
        render_dashboard(uid, dash, results, out, (end - values.range_s, end))
        all_results[uid] = results
    rows = [row for rs in all_results.values() for row in summary(rs)]
    (out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    return all_results


def default_values(
    dashboards: Mapping[str, Mapping[str, Any]],
    datasource: str,
    scrape_interval_s: float,
    overrides: Mapping[str, list[str]],
    range_s: float,
    node: str | None,
    mig_node: str | None,
) -> dict[str, Values]:
    """ "All" for every variable, one host on the drill-down (and the MIG host on MIG)."""
    out = {}
    for uid in dashboards:
        chosen: dict[str, list[str] | None] = dict(overrides)
        if uid == "gpumon-node" and "node" not in chosen and node:
            chosen["node"] = [node]
        if uid == "gpumon-mig" and "node" not in chosen and mig_node:
            chosen["node"] = [mig_node]
        out[uid] = Values(chosen, datasource, scrape_interval_s, step_s=max(range_s / 240, 15),
                          range_s=range_s)  # fmt: skip
    return out


def _parse_duration(text: str) -> float:
    m = re.fullmatch(r"(\d+)([smhd])", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration like 30m or 6h: {text!r}")
    return int(m[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]]


def main(argv: Sequence[str] | None = None) -> int:
    from deployer.monitoring.dashboards.of_inventory import for_inventory

    ap = argparse.ArgumentParser(
        prog="python -m deployer.monitoring.dashboards.render", description=__doc__.split("\n")[0]
    )
    ap.add_argument("-i", "--inventory", required=True, type=Path)
    ap.add_argument("-e", "--extra-vars", action="append", default=[])
    ap.add_argument("--prometheus", help="Prometheus API URL (default: the dashboards' default "
                    "datasource: the global view, else the first replica)")  # fmt: skip
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--range", default="1h", type=_parse_duration, help="time range (1h)")
    ap.add_argument("--var", action="append", default=[], help="NAME=VALUE[,VALUE...]")
    args = ap.parse_args(argv)
    scope, dashboards = for_inventory(args.inventory, args.extra_vars)
    url = args.prometheus or next(
        (d.url for d in scope.datasources if d.uid == scope.default_datasource), None
    )
    if not url:
        print("no Prometheus URL: give --prometheus", file=sys.stderr)
        return 2
    overrides: dict[str, list[str]] = {}
    for item in args.var:
        name, _, value = item.partition("=")
        overrides[name] = value.split(",")
    values = default_values(
        dashboards,
        scope.default_datasource,
        _parse_duration(scope.rules.scrape_interval),
        overrides,
        args.range,
        scope.fleet.gpu_hosts[0] if scope.fleet.gpu_hosts else None,
        scope.fleet.mig_hosts[0] if scope.fleet.mig_hosts else None,
    )
    results = render_all(dashboards, Prometheus(url), args.out, values)
    bad = [
        (r.target.dashboard, r.target.panel, r.error or r.missing_legend_labels)
        for rs in results.values()
        for r in rs
        if r.error or r.missing_legend_labels
    ]
    for row in bad:
        print("problem:", *row, file=sys.stderr)
    n = sum(len(rs) for rs in results.values())
    print(f"{len(dashboards)} dashboards, {n} queries against {url}: PNGs in {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
