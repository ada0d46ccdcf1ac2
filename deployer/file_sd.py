"""Prometheus file-based discovery targets generated from the inventory (pure: no I/O).

One targets file per scrape job (``dcgm``, ``node``, ``prometheus``, ``alertmanager``,
``thanos-sidecar``), each a list of ``{"targets": [...], "labels": {...}}`` groups, one group per
host. GPU-host targets carry the inventory metadata the rules join on (``node`` plus the host vars
named in ``prometheus_target_label_vars``: cluster, rack, gpu_model, slurm_partition, scrape_tier)
and, for a host whose ``scrape_tier`` is a configured tier, that tier's ``__scrape_interval__`` and
``__scrape_timeout__``, so changing tiers needs no reload either.

The prometheus role renders the same files from ``templates/file_sd.json.j2``;
tests/unit/test_file_sd.py proves the two agree byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

JOBS = ("dcgm", "node", "prometheus", "alertmanager", "thanos-sidecar")


@dataclass(frozen=True)
class Target:
    """One expected scrape target: its job, ``instance`` (host:port) and inventory host."""

    job: str
    instance: str
    node: str


def _address(hostvars: Mapping[str, Any], host: str) -> str:
    return str(hostvars[host].get("ansible_host", host))


def _unique(hosts: Sequence[str]) -> list[str]:
    seen: dict[str, None] = {}
    for h in hosts:
        seen.setdefault(h, None)
    return list(seen)


def _labels(variables: Mapping[str, Any], host: str) -> dict[str, str]:
    hv = variables["hostvars"][host]
    labels = {"node": host}
    for name in variables["prometheus_target_label_vars"]:
        if name in hv and hv[name] is not None:
            labels[name] = str(hv[name])
    tiers = variables["prometheus_scrape_tiers"]
    tier = hv.get("scrape_tier")
    if tier is not None and str(tier) in tiers:
        labels["__scrape_interval__"] = str(tiers[str(tier)]["interval"])
        labels["__scrape_timeout__"] = str(tiers[str(tier)]["timeout"])
    return labels


def members(variables: Mapping[str, Any], group_names: Sequence[str]) -> list[str]:
    """Hosts of the named inventory groups, in inventory order, each once."""
    groups = variables["groups"]
    return _unique([h for g in group_names for h in groups.get(g, [])])


def truthy(value: Any) -> bool:
    """A variable as a boolean, as the engine's ``bool`` filter reads it."""
    if isinstance(value, str):
        return value.strip().lower() in {"yes", "true", "on", "1"}
    return bool(value)


def job_hosts(variables: Mapping[str, Any]) -> dict[str, list[str]]:
    """Which inventory hosts each job scrapes (the sidecar job only when the sidecar is on)."""
    sidecar = truthy(variables["prometheus_thanos_sidecar"])
    return {
        "dcgm": members(variables, [variables["prometheus_gpu_group"]]),
        "node": members(variables, variables["prometheus_node_groups"]),
        "prometheus": members(variables, [variables["prometheus_group"]]),
        "alertmanager": members(variables, [variables["prometheus_alertmanager_group"]]),
        "thanos-sidecar": members(variables, [variables["prometheus_group"]]) if sidecar else [],
    }


def job_ports(variables: Mapping[str, Any]) -> dict[str, int]:
    return {
        "dcgm": int(variables["prometheus_dcgm_exporter_port"]),
        "node": int(variables["prometheus_node_exporter_port"]),
        "prometheus": int(variables["prometheus_port"]),
        "alertmanager": int(variables["prometheus_alertmanager_port"]),
        "thanos-sidecar": int(variables["prometheus_thanos_sidecar_http_port"]),
    }


def file_sd_targets(variables: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Target groups per job, from one Prometheus host's variables (``groups``, ``hostvars`` and
    the ``prometheus_*`` settings of the role)."""
    hostvars = variables["hostvars"]
    ports = job_ports(variables)
    out: dict[str, list[dict[str, Any]]] = {}
    for job, hosts in job_hosts(variables).items():
        with_metadata = job in ("dcgm", "node")
        out[job] = [
            {
                "targets": [f"{_address(hostvars, h)}:{ports[job]}"],
                "labels": _labels(variables, h) if with_metadata else {"node": h},
            }
            for h in hosts
        ]
    return out


def render(groups: list[dict[str, Any]]) -> str:
    """A targets file's text (what the role's template renders: sorted keys, 2-space indent)."""
    return json.dumps(groups, indent=2, sort_keys=True) + "\n"


def expected_targets(variables: Mapping[str, Any]) -> list[Target]:
    """Every (job, instance) a replica must scrape, for ``status``."""
    return [
        Target(job, target, group["labels"]["node"])
        for job, groups in file_sd_targets(variables).items()
        for group in groups
        for target in group["targets"]
    ]
