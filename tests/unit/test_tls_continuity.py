"""A controller without the tier's TLS directory refuses to replace the CA the hosts trust
(deployer/tls/continuity.py): a new machine, a lost or mistyped ``gpumon_tls_dir`` would
otherwise push a new CA and password, and every scrape would fail until the last host had them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.errors import InputError
from deployer.facts import HostFacts
from deployer.session import DeploySession, RunOptions
from deployer.tls import ca, continuity, material
from tests.unit.test_monitoring_config import INVENTORY, MONITORING_PLAYS


@pytest.fixture(autouse=True)
def _fresh_process_state():
    """Each test is a new run: what a process saw and computed is forgotten."""
    material._SIGHTS.clear()
    material.forget()
    yield
    material._SIGHTS.clear()
    material.forget()


def tier(d: Path, host: str = "prom01", **more: object) -> dict[str, object]:
    return {"gpumon_tls": True, "gpumon_tls_dir": str(d), "inventory_hostname": host, **more}


def deployed_ca(tmp_path: Path) -> str:
    """The CA bundle hosts of a tier deployed from another controller directory trust."""
    client = material.client(tier(tmp_path / "the-tiers-own"))
    assert client is not None
    material._SIGHTS.clear()
    material.forget()
    return client["ca_pem"]


def test_a_directory_without_credentials_is_refused_for_a_host_that_trusts_a_ca(tmp_path):
    trusted = deployed_ca(tmp_path)
    lost = tmp_path / "lost"
    [found] = continuity.unknown_cas({"gpu01": (tier(lost, "gpu01"), trusted)})
    assert (found.host, found.directory) == ("gpu01", lost)
    assert "gpumon monitoring CA" in found.message and "SHA-256" in found.message
    assert str(lost) in found.message and "/etc/gpumon/tls/ca.pem" in found.message
    assert "restore" in found.fix and "gpumon_tls_start_over=true" in found.fix
    assert not lost.exists()  # judging writes nothing


def test_the_directory_the_tier_was_deployed_with_is_not_refused(tmp_path):
    trusted = deployed_ca(tmp_path)
    assert continuity.unknown_cas({"gpu01": (tier(tmp_path / "the-tiers-own"), trusted)}) == []


def test_a_directory_of_a_version_before_the_rotation_record_counts_as_holding_them(tmp_path):
    d = tmp_path / "older"
    ca.ensure_ca(d)  # the CA and its password, no rotation.json
    assert continuity.unknown_cas({"gpu01": (tier(d), "-----BEGIN CERTIFICATE-----\n")}) == []


def test_a_host_the_tier_never_reached_is_not_refused(tmp_path):
    assert continuity.unknown_cas({"gpu09": (tier(tmp_path / "new"), None)}) == []


def test_tls_off_is_not_refused(tmp_path):
    trusted = deployed_ca(tmp_path)
    off = tier(tmp_path / "new", gpumon_tls=False)
    assert continuity.unknown_cas({"gpu01": (off, trusted)}) == []


def test_starting_over_on_purpose_is_not_refused(tmp_path):
    trusted = deployed_ca(tmp_path)
    again = tier(tmp_path / "new", gpumon_tls_start_over="true")
    assert continuity.unknown_cas({"gpu01": (again, trusted)}) == []


def test_your_own_ca_and_password_unchanged_are_not_refused_but_a_new_password_is(tmp_path):
    own = ca.ensure_ca(tmp_path / "mine").cert_pem
    (tmp_path / "ca.pem").write_text(own)
    mine = tier(tmp_path / "new", gpumon_tls_ca_cert=str(tmp_path / "ca.pem"))
    given = {**mine, "gpumon_basic_auth_password": "pw-kept-1234"}
    assert continuity.unknown_cas({"gpu01": (given, own)}) == []
    [found] = continuity.unknown_cas({"gpu01": (mine, own)})  # a generated password: new
    assert found.host == "gpu01"


def test_with_a_long_term_store_your_own_ca_and_password_also_need_the_stores(tmp_path):
    """The tier makes the store's password too: a new one would have the store refuse the
    replicas' writes (Prometheus drops a batch answered 401) until every replica had it."""
    own = ca.ensure_ca(tmp_path / "mine").cert_pem
    (tmp_path / "ca.pem").write_text(own)
    given = tier(
        tmp_path / "new",
        gpumon_tls_ca_cert=str(tmp_path / "ca.pem"),
        gpumon_basic_auth_password="pw-kept-1234",
    )

    def store(group: str) -> bool:
        return group == "metrics_store"

    [found] = continuity.unknown_cas({"prom01": (given, own)}, store)
    assert found.store_only and "metrics_store_password" in found.message
    assert "refuse the replicas' writes" in found.message
    kept = {**given, "metrics_store_password": "store-pw-kept-5678"}
    assert continuity.unknown_cas({"prom01": (kept, own)}, store) == []
    no_auth = {**given, "metrics_store_username": ""}
    assert continuity.unknown_cas({"prom01": (no_auth, own)}, store) == []
    elsewhere = {**given, "metrics_store_group": "vm"}  # a store group with no host
    assert continuity.unknown_cas({"prom01": (elsewhere, own)}, store) == []


