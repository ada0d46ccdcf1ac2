"""Panel and variable builders on grafana-foundation-sdk, with the product's conventions: every
panel and variable queries the ``datasource`` variable (a fixed UID by default), legends name the
host, thresholds come from the rule pack, and panels are laid out in rows of a 24-column grid."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grafana_foundation_sdk.builders import (
    bargauge,
    heatmap,
    prometheus,
    stat,
    statetimeline,
    table,
    timeseries,
)
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm

from deployer.monitoring.dashboards.scope import Scope

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
GREEN, ORANGE, RED = "green", "orange", "red"


@dataclass(frozen=True)
class Query:
    """One PromQL target of a panel: its legend names the labels it must carry."""

    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False


def target(q: Query, ref: str) -> prometheus.Dataquery:
    t = prometheus.Dataquery().expr(q.expr).ref_id(ref).datasource(DATASOURCE)
    if q.legend:
        t = t.legend_format(q.legend)
    t = t.instant() if q.instant else t.range()
    if q.table:
        t = t.format(pm.PromQueryFormat.TABLE)
    return t


def thresholds(*steps: tuple[float | None, str]) -> db.ThresholdsConfig:
    return (
        db.ThresholdsConfig()
        .mode(dm.ThresholdsMode.ABSOLUTE)
        .steps([dm.Threshold(value=v, color=c) for v, c in steps])
    )


def red_lines(warning: float | None, critical: float) -> db.ThresholdsConfig:
    """Green below the alert's threshold, red from it (orange from the warning, if any)."""
    steps: list[tuple[float | None, str]] = [(None, GREEN)]
    if warning is not None:
        steps.append((warning, ORANGE))
    steps.append((critical, RED))
    return thresholds(*steps)


def _with_targets(panel: Any, queries: Sequence[Query]) -> Any:
    for i, q in enumerate(queries):
        panel = panel.with_target(target(q, chr(ord("A") + i)))
    return panel


def timeseries_panel(
    title: str,
    queries: Sequence[Query],
    *,
    unit: str = "short",
    description: str = "",
    limits: db.ThresholdsConfig | None = None,
    min_value: float | None = None,
    max_value: float | None = None,
    dashed: Sequence[str] = (),
) -> timeseries.Panel:
    """A time series; ``limits`` draws the alert thresholds as lines on the graph. The series
    named in ``dashed`` (display names) are drawn as red dashed lines (a threshold computed per
    host)."""
    p = (
        timeseries.Panel()
        .title(title)
        .datasource(DATASOURCE)
        .unit(unit)
        .line_width(1)
        .fill_opacity(0)
        .span_nulls(False)
        .show_points(common.VisibilityMode.NEVER)
        .legend(
            cb.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.RIGHT)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
        .tooltip(
            cb.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
    )
    if description:
        p = p.description(description)
    if min_value is not None:
        p = p.min(min_value)
    if max_value is not None:
        p = p.max(max_value)
    if limits is not None:
        p = p.thresholds(limits).thresholds_style(
            cb.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.LINE)
        )
    if dashed:
        # byNames (options an object, as Grafana's published schema types a matcher's options;
        # byRegexp's string would not validate): the display names, from the inventory's hosts.
        p = p.with_override(
            dm.MatcherConfig(
                id_val="byNames",
                options={"mode": "include", "names": list(dashed), "prefix": "", "readOnly": True},
            ),
            [
                dm.DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": RED}),
                dm.DynamicConfigValue(
                    id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}
                ),
            ],
        )
    return _with_targets(p, queries)


def stat_panel(
    title: str,
    queries: Sequence[Query],
    *,
    unit: str = "short",
    description: str = "",
    limits: db.ThresholdsConfig | None = None,
    no_value: str | None = None,
) -> stat.Panel:
    p = (
        stat.Panel()
        .title(title)
        .datasource(DATASOURCE)
        .unit(unit)
        .graph_mode(common.BigValueGraphMode.AREA)
        .color_mode(common.BigValueColorMode.VALUE)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(limits or thresholds((None, GREEN)))
    )
    if description:
        p = p.description(description)
    if no_value is not None:
        p = p.no_value(no_value)
    return _with_targets(p, queries)


def bargauge_panel(
    title: str,
    queries: Sequence[Query],
    *,
    unit: str = "short",
    description: str = "",
    limits: db.ThresholdsConfig | None = None,
    min_value: float | None = None,
    max_value: float | None = None,
) -> bargauge.Panel:
    p = (
        bargauge.Panel()
        .title(title)
        .datasource(DATASOURCE)
        .unit(unit)
        .display_mode(common.BarGaugeDisplayMode.GRADIENT)
        .orientation(common.VizOrientation.HORIZONTAL)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(limits or thresholds((None, GREEN)))
    )
    if description:
        p = p.description(description)
    if min_value is not None:
        p = p.min(min_value)
    if max_value is not None:
        p = p.max(max_value)
    return _with_targets(p, queries)


