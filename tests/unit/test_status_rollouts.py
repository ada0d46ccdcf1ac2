"""What status knows of a run named in a drain reason: its record, and whether a controller still
holds its lock, read without taking the lock."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

from deployer.monitoring.rollouts import lock_held, run_info
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