def test_what_the_run_created_in_a_new_directory_is_removed_whole(tmp_path):
    d = tmp_path / "secrets" / "tls" / "default"
    assert material.client(tier(d)) is not None and (d / "ca.key").exists()
    removed = material.discard_created(d)
    assert "ca.key" in removed and "rotation.json" in removed
    assert not d.exists() and (tmp_path / "secrets" / "tls").exists()


def test_in_a_directory_that_existed_only_what_the_run_created_is_removed(tmp_path):
    d = tmp_path / "tls"
    (d / "notes").mkdir(parents=True)
    (d / "README").write_text("the operator's own\n")
    material.client(tier(d))
    material.discard_created(d)
    assert sorted(p.name for p in d.rglob("*")) == ["README", "notes"]


def test_status_reads_and_never_creates_the_tiers_credentials(tmp_path):
    d = tmp_path / "mistyped"
    with pytest.raises(InputError, match="holds no credential") as err:
        material.client(tier(d), create=False)
    assert err.value.key == "gpumon_tls_dir" and str(d) in str(err.value)
    assert not d.exists()


class ReadOnly:
    """The hosts' facts as gather_facts would read them (each host's CA bundle, None: none),
    and which hosts were read."""

    def __init__(self, session: DeploySession, cas: dict[str, str | None]) -> None:
        self.session, self.cas, self.read = session, cas, []

    def __call__(self, hosts: list[str], forks: int = 0, first_reads: object = None) -> dict:
        self.read += hosts
        for h in hosts:
            self.session.facts[h] = HostFacts(h, tls_ca_pem=self.cas.get(h))
        return self.session.facts


def session_with_facts(
    tmp_path: Path,
    facts_ca: str | None,
    *extra: str,
    limit: str = "monitoring",
    inventory: str = INVENTORY,
) -> DeploySession:
    """A session of the monitoring hosts (``limit``), their facts read with ``facts_ca``; the
    GPU hosts' facts (if read) too."""
    inv = tmp_path / "inventory.yml"
    inv.write_text(inventory)
    site = tmp_path / "site.yml"
    site.write_text(MONITORING_PLAYS)
    options = RunOptions(inventory=inv, site=site, extra_vars=list(extra), limit=limit)
    session = DeploySession.load(options)
    session.gather_facts = ReadOnly(session, dict.fromkeys(session.inventory.hosts, facts_ca))
    session.gather_facts(session.hosts)
    return session


def test_up_is_refused_before_anything_is_touched_and_leaves_no_new_ca_behind(tmp_path):
    trusted = deployed_ca(tmp_path)
    lost = tmp_path / "lost"
    session = session_with_facts(tmp_path, trusted, "gpumon_tls=true", f"gpumon_tls_dir={lost}")
    assert (lost / "ca.key").exists()  # planning issued the certificates of a new CA
    refused = session.preflight(offline=False)
    # the monitoring hosts of the run, and the GPU hosts of the same directory, read for it
    assert {r.host for r in refused} == {"prom01", "prom02", "mon01", "gpu01", "gpu02"}
    assert {r.rule for r in refused} == {"tls-dir-unknown"}
    assert not lost.exists()  # so the next run is refused too, not handed the new CA


