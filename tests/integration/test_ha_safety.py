"""The HA pair's safety on the lab, through the real CLI and the replicas' own HTTP APIs (issue 12):

- a reload lost to a failed run (a valid rule change and a config promtool refuses) is made by
  the next run, which changes nothing else: both replicas then evaluate the same, new rules;
- a daemon flag Prometheus would refuse fails before any host is touched (exit 2); an unknown
  flag is refused by Prometheus' own parser before the unit file is replaced; a flag value that
  crash-loops the replica fails the run within seconds with the unit's journal, the other
  replica untouched;
- with one replica stopped, a change that needs a restart of the other is refused, that replica
  untouched and still serving;
- check mode predicts no change for the waits (as many changes as the real run makes).

Runs on the session ``lab`` fixture. While developing, ``GPUMON_HA_LAB=<name>`` runs it on a lab
of that name that is already up instead (it is neither started nor stopped here).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployer.lab import Lab
from deployer.monitoring.http import http_fetch
from tests.integration.labtools import infra, lab_named_by, run_cli, wait_until, write_ssh_config

pytestmark = pytest.mark.lab

gpumon = functools.partial(run_cli, timeout=900)

# A valid rule change (the warning threshold of GPUTemperatureHigh, 85 by default) and a
# prometheus.yml that promtool refuses (a scrape timeout longer than the interval).
RULE_CHANGE = ["-e", "prometheus_rules_gpu_temp_warning_celsius=84"]
CONFIG_PROMTOOL_REFUSES = [
    "-e",
    "prometheus_scrape_interval=5s",
    "-e",
    "prometheus_scrape_timeout=10s",
]
# A flag whose value Prometheus' parser refuses at start, which no check before the start can
# see: passed through prometheus_extra_flags, whose values only the flag's own type knows, and
# accepted by `prometheus ... --version` (kingpin runs --version before it reports bad values).
CRASHING_FLAG = ["-e", json.dumps({"prometheus_extra_flags": ["--web.read-timeout=5x"]})]
UNKNOWN_FLAG = ["-e", json.dumps({"prometheus_extra_flags": ["--no-such-flag"]})]
# Any change of the unit's flags: it needs a restart.
RESTART_NEEDED = ["-e", "prometheus_retention_time=16d"]
# Seconds within which a crash loop must fail the run (the wait's own timeout is 300 s): one run
# of `up` on the lab takes 3 to 15 s; the rest is room for a loaded machine.
CRASH_DETECTED_WITHIN_S = 120


@pytest.fixture(scope="module")
def hlab(request: pytest.FixtureRequest) -> Lab:
    return lab_named_by("GPUMON_HA_LAB", request)


@pytest.fixture(scope="module")
def inventory(hlab: Lab) -> Path:
    return hlab.inventory_path


@pytest.fixture(scope="module")
def replicas(hlab: Lab) -> list[str]:
    names = [h.name for h in hlab.hosts if "prometheus" in h.groups]
    assert len(names) == 2, names
    return names


@pytest.fixture(scope="module")
def urls(hlab: Lab) -> dict[str, str]:
    return {h.name: f"http://{h.address}:9090" for h in hlab.hosts if "prometheus" in h.groups}


@pytest.fixture(scope="module")
def ssh(hlab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Any:
    config = write_ssh_config(hlab, tmp_path_factory.mktemp("ssh") / "config")
    return lambda host: infra(config, host)


def up(inventory: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    proc = gpumon("up", "-i", str(inventory), "--output", "json", *extra)
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, report, proc.stderr


@pytest.fixture(scope="module")
def deployed(inventory: Path) -> None:
    rc, _, err = up(inventory)
    assert rc == 0, err[-4000:]


@pytest.fixture
def converged_again(inventory: Path, urls: dict[str, str]) -> Iterator[None]:
    """After the test: the product's defaults converged again, both replicas serving."""
    yield
    rc, _, err = up(inventory)
    assert rc == 0, err[-4000:]
    for url in urls.values():
        assert http_fetch(f"{url}/-/ready").status == 200


