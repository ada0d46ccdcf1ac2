"""Node / GPU drill-down: every GPU of one host, its clocks, power against its limit, die and
HBM temperatures, NVLink and PCIe health, framebuffer used."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from deployer import dcgm_fields
from deployer.monitoring.dashboards.common import TAGS, alert_annotations, gpu_variables
from deployer.monitoring.dashboards.panels import (
    GREEN,
    ORANGE,
    RED,
    Layout,
    Query,
    bargauge_panel,
    red_lines,
    table_panel,
    thresholds,
    timeseries_panel,
)
from deployer.monitoring.dashboards.promql import (
    GPU_LEGEND,
    GPU_MEMORY_FREE,
    GPU_MEMORY_TEMP,
    GPU_MEMORY_USED,
    GPU_UTIL,
    Queries,
    m,
)

UID = "gpumon-node"


def build(q: Queries) -> db.Dashboard:
    r = q.scope.rules
    lay = Layout()
    lay.row("The host's GPUs")
    info = "UUID, modelName, pci_bus_id"
    lay.add(
        table_panel(
            "GPUs of the host",
            [
                Query(
                    f"max by (node, gpu, {info}) ({q.per_gpu('gpu_temp')})",
                    instant=True,
                    table=True,
                ),
                Query(
                    f"max by (node, gpu, {info}) ({q.recorded(GPU_UTIL)})",
                    instant=True,
                    table=True,
                ),
                Query(
                    f"max by (node, gpu, {info}) ({q.per_gpu('power_usage')})",
                    instant=True,
                    table=True,
                ),
            ],
            hide=("Time",),
            description="Value #A: die temperature (°C), #B: utilization (%), #C: power (W).",
        ),
        width=24,
        height=7,
    )
    lay.add(
        timeseries_panel(
            "GPU utilization",
            [Query(q.recorded(GPU_UTIL), legend=GPU_LEGEND)],
            unit="percent",
            min_value=0,
            max_value=100,
        )
    )
    lay.add(
        timeseries_panel(
            "SM and memory clocks",
            [
                Query(q.per_gpu("sm_clock"), legend=GPU_LEGEND + " SM"),
                Query(q.per_gpu("mem_clock"), legend=GPU_LEGEND + " memory"),
            ],
            unit="rotmhz",
        )
    )
    power = [Query(q.per_gpu("power_usage"), legend=GPU_LEGEND)]
    dashed: list[str] = []
    if "power_limit" in dcgm_fields.FIELDS_BY_KEY:
        # The board limit is the same for a host's GPUs of one model: one line per host.
        power.append(
            Query(f"max by (cluster, node) ({q.per_gpu('power_limit')})", legend="{{node}} limit")
        )
        dashed = [f"{h} limit" for h in q.scope.fleet.gpu_hosts]
    lay.add(
        timeseries_panel(
            "Power vs limit",
            power,
            unit="watt",
            min_value=0,
            dashed=dashed,
            description="Board power draw and the power management limit (dashed); at the "
            "limit the clocks are capped (SW power cap).",
        )
    )
    lay.add(
        timeseries_panel(
            "Die and HBM temperature",
            [
                Query(q.per_gpu("gpu_temp"), legend=GPU_LEGEND + " die"),
                Query(q.recorded(GPU_MEMORY_TEMP), legend=GPU_LEGEND + " HBM"),
            ],
            unit="celsius",
            limits=red_lines(r.gpu_temp_warning, r.gpu_temp_critical),
            description=f"Red line: GPUTemperatureCritical ({r.gpu_temp_critical:g} °C); the "
            f"HBM alert's threshold is on the operations dashboard.",
        )
    )
    lay.row("Memory")
    lay.add(
        timeseries_panel(
            "Framebuffer memory used",
            [Query(f"{q.recorded(GPU_MEMORY_USED)} * 1048576", legend=GPU_LEGEND)],
            unit="bytes",
            min_value=0,
        )
    )
    lay.add(
        bargauge_panel(
            "Framebuffer memory used, share",
            [
                Query(
                    f"{q.recorded(GPU_MEMORY_USED)} / ({q.recorded(GPU_MEMORY_USED)} + "
                    f"{q.recorded(GPU_MEMORY_FREE)})",
                    legend=GPU_LEGEND,
                    instant=True,
                )
            ],
            unit="percentunit",
            min_value=0,
            max_value=1,
            limits=thresholds((None, GREEN), (0.9, ORANGE), (0.95, RED)),
        )
    )
    lay.row("Interconnect")
    lay.add(
        timeseries_panel(
            "NVLink throughput",
            [Query(q.rate("nvlink_bandwidth_total"), legend=GPU_LEGEND)],
            unit="cps",
            min_value=0,
            description="Rate of DCGM's NVLink bandwidth counter, all lanes (no NVLink: no "
            "series).",
        ),
        width=8,
    )
    lay.add(
        timeseries_panel(
            "NVLink errors",
            [
                Query(
                    f"{q.rate('nvlink_crc_flit_errors', r.nvlink_crc_rate_window)}",
                    legend=GPU_LEGEND + " CRC flit/s",
                ),
                Query(
                    f"increase({m('nvlink_replay_errors')}{{{q.gpu()}}}[{r.nvlink_error_window}])",
                    legend=GPU_LEGEND + " replays",
                ),
                Query(
                    f"increase({m('nvlink_recovery_errors')}{{{q.gpu()}}}[{r.nvlink_error_window}])",
                    legend=GPU_LEGEND + " recoveries",
                ),
            ],
            limits=red_lines(None, r.nvlink_crc_per_second),
            min_value=0,
            description=f"GPUNVLinkCRCErrorFlood fires at {r.nvlink_crc_per_second:g} CRC "
            "errors/s (red line); any replay or recovery error alerts.",
        ),
        width=8,
    )
    lay.add(
        timeseries_panel(
            "PCIe replays per minute",
            [
                Query(
                    f"{q.rate('pcie_replay', r.pcie_replay_window)} * 60",
                    legend=GPU_LEGEND,
                ),
                Query(q.pcie_threshold_series(), legend="{{node}} alert threshold"),
            ],
            min_value=0,
            dashed=[f"{h} alert threshold" for h in q.scope.fleet.gpu_hosts],
            description="GPUPCIeReplayRateHigh fires above the dashed line: "
            f"{r.pcie_replays_per_minute:g}/min by default"
            + "".join(f", {name} {limit:g}/min" for name, limit in r.pcie_replays_by_model)
            + ".",
        ),
        width=8,
    )
    dash = (
        db.Dashboard("GPU node drill-down")
        .uid(UID)
        .description("Every GPU of one host. Generated by gpumon-deploy.")
        .tags([*TAGS, "node"])
        .readonly()
        .time("now-3h", "now")
        .refresh("30s")
        .timezone("browser")
        .variables(gpu_variables(q, node_multi=False))
        .annotations(alert_annotations(q))
    )
    return lay.apply(dash)
