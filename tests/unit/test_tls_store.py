"""The long-term store (VictoriaMetrics 1.79) under gpumon_tls: it serves HTTPS with the tier's
certificate and asks basic auth, its credentials reach it through a 0600 environment file (never
its command line), and every client (the replicas' remote_write and scrape, the backup's
snapshot requests) speaks https with the tier's CA and the store's credential."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deployer.session import DeploySession, RunOptions
from deployer.tls import material
from tests.unit.test_monitoring_config import INVENTORY, exec_flags

STORE_INVENTORY = (
    INVENTORY
    + """\
        metrics_store:
          hosts: {mon01: {}}
"""
)

PLAYS = """\
- name: store
  hosts: metrics_store
  roles: [victoriametrics]
- name: Prometheus HA pair
  hosts: prometheus
  serial: 1
  roles: [prometheus]
"""


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GPUMON_SECRETS_DIR", str(tmp_path / "secrets"))
    material.forget()
    yield
    material.forget()


def plan(tmp_path: Path, *extra: str) -> dict[str, dict]:
    inv = tmp_path / "inventory.yml"
    inv.write_text(STORE_INVENTORY)
    site = tmp_path / "site.yml"
    site.write_text(PLAYS)
    session = DeploySession.load(RunOptions(inventory=inv, site=site, extra_vars=list(extra)))
    out: dict[str, dict] = {}
    for hp in session.plans:
        for play in hp.plays:
            for t in [*play.tasks, *play.handlers.values()]:
                out.setdefault(hp.host, {}).setdefault(t.name, t)
    return out


def on(tmp_path: Path, *extra: str) -> dict[str, dict]:
    return plan(tmp_path, "gpumon_tls=true", f"gpumon_tls_dir={tmp_path / 'ca'}", *extra)


def prom_yml(planned: dict) -> str:
    name = "prometheus.yml (checked by promtool before it replaces the live file)"
    t = planned["prom01"][name]
    return t.args.get("content") or t.args["src_content"]


def unit_text(task) -> str:
    return task.args.get("content") or task.args["src_content"]


def test_the_store_serves_https_with_its_certificate_in_one_file(tmp_path):
    planned = on(tmp_path)
    flags = exec_flags(unit_text(planned["mon01"]["victoria-metrics hardened unit, enabled"]))
    assert "-tls" in flags
    assert "-tlsCertFile=/etc/victoria-metrics/tls/server.pem" in flags
    assert "-tlsKeyFile=/etc/victoria-metrics/tls/server.pem" in flags
    key = planned["mon01"][
        "victoriametrics private key and certificate (one file, 0640, never shown)"
    ]
    assert key.args["mode"] in ("640", "0640") and key.args["secret"] is True
    assert key.args["group"] == "_victoria-metrics"


def test_the_store_password_is_generated_and_only_in_its_0600_env_file(tmp_path):
    planned = on(tmp_path)
    password = (tmp_path / "ca" / "metrics-store-password").read_text().strip()
    env = planned["mon01"][
        "the store's credentials for the server (secret, 0600 root; read by systemd)"
    ]
    text = env.args["content"]
    unit = unit_text(planned["mon01"]["victoria-metrics hardened unit, enabled"])
    assert password not in unit and "httpAuth" not in " ".join(exec_flags(unit))
    assert env.args["mode"] in ("600", "0600") and env.args["secret"] is True
    assert f'httpAuth_password="{password}"' in text and 'httpAuth_username="gpumon-store"' in text


def test_the_replicas_write_and_scrape_the_store_over_https_with_the_tier_ca(tmp_path):
    planned = on(tmp_path)
    config = yaml.safe_load(prom_yml(planned))
    rw = config["remote_write"][0]
    assert rw["url"] == "https://192.0.2.23:8428/api/v1/write"
    assert rw["tls_config"] == {"ca_file": "/etc/gpumon/tls/ca.pem"}
    assert rw["basic_auth"]["username"] == "gpumon-store"
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "victoriametrics")
    assert job["scheme"] == "https" and job["tls_config"] == {"ca_file": "/etc/gpumon/tls/ca.pem"}
    written = planned["prom01"][
        "remote-write password of the long-term store (secret, 0600; empty without credentials)"
    ]
    password = (tmp_path / "ca" / "metrics-store-password").read_text().strip()
    assert written.args["content"] == password


def test_a_store_credential_of_the_inventory_wins(tmp_path):
    planned = on(tmp_path, "metrics_store_username=vm", "metrics_store_password=vm-pass-123")
    config = yaml.safe_load(prom_yml(planned))
    assert config["remote_write"][0]["basic_auth"]["username"] == "vm"


def test_without_the_switch_the_store_stays_plain_and_open(tmp_path):
    planned = plan(tmp_path)
    config = yaml.safe_load(prom_yml(planned))
    assert config["remote_write"][0]["url"].startswith("http://")
    assert "tls_config" not in config["remote_write"][0]
    assert "basic_auth" not in config["remote_write"][0]
    flags = exec_flags(unit_text(planned["mon01"]["victoria-metrics hardened unit, enabled"]))
    assert "-tls" not in flags


def test_the_backup_asks_the_store_over_https_with_the_ca(tmp_path):
    planned = on(tmp_path, "victoriametrics_backup_s3_bucket=b")
    script = planned["mon01"]["backup script"]
    text = script.args.get("content") or script.args.get("src_content", "")
    assert 'store="https://127.0.0.1:8428"' in text
    assert "--cacert /etc/gpumon/tls/ca.pem" in text


def test_the_store_key_is_written_after_the_package_creates_its_user(tmp_path):
    names = list(on(tmp_path)["mon01"])
    assert names.index("victoria-metrics OS package") < names.index("victoriametrics TLS directory")
    assert names.index(
        "victoriametrics private key and certificate (one file, 0640, never shown)"
    ) < names.index("victoria-metrics running")
