"""TLS and basic auth of the monitoring tier (``gpumon_tls``): the controller's CA and host
certificates, the bcrypt hash kept across runs, both ends rendered by the roles, and bad input."""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import bcrypt
import pytest
import yaml
from cryptography import x509

from deployer.errors import InputError
from deployer.session import DeploySession, RunOptions
from deployer.tls import ca, material
from deployer.tls.hashing import password_hash
from tests.unit.test_monitoring_config import INVENTORY, MONITORING_PLAYS, exec_flags

EXPORTER_PLAYS = """\
- name: node_exporter
  hosts: all
  roles: [node_exporter]
"""


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


# ---------------------------------------------------------------- the CA and host certificates


def test_the_ca_is_created_once_with_its_key_0600_in_a_0700_directory(tmp_path):
    first = ca.ensure_ca(tmp_path / "ca")
    again = ca.ensure_ca(tmp_path / "ca")
    assert first.cert.serial_number == again.cert.serial_number
    assert mode(tmp_path / "ca") == 0o700
    assert mode(tmp_path / "ca" / "ca.key") == 0o600
    assert first.cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_a_ca_key_others_can_read_is_refused(tmp_path):
    ca.ensure_ca(tmp_path / "ca")
    os.chmod(tmp_path / "ca" / "ca.key", 0o644)
    with pytest.raises(InputError, match="readable by others"):
        ca.ensure_ca(tmp_path / "ca")


def test_a_host_certificate_names_the_host_and_its_addresses(tmp_path):
    authority = ca.ensure_ca(tmp_path)
    issued = ca.issue_host(authority, tmp_path, "gpu01", ["gpu01", "10.0.0.5", "localhost"],
                           days=90, renew_days=10)  # fmt: skip
    cert = x509.load_pem_x509_certificate(issued.cert_pem.encode())
    assert ca.sans_of(cert) == (["gpu01", "localhost"], ["10.0.0.5"])
    cert.verify_directly_issued_by(authority.cert)
    assert mode(tmp_path / "hosts" / "gpu01.key") == 0o600


def test_a_good_certificate_is_kept_by_the_next_run(tmp_path):
    authority = ca.ensure_ca(tmp_path)
    a = ca.issue_host(authority, tmp_path, "h", ["h"], days=90, renew_days=10)
    b = ca.issue_host(authority, tmp_path, "h", ["h"], days=90, renew_days=10)
    assert a.issued and not b.issued and a.cert_pem == b.cert_pem and a.key_pem == b.key_pem


def test_a_certificate_within_the_renewal_threshold_is_issued_again(tmp_path):
    authority = ca.ensure_ca(tmp_path)
    a = ca.issue_host(authority, tmp_path, "h", ["h"], days=90, renew_days=10)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=81)
    b = ca.issue_host(authority, tmp_path, "h", ["h"], days=90, renew_days=10, now=later)
    assert b.issued and b.cert_pem != a.cert_pem
    assert b.not_after > a.not_after


def test_a_certificate_outside_the_threshold_is_not_renewed(tmp_path):
    authority = ca.ensure_ca(tmp_path)
    ca.issue_host(authority, tmp_path, "h", ["h"], days=90, renew_days=10)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=79)
    assert not ca.issue_host(
        authority, tmp_path, "h", ["h"], days=90, renew_days=10, now=later
    ).issued


def test_a_new_address_of_the_host_issues_its_certificate_again(tmp_path):
    authority = ca.ensure_ca(tmp_path)
    ca.issue_host(authority, tmp_path, "h", ["h", "10.0.0.1"], days=90, renew_days=10)
    again = ca.issue_host(authority, tmp_path, "h", ["h", "10.0.0.2"], days=90, renew_days=10)
    assert again.issued


