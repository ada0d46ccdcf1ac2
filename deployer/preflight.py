"""Preflight: every selected GPU host's version plan checked against the compatibility matrix.

Runs before anything is written: ``check`` runs only this; ``up`` runs it first and refuses the
whole run (exit 2) when any host's plan is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deployer import compat
from deployer.facts import HostFacts

GPU_GROUP = "gpu"


def gpu_hosts(inventory: Any, hosts: list[str]) -> list[str]:
    members = set(inventory.group_hosts(GPU_GROUP)) if GPU_GROUP in inventory.groups else set()
    return [h for h in hosts if h in members]


def host_plans(
    inventory: Any,
    hosts: list[str],
    variables: Mapping[str, Mapping[str, Any]],
    facts: Mapping[str, HostFacts] | None,
) -> list[compat.HostPlan]:
    """Plans from resolved variables; with facts, the GPU names seen on the host decide the model."""
    entries = []
    for host in gpu_hosts(inventory, hosts):
        names = None
        if facts is not None and host in facts and facts[host].gpus:
            names = [g.name for g in facts[host].gpus]
        entries.append((host, variables[host], names))
    return compat.plans_from_vars(entries)


def refusals(plans: list[compat.HostPlan]) -> list[compat.Refusal]:
    return compat.check(plans)
