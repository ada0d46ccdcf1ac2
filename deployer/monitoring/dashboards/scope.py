"""What the dashboards are generated from: the inventory's GPU fleet and the rule pack's values.

The fleet (clusters, GPU models, MIG hosts, Slurm) is read from the inventory hosts of the GPU
group; the thresholds, job names and label lists from the prometheus role's variables *as the
first Prometheus replica sees them* (the role's defaults under the inventory's values for that
host), so a panel's red line is the threshold its alert uses, wherever a site overrides it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deployer.errors import InputError
from deployer.roles import DEFAULT_ROLES, load_role
from deployer.tls import material as tls_material

# MIG: a GPU host whose ``gpu_mig`` host variable is set (a list of GPU instance profiles, or a
# mapping GPU index -> profiles, as the lab topology writes it), or whose DeepOps-style
# ``mig_manager_profile`` names a nvidia-mig-parted configuration other than all-disabled.
MIG_HOST_VAR = "gpu_mig"
MIG_MANAGER_VAR = "mig_manager_profile"
MIG_MANAGER_OFF = "all-disabled"


@dataclass(frozen=True)
class Fleet:
    """The GPU hosts of the inventory, as the dashboards need them."""

    gpu_hosts: tuple[str, ...]
    clusters: tuple[str, ...]
    models: tuple[str, ...]
    mig_hosts: tuple[str, ...]
    slurm: bool
    # gpu_model when every GPU host names its model in the inventory (a file_sd target label),
    # else the exporter's modelName.
    model_label: str


@dataclass(frozen=True)
class RuleValues:
    """The rule pack's values the panels repeat (roles/prometheus/defaults/main.yml)."""

    job_dcgm: str
    job_node: str
    job_prometheus: str
    job_alertmanager: str
    mig_labels: tuple[str, ...]
    exporter_host_labels: tuple[str, ...]
    ceiling: float
    gpu_temp_warning: float
    gpu_temp_critical: float
    memory_temp_critical: float
    memory_temp_margin: float
    ecc_dbe_threshold: float
    uncorrectable_remapped_rows: float
    retired_pages: float
    pcie_replays_per_minute: float
    pcie_replays_by_model: tuple[tuple[str, float], ...]
    pcie_replay_window: str
    nvlink_error_window: str
    nvlink_crc_per_second: float
    nvlink_crc_rate_window: str
    exporter_stale_window: str
    throttle_thermal_bits: tuple[int, ...]
    throttle_power_bits: tuple[int, ...]
    hw_slowdown_bits: tuple[int, ...]
    scrape_interval: str


@dataclass(frozen=True)
class Datasource:
    """A Grafana datasource the product provisions (UID fixed by the product)."""

    uid: str
    name: str
    url: str
    kind: str  # "global" or "replica"


@dataclass(frozen=True)
class Scope:
    """Everything one generation of the dashboards reads."""

    fleet: Fleet
    rules: RuleValues
    datasources: tuple[Datasource, ...]
    default_datasource: str  # UID
    job_label: str  # the Slurm job label dcgm-exporter's HPC job mapping adds
    folder: str


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in {"", "no", "false", "off", "0"}
    return bool(value)


def _has_mig(hv: Mapping[str, Any]) -> bool:
    if MIG_HOST_VAR in hv and _truthy(hv[MIG_HOST_VAR]):
        return True
    profile = hv.get(MIG_MANAGER_VAR) if MIG_MANAGER_VAR in hv else None
    return profile is not None and str(profile) not in ("", MIG_MANAGER_OFF)


def fleet_of(variables: Mapping[str, Any], gpu_group: str) -> Fleet:
    """The inventory's GPU fleet, from ``groups`` and ``hostvars``."""
    hosts = tuple(variables["groups"].get(gpu_group, []))
    hostvars = variables["hostvars"]
    clusters: set[str] = set()
    models: set[str] = set()
    mig: list[str] = []
    slurm = False
    every_model = bool(hosts)
    for h in hosts:
        hv = hostvars[h]
        if "cluster" in hv and hv["cluster"] is not None:
            clusters.add(str(hv["cluster"]))
        if "gpu_model" in hv and hv["gpu_model"] is not None:
            models.add(str(hv["gpu_model"]))
        else:
            every_model = False
        if _has_mig(hv):
            mig.append(h)
        if "slurm_partition" in hv and hv["slurm_partition"] is not None:
            slurm = True
    return Fleet(
        gpu_hosts=hosts,
        clusters=tuple(sorted(clusters)),
        models=tuple(sorted(models)),
        mig_hosts=tuple(mig),
        slurm=slurm,
        model_label="gpu_model" if every_model else "modelName",
    )


@functools.cache
def _role_defaults(role: str) -> dict[str, Any]:
    return load_role([DEFAULT_ROLES], role).defaults


def role_scope(variables: Mapping[str, Any], role: str, group: str) -> Mapping[str, Any]:
    """``role``'s variables as the first host of ``group`` sees them: the role's defaults under
    that host's inventory values (and extra vars); without such a host, under ``variables``.
    ``variables`` are the templating layer's (``TemplatedVars.sibling`` renders the result the
    same way, lazily)."""
    members = list(variables["groups"].get(group, []))
    source: Mapping[str, Any] = variables["hostvars"][members[0]] if members else variables
    raw: dict[str, Any] = dict(_role_defaults(role))
    prefix = role.split("_")[0] + "_"
    for key in source:
        if key.startswith(prefix) or key in raw:
            raw[key] = source[key]
    for key in ("groups", "hostvars", "inventory_hostname", "facts"):
        if key in source:
            raw[key] = source[key]
    return variables.sibling(raw, source=f"role {role} variables")  # type: ignore[attr-defined]