def test_a_certificate_of_another_ca_is_issued_again(tmp_path):
    ca.issue_host(ca.ensure_ca(tmp_path / "a"), tmp_path / "a", "h", ["h"], days=90, renew_days=10)
    other = ca.ensure_ca(tmp_path / "b")
    (tmp_path / "b" / "hosts" / "h.crt").write_bytes((tmp_path / "a/hosts/h.crt").read_bytes())
    (tmp_path / "b" / "hosts" / "h.key").write_bytes((tmp_path / "a/hosts/h.key").read_bytes())
    os.chmod(tmp_path / "b" / "hosts" / "h.key", 0o600)
    assert ca.issue_host(other, tmp_path / "b", "h", ["h"], days=90, renew_days=10).issued


def test_a_renewal_threshold_not_below_the_lifetime_is_refused(tmp_path):
    with pytest.raises(InputError, match="gpumon_tls_renew_days"):
        ca.issue_host(ca.ensure_ca(tmp_path), tmp_path, "h", ["h"], days=30, renew_days=30)


# ---------------------------------------------------------------- the password's hash


def test_the_hash_is_kept_while_it_verifies_the_password(tmp_path):
    record = tmp_path / "hash"
    first = password_hash("pw-one-1234", record)
    assert password_hash("pw-one-1234", record) == first
    assert bcrypt.checkpw(b"pw-one-1234", first.encode())
    assert mode(record) == 0o600


def test_a_changed_password_gets_a_new_hash(tmp_path):
    record = tmp_path / "hash"
    first = password_hash("pw-one-1234", record)
    second = password_hash("pw-two-5678", record)
    assert second != first and bcrypt.checkpw(b"pw-two-5678", second.encode())


# ---------------------------------------------------------------- both ends rendered


def plan(tmp_path: Path, plays: str, *extra: str) -> dict[str, dict[str, dict]]:
    """host -> task name -> planned task, as ``up`` plans them (handlers included)."""
    inv = tmp_path / "inventory.yml"
    inv.write_text(INVENTORY)
    site = tmp_path / "site.yml"
    site.write_text(plays)
    session = DeploySession.load(RunOptions(inventory=inv, site=site, extra_vars=list(extra)))
    out: dict[str, dict[str, dict]] = {}
    for hp in session.plans:
        for play in hp.plays:
            for t in [*play.tasks, *play.handlers.values()]:
                out.setdefault(hp.host, {}).setdefault(f"{t.role}: {t.name}", t)
    return out


def tls_on(tmp_path: Path) -> list[str]:
    return ["gpumon_tls=true", f"gpumon_tls_dir={tmp_path / 'ca'}"]


def find(tasks: dict, prefix: str):
    hits = [t for name, t in tasks.items() if name.startswith(prefix)]
    assert hits, f"no task {prefix!r} in {sorted(tasks)}"
    return hits[0]


def test_without_the_switch_nothing_serves_or_scrapes_https(tmp_path):
    planned = plan(tmp_path, MONITORING_PLAYS)
    config = yaml.safe_load(find(planned["prom01"], "prometheus: prometheus.yml").args["content"])
    assert all("scheme" not in job for job in config["scrape_configs"])
    unit = find(planned["prom01"], "prometheus: prometheus hardened unit").args
    assert not any("web.config" in f for f in exec_flags(planned_unit_text(unit)))
    assert not any("TLS" in name for name in planned["prom01"] if "thanos" not in name)
    assert not (tmp_path / "ca").exists()


def planned_unit_text(args: dict) -> str:
    return args.get("content") or args["src_content"]


def test_every_scrape_job_and_the_alertmanagers_go_over_https_with_basic_auth(tmp_path):
    planned = plan(tmp_path, MONITORING_PLAYS, *tls_on(tmp_path))
    config = yaml.safe_load(find(planned["prom01"], "prometheus: prometheus.yml").args["content"])
    client = {
        "scheme": "https",
        "tls_config": {"ca_file": "/etc/gpumon/tls/ca.pem"},
        "basic_auth": {
            "username": "gpumon",
            "password_file": "/etc/prometheus/tls/client-password",
        },
    }
    for job in config["scrape_configs"]:
        assert {k: job.get(k) for k in client} == client, job["job_name"]
    am = config["alerting"]["alertmanagers"][0]
    assert {k: am.get(k) for k in client} == client


