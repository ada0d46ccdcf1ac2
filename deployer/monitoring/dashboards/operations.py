"""Operations (for SREs): the cluster-wide utilization heatmap, die and HBM temperatures with the
alert thresholds, XID / ECC / row-remap counters, throttle reasons, exporter and DCGM health, and
the alerts and silences on the time axis."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from deployer.monitoring.dashboards.common import TAGS, alert_annotations, gpu_variables
from deployer.monitoring.dashboards.panels import (
    GREEN,
    RED,
    Layout,
    Query,
    heatmap_panel,
    red_lines,
    state_timeline_panel,
    timeseries_panel,
)
from deployer.monitoring.dashboards.promql import (
    GPU_LEGEND,
    GPU_MEMORY_TEMP,
    GPU_UTIL,
    Queries,
    m,
)

UID = "gpumon-operations"


def _reason(q: Queries, bits: tuple[int, ...], name: str) -> Query:
    return Query(
        f'label_replace({q.bit_set(bits)}, "reason", "{name}", "", "")',
        legend=GPU_LEGEND + " {{reason}}",
    )


def build(q: Queries) -> db.Dashboard:
    r = q.scope.rules
    lay = Layout()
    lay.row("Utilization")
    lay.add(
        heatmap_panel(
            "GPU utilization across the cluster",
            [Query(q.recorded(GPU_UTIL), legend=GPU_LEGEND)],
            unit="percent",
            bucket=10,
            description="Each cell counts the GPUs whose utilization is in that 10% band at that "
            "time (a GPU in MIG mode: its instances' engine activity weighted by slices).",
        ),
        width=24,
        height=8,
    )
    lay.row("Temperatures")
    lay.add(
        timeseries_panel(
            "GPU die temperature",
            [Query(q.per_gpu("gpu_temp"), legend=GPU_LEGEND)],
            unit="celsius",
            limits=red_lines(r.gpu_temp_warning, r.gpu_temp_critical),
            description=f"GPUTemperatureHigh fires above {r.gpu_temp_warning:g} °C, "
            f"GPUTemperatureCritical above {r.gpu_temp_critical:g} °C.",
        )
    )
    lay.add(
        timeseries_panel(
            "HBM memory temperature",
            [
                Query(q.recorded(GPU_MEMORY_TEMP), legend=GPU_LEGEND),
                Query(
                    f"max by (cluster, node) "
                    f"({m('memory_max_op_temp')}{{{q.gpu()}}} > 0 < {r.ceiling:g}) - {r.memory_temp_margin:g}",
                    legend="{{node}} alert threshold",
                ),
            ],
            unit="celsius",
            limits=red_lines(None, r.memory_temp_critical),
            dashed=[f"{h} alert threshold" for h in q.scope.fleet.gpu_hosts],
            description="Beside the die: HBM can overheat while the core looks normal. "
            "GPUMemoryTemperatureHigh fires at the GPU's own memory limit minus "
            f"{r.memory_temp_margin:g} °C (dashed) or {r.memory_temp_critical:g} °C (red line), "
            "whichever is lower. Boards without a memory sensor report nothing here.",
        )
    )
    lay.row("Errors")
    lay.add(
        timeseries_panel(
            "XID errors (exporter window)",
            [
                Query(
                    f"{q.per_gpu('xid_count')} > 0",
                    legend=GPU_LEGEND + " XID {{xid}}",
                )
            ],
            description=f"{m('xid_count')}: XIDs per GPU in the exporter's window "
            "(-x, 5 min by default); any is a red line.",
            limits=red_lines(None, 1),
        ),
        width=8,
    )
    lay.add(
        timeseries_panel(
            "Double-bit ECC errors (volatile)",
            [
                Query(q.per_gpu("ecc_dbe_volatile"), legend=GPU_LEGEND + " DBE"),
                Query(q.per_gpu("ecc_sbe_volatile"), legend=GPU_LEGEND + " SBE"),
            ],
            limits=red_lines(None, r.ecc_dbe_threshold + 1),
            description=f"GPUDoubleBitECCError fires above {r.ecc_dbe_threshold:g} DBE.",
        ),
        width=8,
    )
    lay.add(
        timeseries_panel(
            "Remapped rows and retired pages",
            [
                Query(
                    q.per_gpu("uncorrectable_remapped_rows"),
                    legend=GPU_LEGEND + " uncorrectable rows",
                ),
                Query(
                    q.per_gpu("correctable_remapped_rows"), legend=GPU_LEGEND + " correctable rows"
                ),
                Query(
                    f"{q.per_gpu('retired_dbe')} + {q.per_gpu('retired_sbe')}",
                    legend=GPU_LEGEND + " retired pages",
                ),
            ],
            limits=red_lines(None, r.uncorrectable_remapped_rows),
            description="GPUUncorrectableRemappedRowsHigh fires at "
            f"{r.uncorrectable_remapped_rows:g} rows (red line); GPURetiredPagesHigh at "
            f"{r.retired_pages:g} retired pages (pre-Ampere boards).",
        ),
        width=8,
    )
    lay.add(
        state_timeline_panel(
            "Row remapping",
            [
                Query(q.per_gpu("row_remap_failure"), legend=GPU_LEGEND + " failure"),
                Query(q.per_gpu("row_remap_pending"), legend=GPU_LEGEND + " pending"),
            ],
            states=((0, "ok", GREEN), (1, "YES", RED)),
            description="GPURowRemapFailure fires on a failure (XID 64: reset the GPU).",
        ),
        width=24,
        height=10,
    )
    lay.row("Throttling")
    lay.add(
        state_timeline_panel(
            "Clock-event (throttle) reasons",
            [
                _reason(q, r.throttle_thermal_bits, "thermal"),
                _reason(q, r.throttle_power_bits, "power brake"),
                _reason(q, r.hw_slowdown_bits, "HW slowdown"),
                _reason(q, (2,), "SW power cap"),
            ],
            states=((1, "throttled", RED),),
            description="Only GPUs with a reason set are shown (field 112 bits: thermal "
            f"{list(r.throttle_thermal_bits)}, power brake {list(r.throttle_power_bits)}, HW "
            f"slowdown {list(r.hw_slowdown_bits)}, SW power cap [2], which is normal under "
            "load).",
        )
    )
    lay.add(
        timeseries_panel(
            "Time throttled",
            [
                Query(f"{q.rate('thermal_violation')} / 1e9", legend=GPU_LEGEND + " thermal"),
                Query(f"{q.rate('power_violation')} / 1e9", legend=GPU_LEGEND + " power"),
            ],
            unit="percentunit",
            min_value=0,
            description="The share of time the GPU's clocks were held down, from DCGM's "
            "violation counters (ns of throttling per second).",
        )
    )
    lay.row("Exporter and DCGM health")
    lay.add(
        state_timeline_panel(
            "dcgm-exporter scrape",
            [Query(f"up{{{q.targets(r.job_dcgm)}}}", legend="{{node}}")],
            states=((1, "up", GREEN), (0, "DOWN", RED)),
            description="DCGMExporterDown fires when a target stays down.",
        ),
        width=8,
    )
    lay.add(
        timeseries_panel(
            "GPUs reporting per node vs the inventory",
            [
                Query(
                    f"count by (cluster, node) ({q.per_gpu('gpu_temp')})",
                    legend="{{node}} reporting",
                ),
                Query(
                    f"max by (cluster, node) (gpumon_expected_gpus{{{q.targets(r.job_node)}}})",
                    legend="{{node}} expected",
                ),
            ],
            dashed=[f"{h} expected" for h in q.scope.fleet.gpu_hosts],
            min_value=0,
            description="A GPU that fell off the bus leaves the reporting line below the "
            "expected one (GPUMissing).",
        ),
        width=8,
    )
    lay.add(
        state_timeline_panel(
            "DCGM updating",
            [
                Query(
                    f"min by (cluster, node) (changes({m('total_energy')}{{{q.gpu()}}}"
                    f"[{r.exporter_stale_window}]) > bool 0)",
                    legend="{{node}}",
                )
            ],
            states=((1, "updating", GREEN), (0, "STALE", RED)),
            description="A powered GPU always consumes energy: a frozen energy counter over "
            f"{r.exporter_stale_window} means DCGM stopped updating (DCGMExporterStale).",
        ),
        width=8,
    )
    lay.row("Alerts and silences")
    lay.add(
        state_timeline_panel(
            "Alerts firing",
            [
                # about one GPU, one host, the whole cluster (rule_pack.ALERT_SCOPES)
                Query(
                    f'max by (alertname, node, gpu) (ALERTS{{{q.firing()}, node=~"$node", gpu!=""}})',
                    legend="{{alertname}} {{node}} GPU {{gpu}}",
                ),
                Query(
                    f"max by (alertname, node) "
                    f'(ALERTS{{{q.firing()}, node=~"$node", node!="", gpu=""}})',
                    legend="{{alertname}} {{node}}",
                ),
                Query(
                    f'max by (alertname) (ALERTS{{{q.firing()}, node=""}})',
                    legend="{{alertname}}",
                ),
            ],
            states=((1, "firing", RED),),
        ),
        width=16,
    )
    lay.add(
        timeseries_panel(
            "Silences in force",
            [Query(f"max({q.silences_active()})", legend="active silences")],
            min_value=0,
        ),
        width=8,
    )
    dash = (
        db.Dashboard("GPU operations")
        .uid(UID)
        .description(
            "SREs' view: utilization heatmap, temperatures against the alert "
            "thresholds, GPU errors, throttling, exporter and DCGM health, alerts and "
            "silences. Generated by gpumon-deploy."
        )
        .tags([*TAGS, "operations"])
        .readonly()
        .time("now-6h", "now")
        .refresh("1m")
        .timezone("browser")
        .variables(gpu_variables(q))
        .annotations(alert_annotations(q))
    )
    return lay.apply(dash)
