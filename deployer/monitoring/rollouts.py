"""What ``status`` knows about an ``upgrade-driver`` run named in a Slurm drain reason: its record
on this controller and whether a controller still drives it (read-only: no lock is taken).

A run keeps ``<state root>/<run id>/state.json`` and, while a controller drives it, holds an
exclusive ``flock`` on ``lock`` in the same directory, with its pid written there
(``deployer.rollout.state.StateStore.locked``). A record whose ``status`` is still "running"
while nobody holds the lock is a controller that died (killed, host rebooted) mid-run. Whether
the lock is held is read from ``/proc/locks`` (``deployer.run_lock.held_by``), which takes
nothing: trying the lock ourselves could turn away a controller starting at the same moment.
Where ``/proc/locks`` cannot be read, the pid in the lock file is checked for a live process
instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from deployer.rollout.state import LOCK_FILE, STATE_FILE, state_root
from deployer.run_lock import PROC_LOCKS, held_by


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


def lock_held(run_dir: Path, locks: Path = PROC_LOCKS) -> bool:
    """A controller holds the run's lock now."""
    lock = run_dir / LOCK_FILE
    return lock.is_file() and held_by(lock, locks) is not None


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
