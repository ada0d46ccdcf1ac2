"""Rotation of gpumon_tls' basic-auth credential and CA in three steps (widen, switch, narrow), so
that no client ever sends what its server refuses, nor meets a certificate it does not trust."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import bcrypt
import pytest
import yaml
from click.testing import CliRunner
from cryptography import x509

from deployer import cli
from deployer.results import RunReport
from deployer.tls import ca, material, rotation
from deployer.tls.hashing import password_hash
from tests.unit.test_monitoring_config import MONITORING_PLAYS
from tests.unit.test_tls import EXPORTER_PLAYS, find, plan, tls_on

OLD, NEW = "old-password-1234", "new-password-5678"


@pytest.fixture(autouse=True)
def _fresh():
    material.forget()
    yield
    material.forget()


def look(d: Path, password: str, ca_pem: str = "CA-ONE", base: str = "gpumon") -> rotation.View:
    rotation.forget()
    return rotation.view(d, base, password, ca_pem)


def ok(hashed: str, password: str) -> bool:
    return bcrypt.checkpw(password.encode(), hashed.encode())


def test_the_first_look_settles_on_the_asked_credential_in_a_0600_record(tmp_path):
    v = look(tmp_path, OLD)
    assert v.step == rotation.SETTLED and v.client.username == "gpumon"
    assert list(v.accepted) == ["gpumon"] and ok(v.accepted["gpumon"], OLD)
    assert stat.S_IMODE((tmp_path / rotation.RECORD).stat().st_mode) == 0o600


def test_your_own_ca_and_password_from_a_directory_not_made_yet_create_it_0700(tmp_path):
    # nothing else of the product is made there first: the record is the directory's first file
    own = ca.ensure_ca(tmp_path / "mine").cert_pem
    (tmp_path / "ca.pem").write_text(own)
    d = tmp_path / "not" / "made"
    v = {
        "gpumon_tls": True,
        "gpumon_tls_dir": str(d),
        "inventory_hostname": "prom01",
        "gpumon_tls_ca_cert": str(tmp_path / "ca.pem"),
        "gpumon_basic_auth_password": OLD,
    }
    client = material.client(v)
    assert client is not None and client["password"] == OLD
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE((d / rotation.RECORD).stat().st_mode) == 0o600


def test_the_hash_of_an_earlier_release_is_kept(tmp_path):
    kept = password_hash(OLD, tmp_path / rotation.LEGACY_HASH)
    assert look(tmp_path, OLD).accepted == {"gpumon": kept}


def test_a_settled_record_is_not_written_again(tmp_path):
    look(tmp_path, OLD)
    before = (tmp_path / rotation.RECORD).read_bytes()
    assert look(tmp_path, OLD).step == rotation.SETTLED
    assert (tmp_path / rotation.RECORD).read_bytes() == before


def test_a_new_password_first_widens_the_servers_while_clients_send_the_old(tmp_path):
    look(tmp_path, OLD)
    v = look(tmp_path, NEW)
    assert v.step == "widen"
    assert sorted(v.accepted) == ["gpumon", "gpumon-2"]
    assert ok(v.accepted["gpumon"], OLD) and ok(v.accepted["gpumon-2"], NEW)
    assert (v.client.username, v.client.password) == ("gpumon", OLD)


def test_then_clients_switch_while_servers_still_accept_both(tmp_path):
    look(tmp_path, OLD)
    look(tmp_path, NEW)
    assert rotation.advance(tmp_path) == "switch"
    v = look(tmp_path, NEW)
    assert sorted(v.accepted) == ["gpumon", "gpumon-2"]
    assert (v.client.username, v.client.password) == ("gpumon-2", NEW)
    assert v.client.password_file == "client-password-2"


def test_then_the_old_credential_is_dropped_and_the_next_look_is_settled(tmp_path):
    look(tmp_path, OLD)
    look(tmp_path, NEW)
    rotation.advance(tmp_path)
    assert rotation.advance(tmp_path) == "narrow"
    narrow = look(tmp_path, NEW)
    assert list(narrow.accepted) == ["gpumon-2"] and narrow.client.password == NEW
    assert rotation.advance(tmp_path) == rotation.SETTLED
    settled = look(tmp_path, NEW)
    assert (settled.accepted, settled.client, settled.trusted) == (
        narrow.accepted,
        narrow.client,
        narrow.trusted,
    )


def test_the_next_rotation_goes_back_to_the_first_slot(tmp_path):
    look(tmp_path, OLD)
    look(tmp_path, NEW)
    for _ in range(3):
        rotation.advance(tmp_path)
    v = look(tmp_path, "third-password-9")
    assert sorted(v.accepted) == ["gpumon", "gpumon-2"]
    assert ok(v.accepted["gpumon"], "third-password-9") and ok(v.accepted["gpumon-2"], NEW)


def test_a_password_changed_again_while_only_widened_replaces_the_new_end(tmp_path):
    look(tmp_path, OLD)
    look(tmp_path, NEW)
    v = look(tmp_path, "another-one-42")
    assert v.step == "widen" and ok(v.accepted["gpumon-2"], "another-one-42")
    assert v.client.password == OLD


def test_a_change_after_the_switch_waits_for_the_rotation_under_way(tmp_path):
    look(tmp_path, OLD)
    look(tmp_path, NEW)
    rotation.advance(tmp_path)
    v = look(tmp_path, "another-one-42")
    assert v.step == "switch" and v.client.password == NEW and ok(v.accepted["gpumon"], OLD)


def test_a_new_ca_is_trusted_before_any_server_presents_it(tmp_path):
    look(tmp_path, OLD, "CA-ONE")
    widen = look(tmp_path, OLD, "CA-TWO")
    assert widen.step == "widen" and widen.trusted == ("CA-ONE\n", "CA-TWO\n")
    assert widen.serving_ca == "CA-ONE\n" and list(widen.accepted) == ["gpumon"]
    rotation.advance(tmp_path)
    switch = look(tmp_path, OLD, "CA-TWO")
    assert switch.serving_ca == "CA-TWO\n" and switch.trusted == ("CA-ONE\n", "CA-TWO\n")
    assert switch.client.username == "gpumon"  # the password did not change: same slot
    rotation.advance(tmp_path)
    assert look(tmp_path, OLD, "CA-TWO").trusted == ("CA-TWO\n",)


def test_the_record_is_refused_when_others_can_read_it(tmp_path):
    look(tmp_path, OLD)
    (tmp_path / rotation.RECORD).chmod(0o644)
    with pytest.raises(Exception, match="readable by others"):
        look(tmp_path, NEW)


# ---------------------------------------------------------------- what the roles render


def prom_config(planned: dict) -> dict:
    return yaml.safe_load(find(planned["prom01"], "prometheus: prometheus.yml").args["content"])


def test_a_rotation_renders_both_users_then_the_new_client_file_then_the_new_user_alone(tmp_path):
    d = tmp_path / "ca"
    plays = MONITORING_PLAYS + EXPORTER_PLAYS
    plan(tmp_path, plays, *tls_on(tmp_path), f"gpumon_basic_auth_password={OLD}")
    material.forget()
    widen = plan(tmp_path, plays, *tls_on(tmp_path), f"gpumon_basic_auth_password={NEW}")
    web = json.loads(
        find(widen["gpu01"], "node_exporter: node_exporter web config").args["content"]
    )
    assert sorted(web["basic_auth_users"]) == ["gpumon", "gpumon-2"]
    job = prom_config(widen)["scrape_configs"][0]["basic_auth"]
    assert job == {"username": "gpumon", "password_file": "/etc/prometheus/tls/client-password"}
    rotation.advance(d)
    material.forget()
    switch = plan(tmp_path, plays, *tls_on(tmp_path), f"gpumon_basic_auth_password={NEW}")
    job = prom_config(switch)["scrape_configs"][0]["basic_auth"]
    assert job == {"username": "gpumon-2", "password_file": "/etc/prometheus/tls/client-password-2"}
    written = find(switch["prom01"], "prometheus: prometheus's basic-auth password").args
    assert written["dest"].endswith("/client-password-2") and written["content"] == NEW
    rotation.advance(d)
    material.forget()
    narrow = plan(tmp_path, plays, *tls_on(tmp_path), f"gpumon_basic_auth_password={NEW}")
    web = json.loads(
        find(narrow["gpu01"], "node_exporter: node_exporter web config").args["content"]
    )
    assert list(web["basic_auth_users"]) == ["gpumon-2"]
    gone = find(narrow["prom01"], "prometheus: the retired credential's password file absent")
    assert gone.args["path"] == "/etc/prometheus/tls/client-password"


def test_a_recreated_ca_keeps_the_old_certificates_until_clients_trust_both(tmp_path):
    d = tmp_path / "ca"
    plays = MONITORING_PLAYS
    plan(tmp_path, plays, *tls_on(tmp_path))
    first = x509.load_pem_x509_certificate((d / "hosts" / "prom01.crt").read_bytes())
    old_ca = (d / "ca.crt").read_text()
    (d / "ca.key").unlink()
    (d / "ca.crt").unlink()
    material.forget()
    widen = plan(tmp_path, plays, *tls_on(tmp_path))
    bundle = find(widen["prom01"], "prometheus: the tier's CA certificate").args["content"]
    new_ca = (d / "ca.crt").read_text()
    assert new_ca != old_ca and rotation.normal_pem(old_ca) + rotation.normal_pem(new_ca) == bundle
    served = find(widen["prom01"], "prometheus: prometheus private key and certificate")
    assert first.public_bytes(ca.serialization.Encoding.PEM).decode() in served.args["content"]
    rotation.advance(d)
    material.forget()
    switch = plan(tmp_path, plays, *tls_on(tmp_path))
    served = find(switch["prom01"], "prometheus: prometheus private key and certificate")
    cert = x509.load_pem_x509_certificate(
        served.args["content"].split("-----END PRIVATE KEY-----\n")[1].encode()
    )
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(new_ca.encode()))
    rotation.advance(d)
    material.forget()
    narrow = plan(tmp_path, plays, *tls_on(tmp_path))
    ca_file = find(narrow["prom01"], "prometheus: the tier's CA certificate").args["content"]
    assert ca_file == rotation.normal_pem(new_ca)


# ---------------------------------------------------------------- one up runs the steps


class FakeSession:
    """Stands in for a DeploySession: each converge looks at the rotation as the roles would."""

    seen: list[str] = []
    fail = False

    def __init__(self, d: Path, password: str) -> None:
        self.d, self.password = d, password

    def converge(self, **_: object) -> RunReport:
        v = rotation.view(self.d, "gpumon", self.password, "CA-ONE")
        FakeSession.seen.append(v.step)
        report = RunReport()
        report.host("prom01").failed = FakeSession.fail
        return report


def run_up(monkeypatch, d: Path, password: str, *flags: str, fail: bool = False):
    FakeSession.seen, FakeSession.fail = [], fail
    monkeypatch.setattr(cli.DeploySession, "load", lambda options: FakeSession(d, password))
    return CliRunner().invoke(cli.cli, ["up", "-i", "inv.yml", *flags])


def test_one_up_runs_widen_switch_and_narrow_in_turn(tmp_path, monkeypatch):
    rotation.view(tmp_path, "gpumon", OLD, "CA-ONE")
    result = run_up(monkeypatch, tmp_path, NEW)
    assert FakeSession.seen == ["widen", "switch", "narrow"], result.output
    assert rotation.step_of(tmp_path) == rotation.SETTLED and result.exit_code == 0
    assert OLD not in result.output and NEW not in result.output


def test_an_up_without_a_change_runs_once(tmp_path, monkeypatch):
    rotation.view(tmp_path, "gpumon", OLD, "CA-ONE")
    run_up(monkeypatch, tmp_path, OLD)
    assert FakeSession.seen == [rotation.SETTLED]


def test_a_failed_pass_leaves_the_step_for_the_next_up(tmp_path, monkeypatch):
    rotation.view(tmp_path, "gpumon", OLD, "CA-ONE")
    result = run_up(monkeypatch, tmp_path, NEW, fail=True)
    assert FakeSession.seen == ["widen"] and result.exit_code == 1
    assert rotation.step_of(tmp_path) == "widen"


def test_a_limited_up_does_not_move_the_rotation(tmp_path, monkeypatch):
    rotation.view(tmp_path, "gpumon", OLD, "CA-ONE")
    result = run_up(monkeypatch, tmp_path, NEW, "--limit", "prom01")
    assert FakeSession.seen == ["widen"] and rotation.step_of(tmp_path) == "widen"
    assert "stays at step 'widen'" in result.output


def test_the_dcgm_exporter_web_config_takes_every_accepted_user(tmp_path):
    from tests.unit.test_gpu_roles import H100, task
    from tests.unit.test_gpu_roles import planned as gpu_planned

    d = tmp_path / "ca"
    base = {**H100, "gpumon_tls": True, "gpumon_tls_dir": str(d), "inventory_hostname": "g1"}
    gpu_planned({**base, "gpumon_basic_auth_password": OLD})
    material.forget()
    tasks = gpu_planned({**base, "gpumon_basic_auth_password": NEW})
    users = yaml.safe_load(task(tasks, "web configuration \\(TLS").args["content"])
    assert sorted(users["basic_auth_users"]) == ["gpumon", "gpumon-2"]
    assert ok(users["basic_auth_users"]["gpumon-2"], NEW)


def test_the_gossip_reads_its_own_copy_of_the_ca_and_a_change_restarts_the_peer(tmp_path):
    d = tmp_path / "ca"
    plan(tmp_path, MONITORING_PLAYS, *tls_on(tmp_path))
    (d / "ca.key").unlink()
    (d / "ca.crt").unlink()
    material.forget()
    widen = plan(tmp_path, MONITORING_PLAYS, *tls_on(tmp_path))
    copy = find(widen["mon01"], "alertmanager: alertmanager cluster CA")
    assert copy.args["content"].count("BEGIN CERTIFICATE") == 2
    assert "restart alertmanager" in copy.notify
    cluster = json.loads(
        find(widen["mon01"], "alertmanager: alertmanager cluster TLS").args["content"]
    )
    assert cluster["tls_server_config"]["client_ca_file"] == "/etc/alertmanager/tls/cluster-ca.pem"
    assert cluster["tls_client_config"]["ca_file"] == "/etc/alertmanager/tls/cluster-ca.pem"


def own_ca(tmp_path: Path, name: str) -> list[str]:
    """-e settings of a CA of one's own (made here with the product's CA code) for prom01."""
    d = tmp_path / name
    authority = ca.ensure_ca(d, name)
    issued = ca.issue_host(authority, d, "prom01", ["prom01"], days=30, renew_days=5)
    (d / "prom01.pem").write_text(issued.cert_pem)
    key = d / "prom01-key.pem"
    key.write_text(issued.key_pem)
    key.chmod(0o600)
    return [
        f"gpumon_tls_ca_cert={d / 'ca.crt'}",
        f"gpumon_tls_cert={d / 'prom01.pem'}",
        f"gpumon_tls_private_key={key}",
    ]


def test_an_own_ca_replaced_keeps_the_host_on_its_old_certificate_until_clients_trust_both(
    tmp_path,
):
    plays = "- name: Prometheus\n  hosts: prom01\n  roles: [prometheus]\n"
    first = own_ca(tmp_path, "one")
    plan(tmp_path, plays, *tls_on(tmp_path), *first)
    old_cert = (tmp_path / "one" / "prom01.pem").read_text()
    second = own_ca(tmp_path, "two")
    material.forget()
    widen = plan(tmp_path, plays, *tls_on(tmp_path), *second)
    served = find(widen["prom01"], "prometheus: prometheus private key and certificate")
    assert old_cert in served.args["content"]
    bundle = find(widen["prom01"], "prometheus: the tier's CA certificate").args["content"]
    assert bundle.count("BEGIN CERTIFICATE") == 2
    rotation.advance(tmp_path / "ca")
    material.forget()
    switch = plan(tmp_path, plays, *tls_on(tmp_path), *second)
    served = find(switch["prom01"], "prometheus: prometheus private key and certificate")
    assert (tmp_path / "two" / "prom01.pem").read_text() in served.args["content"]
    stat_ = (tmp_path / "ca" / "served" / "prom01.pem").stat()
    assert stat.S_IMODE(stat_.st_mode) == 0o600