def rules(url: str) -> dict[tuple[str, str], str]:
    r = http_fetch(f"{url}/api/v1/rules")
    assert r.error is None and r.status == 200, r
    return {
        (g["name"], rule["name"]): rule["query"]
        for g in r.json()["data"]["groups"]
        for rule in g["rules"]
    }


def unit_of(ssh: Any, host: str) -> tuple[str, str]:
    """The replica's running invocation and its unit file's hash."""
    h = ssh(host)
    invocation = h.check_output("systemctl show -p InvocationID --value prometheus.service")
    digest = h.check_output("sha256sum /etc/systemd/system/prometheus.service | cut -d' ' -f1")
    return invocation, digest


def tasks_of(report: dict[str, Any], host: str, role: str = "prometheus") -> list[dict[str, Any]]:
    return [t for t in report["hosts"][host]["tasks"] if t["role"] == role]


def failed_tasks(report: dict[str, Any], host: str) -> list[dict[str, Any]]:
    return [t for t in report["hosts"][host]["tasks"] if t["status"] == "failed"]


# ---------------------------------------------------------------- item 3: a lost reload


def test_a_reload_lost_to_a_failed_run_is_made_by_the_next_run_on_both_replicas(
    deployed, inventory, replicas, urls, converged_again
):
    first, second = replicas
    before = {h: rules(u) for h, u in urls.items()}
    assert before[first] == before[second]
    rc, report, _ = up(inventory, *RULE_CHANGE, *CONFIG_PROMTOOL_REFUSES)
    assert rc == 1
    changed = [t["task"] for t in tasks_of(report, first) if t["status"] == "changed"]
    assert any(t.startswith("rule file") for t in changed), changed
    assert [t["task"] for t in failed_tasks(report, first)] == [
        "prometheus.yml (checked by promtool before it replaces the live file)"
    ]
    assert not tasks_of(report, second)  # the serial play stopped before the other replica
    assert rules(urls[first]) == before[first]  # written on disk, not loaded: the reload is owed

    rc, report, err = up(inventory, *RULE_CHANGE)
    assert rc == 0, err[-4000:]
    reload = [t for t in tasks_of(report, first) if t["task"] == "reload prometheus"]
    assert len(reload) == 1 and reload[0]["status"] == "changed"
    assert reload[0]["owed_since"]  # owed by the failed run
    assert not [
        t for t in tasks_of(report, first) if t["status"] == "changed" and not t.get("handler")
    ]  # nothing else left to change there
    after = {h: rules(u) for h, u in urls.items()}
    assert after[first] == after[second] != before[first]
    assert any("> 84" in q for q in after[first].values())


# ---------------------------------------------------------------- item 6: daemon flags


def test_a_flag_value_prometheus_refuses_fails_before_any_host_is_touched(
    deployed, inventory, replicas, ssh
):
    units = {h: unit_of(ssh, h) for h in replicas}
    started = time.monotonic()
    proc = gpumon("up", "-i", str(inventory), "-e", "prometheus_retention_time=15x")
    assert proc.returncode == 2
    assert "prometheus_retention_time" in proc.stderr and "'15x'" in proc.stderr
    assert f"on host {replicas[0]}" in proc.stderr
    assert "--storage.tsdb.retention.time" in proc.stderr
    assert time.monotonic() - started < 60
    assert {h: unit_of(ssh, h) for h in replicas} == units


def test_an_unknown_flag_is_refused_by_prometheus_itself_before_the_unit_is_replaced(
    deployed, inventory, replicas, urls, ssh
):
    first, _ = replicas
    units = {h: unit_of(ssh, h) for h in replicas}
    rc, report, _ = up(inventory, *UNKNOWN_FLAG)
    assert rc == 1
    [failed] = failed_tasks(report, first)
    assert failed["task"] == "prometheus hardened unit, enabled and running"
    assert "refused by /usr/local/bin/prometheus itself" in failed["error"]
    assert "--no-such-flag" in failed["error"]
    assert {h: unit_of(ssh, h) for h in replicas} == units  # no unit replaced, none restarted
    for url in urls.values():
        assert http_fetch(f"{url}/-/ready").status == 200


