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
from deployer.tls import material as tls_material


def _text(variables: Mapping[str, Any], key: str) -> str:
    value = variables.get(key, "")
    return "" if value is None else str(value)


def datasources(scope: Scope, variables: Mapping[str, Any]) -> dict[str, Any]:
    """``provisioning/datasources/gpumon.yaml``: every product datasource, read-only in the UI
    (``editable: false``), the global view the default.

    With ``gpumon_tls`` the replicas and the product's Thanos Query are reached over HTTPS,
    verified with the tier's CA (``jsonData.tlsAuthWithCACert`` and ``secureJsonData.tlsCACert``)
    and with the tier's basic-auth credential unless ``grafana_datasource_basic_auth_user`` names
    another (https://grafana.com/docs/grafana/latest/administration/provisioning/, data sources'
    jsonData ``tlsAuthWithCACert`` and secureJsonData ``tlsCACert``, ``basicAuthPassword``;
    Grafana is rendered only here, docs/unverified.md has no row: the fields are Grafana's
    documented ones). A global view
    the inventory names (``grafana_global_view_url``) gets the CA when it is an https URL, and
    only the account the inventory gives."""
    user = _text(variables, "grafana_datasource_basic_auth_user")
    password = _text(variables, "grafana_datasource_basic_auth_password")
    tier = tls_material.client(variables)
    given_global = bool(_text(variables, "grafana_global_view_url"))
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
        secure: dict[str, str] = {}
        ours = ds.kind == "replica" or not given_global
        if user:
            entry["basicAuth"] = True
            entry["basicAuthUser"] = user
            secure["basicAuthPassword"] = password
        elif tier is not None and ours:
            entry["basicAuth"] = True
            entry["basicAuthUser"] = tier["username"]
            secure["basicAuthPassword"] = tier["password"]
        if tier is not None and ds.url.startswith("https://"):
            entry["jsonData"]["tlsAuthWithCACert"] = True
            secure["tlsCACert"] = tier["ca_pem"]
        if secure:
            entry["secureJsonData"] = secure
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