def _words(value: Any, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    try:
        return tuple(str(v) for v in value)
    except TypeError:
        raise InputError(f"must be a list, got {value!r}", key=key) from None


def rule_values(prom: Mapping[str, Any]) -> RuleValues:
    """The rule pack's values from the prometheus role's variables (see :func:`role_scope`)."""

    def num(key: str) -> float:
        try:
            return float(prom[key])
        except (TypeError, ValueError):
            raise InputError(f"must be a number, got {prom[key]!r}", key=key) from None

    def bits(key: str) -> tuple[int, ...]:
        return tuple(int(b) for b in prom[key])

    by_model = prom["prometheus_rules_pcie_replays_per_minute_by_model"] or {}
    return RuleValues(
        job_dcgm=str(prom["prometheus_rules_job_dcgm"]),
        job_node=str(prom["prometheus_rules_job_node"]),
        job_prometheus=str(prom["prometheus_rules_job_prometheus"]),
        job_alertmanager=str(prom["prometheus_rules_job_alertmanager"]),
        mig_labels=_words(prom["prometheus_rules_mig_labels"], "prometheus_rules_mig_labels"),
        exporter_host_labels=_words(
            prom["prometheus_rules_exporter_host_labels"], "prometheus_rules_exporter_host_labels"
        ),
        ceiling=num("prometheus_rules_dcgm_value_ceiling"),
        gpu_temp_warning=num("prometheus_rules_gpu_temp_warning_celsius"),
        gpu_temp_critical=num("prometheus_rules_gpu_temp_critical_celsius"),
        memory_temp_critical=num("prometheus_rules_memory_temp_critical_celsius"),
        memory_temp_margin=num("prometheus_rules_memory_temp_margin_celsius"),
        ecc_dbe_threshold=num("prometheus_rules_ecc_dbe_threshold"),
        uncorrectable_remapped_rows=num("prometheus_rules_uncorrectable_remapped_rows_threshold"),
        retired_pages=num("prometheus_rules_retired_pages_threshold"),
        pcie_replays_per_minute=num("prometheus_rules_pcie_replays_per_minute"),
        pcie_replays_by_model=tuple(sorted((str(k), float(v)) for k, v in by_model.items())),
        pcie_replay_window=str(prom["prometheus_rules_pcie_replay_window"]),
        nvlink_error_window=str(prom["prometheus_rules_nvlink_error_window"]),
        nvlink_crc_per_second=num("prometheus_rules_nvlink_crc_errors_per_second"),
        nvlink_crc_rate_window=str(prom["prometheus_rules_nvlink_crc_rate_window"]),
        exporter_stale_window=str(prom["prometheus_rules_exporter_stale_window"]),
        throttle_thermal_bits=bits("prometheus_rules_throttle_thermal_bits"),
        throttle_power_bits=bits("prometheus_rules_throttle_power_bits"),
        hw_slowdown_bits=bits("prometheus_rules_hw_slowdown_bits"),
        scrape_interval=str(prom["prometheus_scrape_interval"]),
    )


def _address(hostvars: Mapping[str, Any], host: str) -> str:
    hv = hostvars[host]
    return str(hv["ansible_host"]) if "ansible_host" in hv else host


GLOBAL_UID = "gpumon-global"


def replica_uid(host: str) -> str:
    return f"gpumon-replica-{host}"


def datasources_of(variables: Mapping[str, Any], prom: Mapping[str, Any]) -> tuple[Datasource, ...]:
    """The global view (``grafana_global_view_url``, else Thanos Query on the first host of the
    ``thanos_query`` group when there is one) and one datasource per Prometheus replica."""
    hostvars = variables["hostvars"]
    out: list[Datasource] = []
    scheme = tls_material.scheme(variables)  # gpumon_tls: the replicas and Query serve HTTPS
    url = str(variables["grafana_global_view_url"] or "")
    if not url:
        query_hosts = list(variables["groups"].get(variables["grafana_thanos_query_group"], []))
        if query_hosts:
            thanos = role_scope(variables, "thanos_query", variables["grafana_thanos_query_group"])
            # Only a Thanos Query the thanos_query role deploys (auto without an archive: none).
            if _truthy(thanos["thanos_active"]):
                port = int(thanos["thanos_query_http_port"])
                url = f"{scheme}://{_address(hostvars, query_hosts[0])}:{port}"
    if url:
        out.append(Datasource(GLOBAL_UID, "gpumon global view", url, "global"))
    port = int(prom["prometheus_port"])
    for host in variables["groups"].get(variables["grafana_prometheus_group"], []):
        out.append(
            Datasource(
                replica_uid(host),
                f"gpumon replica {host}",
                f"{scheme}://{_address(hostvars, host)}:{port}",
                "replica",
            )
        )
    return tuple(out)


def scope_of(variables: Mapping[str, Any]) -> Scope:
    """The dashboards' scope from a host's variables holding the grafana role's defaults."""
    prom = role_scope(variables, "prometheus", variables["grafana_prometheus_group"])
    sources = datasources_of(variables, prom)
    default = sources[0].uid if sources else GLOBAL_UID
    return Scope(
        fleet=fleet_of(variables, str(prom["prometheus_gpu_group"])),
        rules=rule_values(prom),
        datasources=sources,
        default_datasource=default,
        job_label=str(variables["grafana_dashboards_job_label"]),
        folder=str(variables["grafana_dashboards_folder"]),
    )