def test_each_server_gets_a_web_config_with_its_certificate_and_the_hash(tmp_path):
    planned = plan(tmp_path, MONITORING_PLAYS + EXPORTER_PLAYS, *tls_on(tmp_path))
    password = (tmp_path / "ca" / "basic-auth-password").read_text().strip()
    for host, role, directory in [
        ("prom01", "prometheus", "/etc/prometheus/tls"),
        ("mon01", "alertmanager", "/etc/alertmanager/tls"),
        ("gpu01", "node_exporter", "/etc/node_exporter"),
    ]:
        task = find(planned[host], f"{role}: {role} web config")
        assert task.args["mode"] in ("0640", "640") and task.args["secret"] is True
        web = json.loads(task.args["content"])
        # one file: a renewal replaces the key and the certificate at once
        assert web["tls_server_config"]["cert_file"] == f"{directory}/server.pem"
        assert web["tls_server_config"]["key_file"] == f"{directory}/server.pem"
        assert bcrypt.checkpw(password.encode(), web["basic_auth_users"]["gpumon"].encode())
        key = find(planned[host], f"{role}: {role} private key and certificate")
        assert key.args["secret"] is True and key.args["mode"] in ("0640", "640")
        assert key.args["dest"] == f"{directory}/server.pem"
        assert "PRIVATE KEY" in key.args["content"] and "BEGIN CERTIFICATE" in key.args["content"]


def test_the_daemons_are_started_with_their_web_config(tmp_path):
    planned = plan(tmp_path, MONITORING_PLAYS + EXPORTER_PLAYS, *tls_on(tmp_path))
    prom = exec_flags(
        planned_unit_text(find(planned["prom01"], "prometheus: prometheus hardened").args)
    )
    assert "--web.config.file=/etc/prometheus/tls/web-config.yml" in prom
    am = exec_flags(
        planned_unit_text(find(planned["mon01"], "alertmanager: alertmanager hardened").args)
    )
    assert "--web.config.file=/etc/alertmanager/tls/web-config.yml" in am
    assert "--cluster.tls-config=/etc/alertmanager/tls/cluster-tls.yml" in am
    node = exec_flags(
        planned_unit_text(find(planned["gpu01"], "node_exporter: node_exporter hardened").args)
    )
    assert "--web.config.file=/etc/node_exporter/web-config.yml" in node


def test_node_exporter_before_1_5_takes_the_old_flag(tmp_path):
    planned = plan(tmp_path, EXPORTER_PLAYS, *tls_on(tmp_path), "node_exporter_version=1.4.0")
    node = exec_flags(
        planned_unit_text(find(planned["gpu01"], "node_exporter: node_exporter hardened").args)
    )
    assert "--web.config=/etc/node_exporter/web-config.yml" in node


def test_alertmanager_before_0_24_gossips_without_tls(tmp_path):
    planned = plan(tmp_path, MONITORING_PLAYS, *tls_on(tmp_path), "alertmanager_version=0.23.0")
    am = exec_flags(
        planned_unit_text(find(planned["mon01"], "alertmanager: alertmanager hardened").args)
    )
    assert "--web.config.file=/etc/alertmanager/tls/web-config.yml" in am
    assert not any(f.startswith("--cluster.tls-config") for f in am)


