"""The dashboards of an inventory file, as ``up`` would write them on its grafana host: for the
render command and the tests (the role itself computes them from its template variables)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deployer import inventory as inventory_loader
from deployer.monitoring.dashboards import build
from deployer.monitoring.dashboards.scope import Scope, scope_of
from deployer.plan import Planner
from deployer.roles import DEFAULT_ROLES, SHARED_TEMPLATES, Play


def for_inventory(
    inventory: Path, extra_vars: Sequence[str] = ()
) -> tuple[Scope, dict[str, dict[str, Any]]]:
    """The dashboards of an inventory, as the grafana role writes them on a ``grafana`` host of
    it (its first, else any host's view: the dashboards depend on the inventory, not the host)."""
    extra = inventory_loader.parse_extra_vars(list(extra_vars))
    inv = inventory_loader.load_inventory(Path(inventory), extra_vars=extra)
    planner = Planner(inv, [DEFAULT_ROLES], SHARED_TEMPLATES)
    hosts = list(inv.group_hosts("grafana")) if "grafana" in inv.groups else []
    host = hosts[0] if hosts else next(iter(inv.hosts))
    play = Play(name="dashboards", hosts=host, roles=("grafana",))
    variables = planner.host_vars(host, play)
    scope = scope_of(variables)
    return scope, build(scope)
