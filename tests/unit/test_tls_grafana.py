"""Grafana's provisioned datasources under gpumon_tls (Grafana is rendered and unit-tested only:
no Grafana package can be had here). The replicas and the product's Thanos Query are reached
over HTTPS, verified with the tier's CA and the tier's basic-auth credential, all in
``secureJsonData`` of a 0640 root:grafana file whose content is masked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from deployer.tls import material, rotation
from tests.unit.grafana_inventory import plan_grafana

TASK = "datasources (global view and replicas, fixed uids)"


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GPUMON_SECRETS_DIR", str(tmp_path / "secrets"))
    material.forget()
    yield
    material.forget()


def tls(tmp_path: Path, **more: str) -> str:
    return json.dumps({"gpumon_tls": True, "gpumon_tls_dir": str(tmp_path / "ca"), **more})


def sources(planned) -> list[dict]:
    return yaml.safe_load(planned[TASK].args["content"])["datasources"]


def test_the_replicas_are_https_with_the_tier_ca_and_credential(tmp_path):
    planned = plan_grafana(tmp_path, tls(tmp_path))
    ca_pem = (tmp_path / "ca" / "ca.crt").read_text()
    password = (tmp_path / "ca" / "basic-auth-password").read_text().strip()
    ds = sources(planned)
    assert [d["url"] for d in ds] == ["https://192.0.2.21:9090", "https://192.0.2.22:9090"]
    for d in ds:
        assert d["jsonData"]["tlsAuthWithCACert"] is True
        assert d["basicAuth"] is True and d["basicAuthUser"] == "gpumon"
        assert d["secureJsonData"] == {
            "basicAuthPassword": password,
            "tlsCACert": rotation.normal_pem(ca_pem),
        }
    t = planned[TASK]
    assert t.args["mode"] == "640" and t.args["group"] == "grafana"
    assert "content" in t.secret_args


def test_without_the_switch_the_datasources_stay_plain(tmp_path):
    ds = sources(plan_grafana(tmp_path))
    assert all(d["url"].startswith("http://") and "secureJsonData" not in d for d in ds)


def test_a_global_view_the_inventory_names_gets_only_its_own_account(tmp_path):
    planned = plan_grafana(tmp_path, tls(tmp_path, grafana_global_view_url="http://vm01:8428"))
    first = sources(planned)[0]
    assert first["url"] == "http://vm01:8428"
    assert "basicAuth" not in first and "secureJsonData" not in first


def test_the_inventory_datasource_account_wins_over_the_tier_credential(tmp_path):
    planned = plan_grafana(
        tmp_path,
        tls(
            tmp_path,
            grafana_datasource_basic_auth_user="g",
            grafana_datasource_basic_auth_password="s3cret-pw",
        ),
    )
    d = sources(planned)[0]
    assert d["basicAuthUser"] == "g" and d["secureJsonData"]["basicAuthPassword"] == "s3cret-pw"
    assert "tlsCACert" in d["secureJsonData"]
