"""What status knows of a run named in a drain reason: its record, and whether a controller still
holds its lock, read without taking the lock."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import types
from pathlib import Path

from deployer.monitoring.check import FAILED, PENDING
from deployer.monitoring.rollouts import (
    LEFT,
    UNDER_WAY,
    lock_held,
    rollout_checks,
    run_info,
    runs_of,
)
from deployer.rollout.state import LOCK_FILE, STATE_FILE

RUN = "20261201T113000Z-580.126.20-ab12"


def record(root: Path, **data) -> Path:
    run_dir = root / RUN
    run_dir.mkdir(parents=True)
    (run_dir / STATE_FILE).write_text(json.dumps(data))
    return run_dir


def test_a_run_with_no_record_here_is_not_found_and_says_where_it_looked(tmp_path):
    info = run_info(RUN, tmp_path)
    assert (info.found, info.where) == (False, str(tmp_path / RUN))


def test_a_record_gives_the_run_s_status_inventory_and_each_host_s_step(tmp_path):
    record(tmp_path, status="interrupted", inventory="/srv/inv.yml", stop_reason=None,
           hosts={"gpu03": {"state": "failed", "failed_step": "draining", "reason": "jobs"}})  # fmt: skip
    info = run_info(RUN, tmp_path)
    assert (info.found, info.status, info.inventory, info.driven) == (
        True, "interrupted", "/srv/inv.yml", False,
    )  # fmt: skip
    assert (info.hosts["gpu03"].state, info.hosts["gpu03"].failed_step) == ("failed", "draining")


def test_a_record_that_is_not_json_is_found_with_the_error(tmp_path):
    run_dir = tmp_path / RUN
    run_dir.mkdir()
    (run_dir / STATE_FILE).write_text("{torn")
    info = run_info(RUN, tmp_path)
    assert info.found and info.error is not None and STATE_FILE in info.error


def test_the_lock_a_live_controller_holds_is_seen_in_proc_locks(tmp_path):
    run_dir = record(tmp_path, status="running", hosts={})
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as StateStore.locked() does
        assert lock_held(run_dir)
        assert run_info(RUN, tmp_path).driven
    finally:
        os.close(fd)
    assert not lock_held(run_dir)  # released: the controller is gone


def test_the_lock_of_a_controller_killed_mid_run_is_not_held(tmp_path):
    run_dir = record(tmp_path, status="running", hosts={})
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys, time\n"
         f"fd = os.open({str(run_dir / LOCK_FILE)!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, str(os.getpid()).encode())\n"
         "print('locked', flush=True); time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert lock_held(run_dir)
    finally:
        holder.kill()
        holder.wait()
    assert not lock_held(run_dir)
    info = run_info(RUN, tmp_path)
    assert (info.status, info.driven) == ("running", False)  # died mid-run


def test_status_checking_the_lock_never_takes_it(tmp_path):
    run_dir = record(tmp_path, status="running", hosts={})
    (run_dir / LOCK_FILE).write_text("")
    lock_held(run_dir)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a controller starting now gets it
    finally:
        os.close(fd)


def test_without_proc_locks_the_pid_in_the_lock_file_tells(tmp_path):
    run_dir = record(tmp_path, status="running", hosts={})
    (run_dir / LOCK_FILE).write_text(str(os.getpid()))
    assert lock_held(run_dir, locks=tmp_path / "no-proc-locks")
    (run_dir / LOCK_FILE).write_text("999999999")
    assert not lock_held(run_dir, locks=tmp_path / "no-proc-locks")


# ---------------------------------------------------------------- the inventory's own runs


def run_record(root: Path, run_id: str, inventory: Path, status: str, **steps: str) -> Path:
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    hosts = {h: {"state": s} for h, s in steps.items()}
    data = {"status": status, "inventory": str(inventory.resolve()), "hosts": hosts}
    (run_dir / STATE_FILE).write_text(json.dumps(data))
    return run_dir


def test_the_runs_of_an_inventory_are_its_own_oldest_first(tmp_path):
    inv, other = tmp_path / "inv.yml", tmp_path / "other.yml"
    run_record(tmp_path / "runs", "20261202T100000Z-595.45.04-bbbb", inv, "finished")
    run_record(tmp_path / "runs", "20261201T100000Z-580.126.20-aaaa", inv, "interrupted")
    run_record(tmp_path / "runs", "20261203T100000Z-595.45.04-cccc", other, "running")
    (tmp_path / "runs" / "20261204T100000Z-x-dddd").mkdir()  # no record: not a run
    assert [r.run_id for r in runs_of(inv, tmp_path / "runs")] == [
        "20261201T100000Z-580.126.20-aaaa", "20261202T100000Z-595.45.04-bbbb",
    ]  # fmt: skip
    assert runs_of(inv, tmp_path / "none yet") == []


def test_a_record_no_controller_runs_is_parsed_once_until_a_resume_replaces_it(
    tmp_path, monkeypatch
):
    """``status --wait`` reads the inventory's runs every round: its history (finished,
    stopped, interrupted runs) is parsed once, a running run's record every time, and whether a
    controller drives a run is read from its lock every time."""
    from deployer.monitoring import rollouts
    from deployer.rollout.state import write_atomic

    inv = tmp_path / "inv.yml"
    old = run_record(tmp_path, "20261201T100000Z-580.126.20-aaaa", inv, "interrupted", g1="done")
    run_record(tmp_path, "20261202T100000Z-595.45.04-bbbb", inv, "running", g2="rebooting")
    parsed: list[str] = []

    def loads(text: str) -> object:
        parsed.append(json.loads(text)["status"])
        return json.loads(text)

    monkeypatch.setattr(rollouts, "json", types.SimpleNamespace(loads=loads))
    assert [r.status for r in runs_of(inv, tmp_path)] == ["interrupted", "running"]
    assert [r.status for r in runs_of(inv, tmp_path)] == ["interrupted", "running"]
    assert parsed == ["interrupted", "running", "running"]
    fd = os.open(old / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a controller resuming it takes the lock
        assert runs_of(inv, tmp_path)[0].driven is True  # the lock read anew, the record not
        assert parsed.count("interrupted") == 1
        # ... and replaces the record whole
        hosts = {"g1": {"state": "done"}}
        data = {"status": "running", "inventory": str(inv.resolve()), "hosts": hosts}
        write_atomic(old / STATE_FILE, json.dumps(data))
        first = runs_of(inv, tmp_path)[0]
        assert (first.status, first.driven) == ("running", True)
    finally:
        os.close(fd)
    assert runs_of(inv, tmp_path)[0].driven is False


def test_a_run_under_way_is_pending_and_names_the_hosts_it_has_out_of_service(tmp_path):
    inv = tmp_path / "inv.yml"
    run_dir = run_record(tmp_path, RUN, inv, "running",
                         gpu01="done", gpu02="installing", gpu03="rebooting", gpu04="pending")  # fmt: skip
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as StateStore.locked() does
        [row] = rollout_checks(runs_of(inv, tmp_path))
    finally:
        os.close(fd)
    assert (row.component, row.host, row.check, row.state) == (
        "upgrade-driver", "*", UNDER_WAY, PENDING,
    )  # fmt: skip
    assert row.detail == (
        f"run {RUN} (1/4 hosts done); out of service now: gpu02 (installing), gpu03 "
        "(rebooting) (what their rows fail of is pending meanwhile)"
    )


def test_a_run_a_controller_left_mid_run_fails_with_the_command_that_resumes_it(tmp_path):
    inv = tmp_path / "inv.yml"
    run_dir = run_record(tmp_path, RUN, inv, "running", gpu01="done", gpu02="validating")
    [row] = rollout_checks(runs_of(inv, tmp_path))
    assert (row.check, row.state) == (LEFT, FAILED)
    assert row.detail.startswith(f"run {RUN} died mid-run (no controller drives it) and left "
                                 "gpu02 (validating) mid-upgrade, out of service")  # fmt: skip
    assert f"gpumon-deploy upgrade-driver -i {inv.resolve()} --resume {RUN}" in row.detail
    assert f"remove {run_dir}" in row.detail


def test_a_host_a_later_run_took_up_is_no_longer_left_by_the_earlier_one(tmp_path):
    inv = tmp_path / "inv.yml"
    run_record(tmp_path, "20261201T100000Z-595.45.04-aaaa", inv, "interrupted",
               gpu02="installing", gpu03="draining")  # fmt: skip
    run_record(tmp_path, "20261202T100000Z-595.45.04-bbbb", inv, "finished", gpu02="done")
    [row] = rollout_checks(runs_of(inv, tmp_path))
    assert "was interrupted" in row.detail and "left gpu03 (draining) mid-upgrade" in row.detail
    assert "gpu02" not in row.detail


def test_finished_and_stopped_runs_and_hosts_in_service_are_no_finding(tmp_path):
    # a run stopped at --max-failures leaves its failed host drained on purpose, and said so
    inv = tmp_path / "inv.yml"
    run_record(tmp_path, "20261201T100000Z-595.45.04-aaaa", inv, "stopped", gpu02="failed")
    run_record(tmp_path, "20261202T100000Z-595.45.04-bbbb", inv, "finished", gpu03="done")
    run_record(tmp_path, "20261203T100000Z-595.45.04-cccc", inv, "interrupted",
               gpu04="pending", gpu05="unsilencing", gpu06="done")  # fmt: skip
    assert rollout_checks(runs_of(inv, tmp_path)) == []


def test_status_shows_the_inventory_s_runs_also_with_api_only(tmp_path, monkeypatch):
    from deployer.monitoring import status

    inv = tmp_path / "inv.yml"
    monkeypatch.setenv("GPUMON_ROLLOUT_STATE_DIR", str(tmp_path / "runs"))
    run_record(tmp_path / "runs", RUN, inv, "running", gpu02="rebooting")
    exp = status.StackExpectation(inventory=str(inv.resolve()))
    checks = status.collect(exp, lambda url, *_: None, None)
    assert [(c.component, c.check, c.state) for c in checks if c.component == "upgrade-driver"] == [
        ("upgrade-driver", LEFT, FAILED)
    ]