def test_up_from_the_directory_the_tier_was_deployed_with_goes_on(tmp_path):
    trusted = deployed_ca(tmp_path)
    own = tmp_path / "the-tiers-own"
    session = session_with_facts(tmp_path, trusted, "gpumon_tls=true", f"gpumon_tls_dir={own}")
    assert session.preflight(offline=False) == []


def test_the_first_up_with_tls_goes_on(tmp_path):
    new = tmp_path / "new"
    session = session_with_facts(tmp_path, None, "gpumon_tls=true", f"gpumon_tls_dir={new}")
    assert session.preflight(offline=False) == [] and (new / "ca.key").exists()


def test_a_run_limited_to_a_new_host_reads_the_ca_the_rest_of_the_tier_trusts(tmp_path):
    """A new host added from a new controller: it trusts no CA yet, but the tier does."""
    trusted = deployed_ca(tmp_path)
    lost = tmp_path / "lost"
    session = session_with_facts(
        tmp_path, None, "gpumon_tls=true", f"gpumon_tls_dir={lost}", limit="mon01"
    )
    session.gather_facts.cas = {"prom01": trusted, "prom02": trusted}
    refused = session.preflight(offline=False)
    assert {r.host for r in refused} == {"prom01", "prom02"}
    assert set(session.gather_facts.read) == {"mon01", "prom01", "prom02", "gpu01", "gpu02"}
    assert not lost.exists()


def test_up_with_your_own_ca_and_password_and_a_store_is_refused_for_the_stores(tmp_path):
    mine = ca.ensure_ca(tmp_path / "mine")
    own = mine.cert_pem
    (tmp_path / "ca.pem").write_text(own)
    issued = ca.issue_host(mine, tmp_path / "mine", "any", ["any"], days=30, renew_days=7)
    (tmp_path / "host.pem").write_text(issued.cert_pem)
    (tmp_path / "host.key").write_text(issued.key_pem)
    (tmp_path / "host.key").chmod(0o600)
    new = tmp_path / "new"
    settings = (
        "gpumon_tls=true",
        f"gpumon_tls_dir={new}",
        f"gpumon_tls_ca_cert={tmp_path}/ca.pem",
        f"gpumon_tls_cert={tmp_path}/host.pem",
        f"gpumon_tls_private_key={tmp_path}/host.key",
        "gpumon_basic_auth_password=pw-kept-1234",
    )
    inv = INVENTORY + "    metrics_store:\n      hosts: {mon01: {}}\n"
    session = session_with_facts(tmp_path, own, *settings, inventory=inv)
    refused = session.preflight(offline=False)
    assert {r.host for r in refused} == {"prom01", "prom02", "mon01", "gpu01", "gpu02"}
    assert all("long-term store" in r.message for r in refused)
    material._SIGHTS.clear()
    material.forget()
    given = session_with_facts(
        tmp_path, own, *settings, "metrics_store_password=store-pw-5678", inventory=inv
    )
    assert given.preflight(offline=False) == []


def test_a_directory_that_holds_the_credentials_reads_no_other_host(tmp_path):
    trusted = deployed_ca(tmp_path)
    own = tmp_path / "the-tiers-own"
    session = session_with_facts(
        tmp_path, trusted, "gpumon_tls=true", f"gpumon_tls_dir={own}", limit="mon01"
    )
    assert session.preflight(offline=False) == []
    assert session.gather_facts.read == ["mon01"]


def test_a_directory_mistyped_as_a_busy_one_loses_nothing_of_others(tmp_path):
    """Only the product's own names are listed and removed: another program's file, made while
    the run planned, stays."""
    busy = tmp_path / "busy"
    (busy / "hosts").mkdir(parents=True)
    (busy / "hosts" / "someone-elses").write_text("x")
    material.client(tier(busy))
    (busy / "written-meanwhile").write_text("another program's\n")
    removed = material.discard_created(busy)
    assert "written-meanwhile" not in removed and (busy / "written-meanwhile").exists()
    assert (busy / "hosts" / "someone-elses").exists() and not (busy / "ca.key").exists()
