"""What every GPU dashboard shares: its template variables and its alert/silence annotations."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from deployer.monitoring.dashboards.panels import DATASOURCE, datasource_variable, query_variable
from deployer.monitoring.dashboards.promql import Queries, m

TAGS = ["gpumon", "gpu"]


def gpu_variables(
    q: Queries, *, node_multi: bool = True
) -> list[db.QueryVariable | db.DatasourceVariable]:
    """datasource, cluster, GPU model, node (multi-select unless drilling into one host) and,
    on a Slurm fleet, the Slurm job (dcgm-exporter's HPC job mapping label)."""
    scope = q.scope
    up = f'up{{job="{scope.rules.job_dcgm}"'
    out: list[db.QueryVariable | db.DatasourceVariable] = [
        datasource_variable(scope),
        query_variable("cluster", "Cluster", f"label_values({up}}}, cluster)"),
        query_variable(
            "gpu_model", "GPU model", f'label_values({up}, cluster=~"$cluster"}}, {q.model})'
        ),
        query_variable(
            "node",
            "Node",
            f'label_values({up}, cluster=~"$cluster", {q.model}=~"$gpu_model"}}, node)',
            multi=node_multi,
            include_all=node_multi,
        ),
    ]
    if scope.fleet.slurm:
        out.append(
            query_variable(
                "hpc_job",
                "Slurm job",
                f'label_values({m("gpu_temp")}{{job="{scope.rules.job_dcgm}", node=~"$node"}}, '
                f"{scope.job_label})",
            )
        )
    return out


def alert_annotations(q: Queries) -> list[db.AnnotationQuery]:
    """Firing alerts and silence periods on every time axis of the dashboard.

    Only ``expr`` is set: Grafana's published 11.6 dashboard schema closes AnnotationQuery
    (additionalProperties false), so the Prometheus editor's titleFormat/tagKeys would not
    validate; the alert names are in the "Alerts firing" panels instead."""
    return [
        db.AnnotationQuery()
        .name("Firing alerts")
        .datasource(DATASOURCE)
        .enable(True)
        .icon_color("red")
        .expr(f'ALERTS{{{q.firing()}, node=~"$node"}}'),
        db.AnnotationQuery()
        .name("Silences in force")
        .datasource(DATASOURCE)
        .enable(True)
        .icon_color("blue")
        .expr(f"max({q.silences_active()}) > 0"),
    ]