def test_the_roles_own_probes_and_reloads_use_https(tmp_path):
    planned = plan(tmp_path, MONITORING_PLAYS, *tls_on(tmp_path))
    reload = find(planned["prom01"], "prometheus: reload prometheus").args["cmd"]
    assert "-K /etc/gpumon/tls/curlrc" in reload and "https://127.0.0.1:9090/-/reload" in reload
    ready = find(planned["prom01"], "prometheus: prometheus answers /-/ready").args["url"]
    assert ready == "https://127.0.0.1:9090/-/ready"
    restart = find(planned["prom01"], "prometheus: restart prometheus")
    assert all(url.startswith("https://") for _, url in restart.ha_peers)


def test_the_password_is_in_secret_tasks_only(tmp_path):
    planned = plan(tmp_path, MONITORING_PLAYS + EXPORTER_PLAYS, *tls_on(tmp_path))
    password = (tmp_path / "ca" / "basic-auth-password").read_text().strip()
    holding = sorted(
        name
        for tasks in planned.values()
        for name, t in tasks.items()
        if password in json.dumps(t.args, default=str)
    )
    assert holding, "the clients need it somewhere"
    for tasks in planned.values():
        for name in holding:
            if name in tasks:
                assert tasks[name].args.get("secret") is True, name


def test_a_second_plan_renders_the_same_files(tmp_path):
    first = plan(tmp_path, MONITORING_PLAYS, *tls_on(tmp_path))
    material._CACHE.clear()
    second = plan(tmp_path, MONITORING_PLAYS, *tls_on(tmp_path))
    for name in ("prometheus: prometheus web config", "prometheus: prometheus private key"):
        assert (
            find(first["prom01"], name).args["content"]
            == find(second["prom01"], name).args["content"]
        )


# ---------------------------------------------------------------- bad input


def test_an_own_ca_without_the_host_certificate_names_the_host_and_the_key(tmp_path):
    authority = ca.ensure_ca(tmp_path / "mine")
    (tmp_path / "ca.pem").write_text(authority.cert_pem)
    with pytest.raises(InputError) as err:
        plan(
            tmp_path,
            MONITORING_PLAYS,
            *tls_on(tmp_path),
            f"gpumon_tls_ca_cert={tmp_path / 'ca.pem'}",
        )
    assert "gpumon_tls_cert" in str(err.value) and "host " in str(err.value)


def test_a_missing_certificate_file_names_the_host_and_the_key(tmp_path):
    authority = ca.ensure_ca(tmp_path / "mine")
    (tmp_path / "ca.pem").write_text(authority.cert_pem)
    with pytest.raises(InputError) as err:
        plan(tmp_path, MONITORING_PLAYS, *tls_on(tmp_path), f"gpumon_tls_ca_cert={tmp_path / 'ca.pem'}",
             f"gpumon_tls_cert={tmp_path / 'nope.pem'}", f"gpumon_tls_private_key={tmp_path / 'k.pem'}")  # fmt: skip
    text = str(err.value)
    assert "gpumon_tls_cert" in text and "does not exist" in text and "host " in text


