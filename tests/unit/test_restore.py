"""``gpumon-deploy restore``: the steps it plans from the store host's variables, and how it runs
them (stops at the first failure, says what state the store is in, masks its output)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployer import restore
from deployer.errors import InputError
from deployer.secrets import MASK, register_secret
from tests.unit.test_victoriametrics_role import INVENTORY, SECRETS


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory):
    inv = tmp_path_factory.mktemp("restore") / "inventory.yml"
    inv.write_text(INVENTORY)
    _session, found = restore.store_variables(inv, [json.dumps(SECRETS)])
    return inv, found


def test_every_store_host_of_the_site_is_a_candidate(stores):
    _inv, found = stores
    assert list(found) == ["mon01", "mon02"]


def test_several_store_hosts_need_host(stores):
    inv, found = stores
    with pytest.raises(InputError, match="--host"):
        restore.choose_host(found, None, str(inv))
    assert restore.choose_host(found, "mon02", str(inv)) == "mon02"
    with pytest.raises(InputError, match="not a store host"):
        restore.choose_host(found, "prom01", str(inv))


def test_steps_stop_backups_and_the_store_restore_then_start_both(stores):
    _inv, found = stores
    plan = restore.plan("mon01", found["mon01"])
    assert [s.name for s in plan.steps] == [
        "backup timer stopped, no backup running",
        "victoria-metrics stopped",
        "vmrestore from s3://dr-bucket/gpumon/mon01/latest",
        "victoria-metrics started",
        "victoria-metrics answers /health",
        "backup timer started (next backup one interval from now)",
    ]
    vmrestore = plan.steps[2].command
    for part in (
        "systemd-run --wait --pipe",
        "--uid=_victoria-metrics",
        "ReadWritePaths=/var/lib/victoria-metrics",
        "/usr/bin/vmrestore -src=s3://dr-bucket/gpumon/mon01/latest",
        "-storageDataPath=/var/lib/victoria-metrics",
        "-credsFilePath=/etc/victoria-metrics/backup-s3-credentials",
        "-customS3Endpoint=http://192.0.2.99:9000",
    ):
        assert part in vmrestore, part


def test_a_running_backup_is_waited_for_never_stopped(stores):
    _inv, found = stores
    first = restore.plan("mon01", found["mon01"]).steps[0].command
    assert first.startswith("systemctl stop gpumon-vmbackup.timer && ")
    assert "stop gpumon-vmbackup.service" not in first
    assert "is-active -q gpumon-vmbackup.service" in first


def test_no_secret_in_any_step(stores):
    _inv, found = stores
    text = " ".join(s.command for s in restore.plan("mon01", found["mon01"]).steps)
    for value in SECRETS.values():
        if "secret" in value or "Pa55" in value or value.startswith("AKIA"):
            assert value not in text


@pytest.mark.parametrize(
    ("given", "want"),
    [
        (None, "s3://dr-bucket/gpumon/mon01/latest"),
        ("gpumon/old-host/latest", "s3://dr-bucket/gpumon/old-host/latest"),
        ("s3://other/x", "s3://other/x"),
    ],
)
def test_from_names_another_backup(stores, given, want):
    _inv, found = stores
    assert restore.plan("mon01", found["mon01"], given).source == want


def test_a_location_that_is_not_a_backup_is_refused(stores):
    _inv, found = stores
    with pytest.raises(InputError, match="--from"):
        restore.plan("mon01", found["mon01"], "http://x/y")


def test_without_a_bucket_there_is_nothing_to_restore(tmp_path: Path):
    inv = tmp_path / "inventory.yml"
    inv.write_text(INVENTORY)
    _s, found = restore.store_variables(inv)
    with pytest.raises(InputError, match="backups are not configured"):
        restore.plan("mon01", found["mon01"])


def test_execution_stops_at_the_first_failure_and_says_what_to_do(stores):
    _inv, found = stores
    plan = restore.plan("mon01", found["mon01"])
    ran, said = [], []

    def run(command: str, timeout: float) -> tuple[int, str]:
        ran.append(command)
        return (1, "cannot find backup_complete.ignore") if "vmrestore" in command else (0, "")

    results = restore.execute(plan, run, said.append)
    assert len(ran) == 3 and not results[-1].ok
    assert "FAILED  mon01: vmrestore from s3://dr-bucket/gpumon/mon01/latest" in said
    assert any("restore-in-progress keeps VictoriaMetrics stopped" in m for m in said)


def test_step_output_is_masked(stores):
    _inv, found = stores
    register_secret("leaked-secret-value")
    said: list[str] = []
    restore.execute(
        restore.plan("mon01", found["mon01"]),
        lambda c, t: (1, "error: leaked-secret-value"),
        said.append,
    )
    assert f"error: {MASK}" in said