def test_a_crash_looping_replica_fails_the_run_in_seconds_with_its_journal_lines(
    deployed, inventory, replicas, urls, ssh, converged_again
):
    first, second = replicas
    other = unit_of(ssh, second)
    other_config = ssh(second).check_output("sha256sum /etc/prometheus/prometheus.yml")
    started = time.monotonic()
    rc, report, _ = up(inventory, *CRASHING_FLAG)
    took = time.monotonic() - started
    assert rc == 1
    assert took < CRASH_DETECTED_WITHIN_S, f"the crash loop took {took:.0f}s to fail the run"
    [failed] = failed_tasks(report, first)
    error = failed["error"]
    assert "prometheus.service" in error
    assert "auto-restart" in error or "not coming up" in error
    assert 'not a valid duration string: "5x"' in error  # Prometheus' own words, from the journal
    assert "last journal lines of prometheus.service" in error
    # The other replica: neither its unit nor its config touched, still serving.
    assert not tasks_of(report, second)
    assert unit_of(ssh, second) == other
    assert ssh(second).check_output("sha256sum /etc/prometheus/prometheus.yml") == other_config
    assert http_fetch(f"{urls[second]}/-/ready").status == 200


# ---------------------------------------------------------------- item 7: look at the peer


@pytest.fixture
def second_replica_stopped(replicas: list[str], ssh: Any, inventory: Path) -> Iterator[str]:
    second = replicas[1]
    ssh(second).run("systemctl stop prometheus.service")
    yield second
    rc, _, err = up(inventory, "--limit", second)  # starts it again
    assert rc == 0, err[-4000:]


def test_a_restart_is_refused_while_the_other_replica_is_stopped(
    deployed, inventory, replicas, urls, ssh, converged_again, second_replica_stopped
):
    first, second = replicas
    unit = unit_of(ssh, first)
    rc, report, _ = up(inventory, *RESTART_NEEDED)
    assert rc == 1
    [failed] = failed_tasks(report, first)
    assert f"refused on {first}" in failed["error"]
    assert second in failed["error"] and "--allow-ha-degraded" in failed["error"]
    assert unit_of(ssh, first) == unit  # unit file as it was, same invocation
    assert http_fetch(f"{urls[first]}/-/ready").status == 200
    assert not tasks_of(report, second)
    assert ssh(second).run("systemctl is-active prometheus.service").stdout.strip() != "active"


def test_allow_ha_degraded_restarts_with_the_other_replica_stopped(
    deployed, inventory, replicas, urls, ssh, converged_again, second_replica_stopped
):
    first, _ = replicas
    invocation, _ = unit_of(ssh, first)
    rc, _, err = up(inventory, "--limit", first, "--allow-ha-degraded", *RESTART_NEEDED)
    assert rc == 0, err[-4000:]
    assert unit_of(ssh, first)[0] != invocation
    wait_until(
        "restarted replica ready", lambda: http_fetch(f"{urls[first]}/-/ready").status == 200, 60
    )


# ---------------------------------------------------------------- item 8: check mode


def test_check_mode_predicts_as_many_changes_as_the_real_run_makes(deployed, inventory, replicas):
    proc = gpumon("up", "-i", str(inventory), "--check", "--output", "json", *RESTART_NEEDED)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    for host in replicas:
        predicted = [t["task"] for t in tasks_of(report, host) if t["status"] == "changed"]
        # The unit and its restart; the waits after them (prometheus answers /-/ready, ready
        # after restart) read only and predict nothing.
        assert predicted == ["prometheus hardened unit, enabled and running", "restart prometheus"]
    assert report["totals"]["changed"] == 2 * len(replicas)