def test_the_cli_exits_2_on_a_missing_certificate_and_touches_nothing(tmp_path):
    inv = tmp_path / "inventory.yml"
    inv.write_text(INVENTORY)
    (tmp_path / "ca.pem").write_text(ca.ensure_ca(tmp_path / "mine").cert_pem)
    result = subprocess.run(
        [sys.executable, "-m", "deployer.cli", "up", "-i", str(inv), "-e", "gpumon_tls=true",
         "-e", f"gpumon_tls_ca_cert={tmp_path / 'ca.pem'}", "-e", f"gpumon_tls_dir={tmp_path / 'ca'}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "gpumon_tls_cert" in result.stderr
    assert "no host was contacted" in result.stdout + result.stderr


def test_the_client_side_gets_the_ca_and_credentials(tmp_path):
    given = material.client(
        {"gpumon_tls": True, "gpumon_tls_dir": str(tmp_path), "inventory_hostname": "prom01"}
    )
    assert given is not None and given["username"] == "gpumon"
    assert given["ca_pem"] == (tmp_path / "ca.crt").read_text()
    assert mode(tmp_path / "basic-auth-password") == 0o600
    assert material.client({"inventory_hostname": "prom01"}) is None


# ---------------------------------------------------------------- the product's own client


class _Echo:
    """An https (or http) server answering 200 with the request's Authorization header, or 401."""

    def __init__(self, tmp_path: Path, tls: bool) -> None:
        import http.server
        import ssl
        import threading

        seen: list[str | None] = []
        self.seen = seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.headers.get("Authorization"))
                self.send_response(200 if seen[-1] else 401)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.authority = ca.ensure_ca(tmp_path / "echo-ca")
        if tls:
            issued = ca.issue_host(self.authority, tmp_path / "echo-ca", "echo", ["127.0.0.1"],
                                   days=10, renew_days=1)  # fmt: skip
            (tmp_path / "c.pem").write_text(issued.cert_pem)
            (tmp_path / "k.pem").write_text(issued.key_pem)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_client_verifies_the_tier_ca_and_sends_basic_auth_over_https(tmp_path):
    from deployer.monitoring.http import ClientTLS, http_fetch, use_tls

    echo = _Echo(tmp_path, tls=True)
    try:
        use_tls(ClientTLS(echo.authority.cert_pem, "gpumon", "client-pw-1"))
        r = http_fetch(f"https://127.0.0.1:{echo.port}/metrics")
        assert r.status == 200 and echo.seen[-1] and echo.seen[-1].startswith("Basic ")
        use_tls(ClientTLS(ca.ensure_ca(tmp_path / "other").cert_pem, "gpumon", "client-pw-1"))
        refused = http_fetch(f"https://127.0.0.1:{echo.port}/metrics")
        assert refused.status == 0 and "CERTIFICATE_VERIFY_FAILED" in (refused.error or "")
        assert "client-pw-1" not in (refused.error or "")
    finally:
        use_tls(None)
        echo.close()


def test_the_client_never_sends_the_password_over_plain_http(tmp_path):
    from deployer.monitoring.http import ClientTLS, http_fetch, use_tls

    echo = _Echo(tmp_path, tls=False)
    try:
        use_tls(ClientTLS(echo.authority.cert_pem, "gpumon", "client-pw-1"))
        assert http_fetch(f"http://127.0.0.1:{echo.port}/metrics").status == 401
        assert echo.seen == [None]
    finally:
        use_tls(None)
        echo.close()


def test_status_expects_https_urls_and_the_client_tls_when_the_switch_is_on(tmp_path):
    from deployer.monitoring.expect import expect

    planned_dir = tmp_path / "ca"
    base = {"gpumon_tls": True, "gpumon_tls_dir": str(planned_dir), "ansible_host": "10.0.0.1",
            "inventory_hostname": "am1", "alertmanager_port": 9093,
            "alertmanager_config_dir": "/etc/alertmanager", "alertmanager_advertise_address": "10.0.0.1",
            "alertmanager_cluster_port": 9094}  # fmt: skip
    material.client(base)  # what `up` wrote: status only reads it
    exp = expect({}, {"am1": base}, {})
    assert exp.alertmanagers[0].url == "https://10.0.0.1:9093"
    assert (
        exp.client_tls is not None and exp.client_tls.ca_pem == (planned_dir / "ca.crt").read_text()
    )
    plain = expect({}, {"am1": {**base, "gpumon_tls": False}}, {})
    assert plain.alertmanagers[0].url == "http://10.0.0.1:9093" and plain.client_tls is None


def test_the_readiness_probe_of_a_peer_tries_the_other_scheme_while_tls_is_switched():
    from deployer.executor import _readiness_probe

    probe = _readiness_probe("prom02", "https://10.0.0.2:9090/-/ready")
    assert "https://10.0.0.2:9090/-/ready" in probe and "http://10.0.0.2:9090/-/ready" in probe
    assert "-K /etc/gpumon/tls/curlrc" in probe


def test_thanos_serves_and_queries_over_tls(tmp_path):
    planned = plan(
        tmp_path, MONITORING_PLAYS, *tls_on(tmp_path), "thanos_enabled=true",
        "thanos_sha256=" + "0" * 64,
    )  # fmt: skip
    sidecar = exec_flags(
        planned_unit_text(find(planned["prom01"], "thanos_sidecar: thanos-sidecar hardened").args)
    )
    assert "--http.config=/etc/prometheus/tls/web-config.yml" in sidecar
    assert "--grpc-server-tls-client-ca=/etc/gpumon/tls/ca.pem" in sidecar
    assert "--prometheus.url=https://127.0.0.1:9090" in sidecar
    client = json.loads(
        find(planned["prom01"], "thanos_sidecar: thanos-sidecar's client").args["content"]
    )
    assert client["basic_auth"]["password_file"] == "/etc/prometheus/tls/client-password"
    query = exec_flags(
        planned_unit_text(find(planned["mon01"], "thanos_query: thanos-query hardened").args)
    )
    assert "--grpc-client-tls-secure" in query
    assert "--http.config=/etc/thanos-query/tls/web-config.yml" in query
    web = json.loads(
        find(planned["mon01"], "thanos_query: thanos-query web config").args["content"]
    )
    assert web["tls_server_config"]["cert_file"] == "/etc/thanos-query/tls/server.pem"


def test_the_readiness_wait_before_the_handlers_takes_either_scheme():
    from deployer.modules.wait_for import WaitFor

    module = WaitFor()
    probe = module.probe(
        module.validate({"url": "https://127.0.0.1:9093/-/ready", "any_scheme": True})
    )
    assert "https://127.0.0.1:9093/-/ready" in probe and "|| { b=$(curl" in probe
    assert "http://127.0.0.1:9093/-/ready" in probe
    plain = module.probe(module.validate({"url": "https://127.0.0.1:9093/-/ready"}))
    assert "http://127.0.0.1" not in plain


def _run_reload(tmp_path: Path, cmd: str, https_rc: int) -> tuple[int, list[str]]:
    """Run the reload handler's command with a stand-in curl (its https call exits ``https_rc``,
    its http call 0) and a readable curlrc; returns the exit status and the URLs it called."""
    bindir, calls = tmp_path / "bin", tmp_path / "calls"
    bindir.mkdir()
    (bindir / "curl").write_text(
        f'#!/bin/sh\nfor a; do case "$a" in http*) echo "$a" >> {calls};'
        f' case "$a" in https*) exit {https_rc};; esac;; esac; done\nexit 0\n'
    )
    (bindir / "curl").chmod(0o755)
    curlrc = tmp_path / "curlrc"
    curlrc.write_text("")
    cmd = cmd.replace("/etc/gpumon/tls/curlrc", str(curlrc))
    proc = subprocess.run(["sh", "-c", cmd], env={"PATH": f"{bindir}:/usr/bin:/bin"})
    return proc.returncode, calls.read_text().split() if calls.exists() else []


@pytest.mark.parametrize(
    ("https_rc", "want_rc", "http_tried"),
    [(0, 0, False), (28, 28, False), (7, 0, True)],
    ids=["https reloads", "an https reload that timed out is not retried over http",
         "no https answer: plain http"],
)  # fmt: skip
def test_the_reload_falls_back_to_http_only_when_https_got_no_answer(
    tmp_path, https_rc, want_rc, http_tried
):
    planned = plan(tmp_path, MONITORING_PLAYS, *tls_on(tmp_path))
    cmd = find(planned["prom01"], "prometheus: reload prometheus").args["cmd"]
    rc, urls = _run_reload(tmp_path, cmd, https_rc)
    assert rc == want_rc
    assert urls[0] == "https://127.0.0.1:9090/-/reload"
    assert ("http://127.0.0.1:9090/-/reload" in urls) == http_tried
