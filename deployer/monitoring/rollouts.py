"""What ``status`` knows about an ``upgrade-driver`` run named in a Slurm drain reason: its record
on this controller and whether a controller still drives it (read-only: no lock is taken).

A run keeps ``<state root>/<run id>/state.json`` and, while a controller drives it, holds an
exclusive ``flock`` on ``lock`` in the same directory, with its pid written there
(``deployer.rollout.state.StateStore.locked``). A record whose ``status`` is still "running"
while nobody holds the lock is a controller that died (killed, host rebooted) mid-run. Whether
the lock is held is read from ``/proc/locks`` (the lock file's device and inode among the FLOCK
entries), which takes nothing: trying the lock ourselves could turn away a controller starting
at the same moment. Where ``/proc/locks`` cannot be read, the pid in the lock file is checked
for a live process instead.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from deployer.rollout.state import LOCK_FILE, STATE_FILE, state_root

PROC_LOCKS = Path("/proc/locks")


@dataclass(frozen=True)
class HostStep:
    state: str  # the host's step in the run (deployer.rollout.state.STEPS, failed, skipped)
    failed_step: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class RunInfo:
    """A run as this controller knows it."""

    run_id: str
    found: bool  # a record of the run is on this controller
    where: str  # its directory (or where it was looked for)
    driven: bool = False  # a live controller holds the run's lock
    status: str | None = None  # the record's status: running | interrupted | stopped | finished
    stop_reason: str | None = None
    inventory: str | None = None  # the inventory the run was started with
    hosts: dict[str, HostStep] = field(default_factory=dict)
    error: str | None = None  # the record exists but could not be read


def _flock_holders(path: Path, locks_text: str) -> bool:
    """Whether ``/proc/locks`` (``locks_text``) lists a FLOCK on ``path``'s inode."""
    st = path.stat()
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in locks_text.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 9001 fe:00:2342913 0 EOF": device major:minor in hex, then
        # the inode in decimal (as Debian 12's controller printed it for a flock taken by pid
        # 9001 on inode 2342913 of device 254:0; tests/unit/test_status_rollouts.py checks it on
        # the running kernel); blocked waiters ("1: -> FLOCK ...") hold nothing.
        words = line.split()
        if len(words) < 6 or words[1] != "FLOCK":
            continue
        major, minor, inode = [*words[5].split(":"), "", "", ""][:3]
        try:
            if (int(major, 16), int(minor, 16), int(inode)) == want:
                return True
        except ValueError:
            continue
    return False


def _pid_alive(path: Path) -> bool:
    try:
        pid = int(path.read_text().strip() or "0")
    except (OSError, ValueError):
        return False
    return pid > 0 and Path(f"/proc/{pid}").exists()


def lock_held(run_dir: Path, locks: Path = PROC_LOCKS) -> bool:
    """A controller holds the run's lock now."""
    lock = run_dir / LOCK_FILE
    if not lock.is_file():
        return False
    try:
        text = locks.read_text()
    except OSError:
        return _pid_alive(lock)
    return _flock_holders(lock, text)


def run_info(run_id: str, root: Path | None = None, locks: Path = PROC_LOCKS) -> RunInfo:
    """The run ``run_id`` under the state root (``GPUMON_ROLLOUT_STATE_DIR`` or the default)."""
    run_dir = (root or state_root()) / run_id
    state = run_dir / STATE_FILE
    if not state.is_file():
        return RunInfo(run_id, found=False, where=str(run_dir))
    try:
        data = json.loads(state.read_text())
        hosts = {
            h: HostStep(str(r.get("state")), r.get("failed_step"), r.get("reason"))
            for h, r in (data.get("hosts") or {}).items()
        }
    except (OSError, ValueError, AttributeError) as exc:
        return RunInfo(run_id, found=True, where=str(run_dir), error=f"{state}: {exc}")
    return RunInfo(
        run_id,
        found=True,
        where=str(run_dir),
        driven=lock_held(run_dir, locks),
        status=data.get("status"),
        stop_reason=data.get("stop_reason"),
        inventory=data.get("inventory"),
        hosts=hosts,
    )
