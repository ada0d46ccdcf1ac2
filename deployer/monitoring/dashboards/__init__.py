"""Grafana dashboards generated from the inventory and the rule pack, and what provisions them.

Owns the dashboards' content (built with grafana-foundation-sdk, Grafana 11.6's dashboard schema,
schemaVersion 41), their deterministic JSON, and the provisioning documents of the grafana role
(datasources with product-fixed UIDs, the file provider). The role's templates call
:func:`dashboard_json` and :func:`provisioning_document` (template globals registered in
``deployer/templating.py``), so what ``up`` writes is exactly what the tests check.

Public API
----------
``scope_of(variables) -> Scope``
    What a generation reads (``deployer/monitoring/dashboards/scope.py``).
``build(scope) -> dict[uid, dict]``
    Every dashboard as Grafana JSON (a dict), in a fixed order; MIG only where the inventory has
    MIG hosts.
``encode(dashboard) -> str``
    Deterministic JSON text: sorted keys, and ``version`` derived from the rest of the content,
    so a file changes (and ``up`` reports a change) only when its content does.
``dashboard_json(variables, uid) -> str``, ``dashboard_uids(variables) -> list[str]``
``provisioning_document(variables, kind) -> dict``  (kind: ``datasources`` or ``dashboards``)
``of_inventory.for_inventory(inventory, extra_vars=()) -> (Scope, dict[uid, dict])``
    The same dashboards for an inventory file, as the grafana role would write them on a
    ``grafana`` host of it (for ``render`` and the lab proof).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from deployer.monitoring.dashboards import capacity, fleet, mig, node, operations
from deployer.monitoring.dashboards.promql import Queries
from deployer.monitoring.dashboards.scope import GLOBAL_UID, Scope, replica_uid, scope_of

__all__ = [
    "GLOBAL_UID",
    "Scope",
    "build",
    "dashboard_json",
    "dashboard_uids",
    "encode",
    "provisioning_document",
    "replica_uid",
    "scope_of",
]

# The Grafana line the role installs, whose schema the dashboards are built for (the SDK release
# 11.6.0 of grafana-foundation-sdk: dashboard schemaVersion 41).
GRAFANA_SERIES = "11.6"
ALL_UIDS = (fleet.UID, operations.UID, node.UID, capacity.UID, mig.UID)
_VERSION_BITS = 31  # version is an integer; stay inside a signed 32-bit one


def build(scope: Scope) -> dict[str, dict[str, Any]]:
    """Every dashboard of the scope, uid -> Grafana JSON (a plain dict; a copy of its own)."""
    return json.loads(_built(scope))


@functools.lru_cache(maxsize=8)
def _built(scope: Scope) -> str:
    # Once per scope: the role renders one template per dashboard from the same inventory.
    q = Queries(scope)
    makers = [fleet, operations, node, capacity]
    if scope.fleet.mig_hosts:
        makers.append(mig)
    out: dict[str, dict[str, Any]] = {}
    for maker in makers:
        built = maker.build(q).build()
        data = json.loads(JSONEncoder(sort_keys=True).encode(built))
        out[maker.UID] = data
    return json.dumps(out)


def content_version(dashboard: Mapping[str, Any]) -> int:
    """A version number derived from the dashboard's content (its ``version`` aside)."""
    body = {k: v for k, v in dashboard.items() if k != "version"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return int(digest[:8], 16) & ((1 << _VERSION_BITS) - 1)


def encode(dashboard: Mapping[str, Any]) -> str:
    data = dict(dashboard)
    data["version"] = content_version(data)
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def dashboard_uids(variables: Mapping[str, Any]) -> list[str]:
    return list(build(scope_of(variables)))


def retired_uids(variables: Mapping[str, Any]) -> list[str]:
    """The product's dashboards this inventory does not call for (to remove from the host)."""
    current = set(dashboard_uids(variables))
    return [uid for uid in ALL_UIDS if uid not in current]


def dashboard_json(variables: Mapping[str, Any], uid: str) -> str:
    dashboards = build(scope_of(variables))
    if uid not in dashboards:
        raise KeyError(f"no dashboard {uid!r}; dashboards: {', '.join(dashboards)}")
    return encode(dashboards[uid])


def provisioning_document(variables: Mapping[str, Any], kind: str) -> dict[str, Any]:
    from deployer.monitoring.dashboards.provisioning import datasources, providers

    scope = scope_of(variables)
    if kind == "datasources":
        return datasources(scope, variables)
    if kind == "dashboards":
        return providers(scope, variables)
    raise KeyError(f"no provisioning document {kind!r}: datasources or dashboards")