def table_panel(
    title: str,
    queries: Sequence[Query],
    *,
    description: str = "",
    hide: Sequence[str] = ("Time", "__name__", "job"),
) -> table.Panel:
    """Instant queries shown as one table (the queries' frames merged on their labels)."""
    p = (
        table.Panel()
        .title(title)
        .datasource(DATASOURCE)
        .cell_height(common.TableCellHeight.SM)
        .align(common.FieldTextAlignment.AUTO)
        .inspect(False)
    )
    if description:
        p = p.description(description)
    p = p.with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
    p = p.with_transformation(
        dm.DataTransformerConfig(
            id_val="organize", options={"excludeByName": {name: True for name in hide}}
        )
    )
    return _with_targets(p, queries)


def state_timeline_panel(
    title: str,
    queries: Sequence[Query],
    *,
    states: Sequence[tuple[float, str, str]],
    description: str = "",
) -> statetimeline.Panel:
    """A state timeline; ``states`` maps values to (text, color)."""
    p = (
        statetimeline.Panel()
        .title(title)
        .datasource(DATASOURCE)
        .show_value(common.VisibilityMode.NEVER)
        .merge_values(True)
        .row_height(0.8)
        .fill_opacity(80)
        .mappings(
            [
                dm.ValueMap(
                    options={
                        _num_key(v): dm.ValueMappingResult(text=text, color=color, index=i)
                        for i, (v, text, color) in enumerate(states)
                    }
                )
            ]
        )
        .thresholds(thresholds((None, GREEN)))
        .legend(
            cb.VizLegendOptions()
            .show_legend(False)
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
        )
    )
    if description:
        p = p.description(description)
    return _with_targets(p, queries)


def _num_key(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def heatmap_panel(
    title: str, queries: Sequence[Query], *, unit: str, description: str = "", bucket: float
) -> heatmap.Panel:
    """The distribution of the queries' series over time: each cell counts the series whose
    value falls in its bucket (``bucket`` wide) at that time."""
    p = (
        heatmap.Panel()
        .title(title)
        .datasource(DATASOURCE)
        .calculate(True)
        .calculation(
            cb.HeatmapCalculationOptions().y_buckets(
                cb.HeatmapCalculationBucketConfig()
                .mode(common.HeatmapCalculationMode.SIZE)
                .value(_num_key(bucket))
            )
        )
        .color(
            heatmap.HeatmapColorOptions()
            .mode(hm.HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .fill("dark-orange")
            .scale(hm.HeatmapColorScale.EXPONENTIAL)
            .exponent(0.5)
            .steps(64)
            .reverse(False)
        )
        .y_axis(heatmap.YAxisConfig().unit(unit).axis_placement(common.AxisPlacement.LEFT))
        .cell_gap(1)
        .show_legend()
        .mode(common.TooltipDisplayMode.SINGLE)
    )
    if description:
        p = p.description(description)
    return _with_targets(p, queries)


# ---- variables --------------------------------------------------------------------------


def datasource_variable(scope: Scope) -> db.DatasourceVariable:
    default = next((d for d in scope.datasources if d.uid == scope.default_datasource), None)
    text = default.name if default else scope.default_datasource
    return (
        db.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        .regex("/^gpumon /")
        .current(dm.VariableOption(selected=True, text=text, value=scope.default_datasource))
    )


def query_variable(
    name: str,
    label: str,
    query: str,
    *,
    multi: bool = True,
    include_all: bool = True,
) -> db.QueryVariable:
    """A variable over a label's values; "All" is ``.*`` so that series lacking the label (a
    replica's own series without the inventory's cluster) still match."""
    v = (
        db.QueryVariable(name)
        .label(label)
        .query(query)
        .datasource(DATASOURCE)
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(multi)
        .include_all(include_all)
    )
    if include_all:
        v = v.all_value(".*").current(dm.VariableOption(selected=True, text="All", value="$__all"))
    return v


# ---- layout -----------------------------------------------------------------------------


@dataclass
class Layout:
    """Panels placed left to right in rows of the 24-column grid, in the order added; ids are
    the order too, so the same dashboard gets the same ids on every generation."""

    panels: list[tuple[str | None, Builder[Any], int, int]] = field(default_factory=list)

    def row(self, title: str) -> None:
        self.panels.append((title, db.Row(title), 24, 1))

    def add(self, panel: Builder[Any], width: int = 12, height: int = 8) -> None:
        self.panels.append((None, panel, width, height))

    def apply(self, dash: db.Dashboard) -> db.Dashboard:
        x = y = row_h = 0
        for pid, (row_title, panel, w, h) in enumerate(self.panels, start=1):
            if row_title is not None or x + w > 24:
                y += row_h
                x = row_h = 0
            pos = dm.GridPos(h=h, w=w, x=x, y=y)
            built = panel.grid_pos(pos).id(pid)
            dash = dash.with_row(built) if row_title is not None else dash.with_panel(built)
            x += w
            row_h = max(row_h, h)
            if row_title is not None:
                y += h
                x = row_h = 0
        return dash
