"""Grafana's provisioning documents for the product's datasources and dashboards (data; the
grafana role writes them as YAML).

Datasources: the global view (uid ``gpumon-global``, the default) and one per Prometheus replica
(``gpumon-replica-<host>``): UIDs fixed by the product, so that the dashboards' datasource
variable defaults to a UID that exists on every Grafana the product provisions, and no
``${DS_...}`` import placeholder is needed (those resolve only in the UI's import dialog, never
under file provisioning). Format: Grafana's provisioning ``apiVersion: 1`` files
(grafana/grafana ``docs/sources/administration/provisioning/index.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deployer.monitoring.dashboards.scope import Scope


def _text(variables: Mapping[str, Any], key: str) -> str:
    value = variables.get(key, "")
    return "" if value is None else str(value)


def datasources(scope: Scope, variables: Mapping[str, Any]) -> dict[str, Any]:
    """``provisioning/datasources/gpumon.yaml``: every product datasource, read-only in the UI
    (``editable: false``), the global view the default."""
    user = _text(variables, "grafana_datasource_basic_auth_user")
    password = _text(variables, "grafana_datasource_basic_auth_password")
    out = []
    for ds in scope.datasources:
        entry: dict[str, Any] = {
            "name": ds.name,
            "uid": ds.uid,
            "type": "prometheus",
            "access": "proxy",
            "url": ds.url,
            "isDefault": ds.uid == scope.default_datasource,
            "editable": False,
            "jsonData": {
                # $__rate_interval >= 4 x this (Grafana's rate-interval rule).
                "timeInterval": scope.rules.scrape_interval,
                "httpMethod": "POST",
            },
        }
        if user:
            entry["basicAuth"] = True
            entry["basicAuthUser"] = user
            entry["secureJsonData"] = {"basicAuthPassword": password}
        out.append(entry)
    return {"apiVersion": 1, "datasources": out}


def providers(scope: Scope, variables: Mapping[str, Any]) -> dict[str, Any]:
    """``provisioning/dashboards/gpumon.yaml``: the generated files, in one folder, not editable
    in the UI (a change there would be overwritten by the next ``up``)."""
    return {
        "apiVersion": 1,
        "providers": [
            {
                "name": "gpumon",
                "orgId": 1,
                "folder": scope.folder,
                "folderUid": "gpumon",
                "type": "file",
                "disableDeletion": True,
                "allowUiUpdates": False,
                "updateIntervalSeconds": 30,
                "options": {
                    "path": _text(variables, "grafana_dashboards_dir"),
                    "foldersFromFilesStructure": False,
                },
            }
        ],
    }
