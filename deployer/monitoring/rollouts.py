"""What ``status`` knows about ``upgrade-driver`` runs: one named in a Slurm drain reason (its
record on this controller and whether a controller still drives it), and the runs of the
inventory it checks (``runs_of``, ``rollout_checks``): one under way, and one a controller left
mid-run with hosts out of service (``left_mid_run``, which a new ``upgrade-driver`` run with a
drain hook that keeps no owner also reads: deployer/rollout/command.py). Read-only: no lock is
taken.

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
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from stat import S_ISREG

from deployer.monitoring.check import FAILED, PENDING, Check
from deployer.rollout.state import LOCK_FILE, OUT_OF_SERVICE, STATE_FILE, state_root
from deployer.run_lock import PROC_LOCKS, held_by

#: the rows of the inventory's own runs (component ``upgrade-driver``, host ``*``)
UNDER_WAY = "rollout under way"
LEFT = "no rollout left mid-run"


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
    try:
        st = state.stat()
    except OSError:
        return RunInfo(run_id, found=False, where=str(run_dir))
    if not S_ISREG(st.st_mode):
        return RunInfo(run_id, found=False, where=str(run_dir))
    stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
    known = _READ.get(state)
    if known is not None and known[0] == stamp:
        read = known[1]
    else:
        read = _read_record(run_id, run_dir, state)
        if read.error is None and read.status != "running":
            _READ[state] = (stamp, read)
    if read.error is not None:
        return read
    # whether a controller drives it is read anew every time: the lock, not the record, says
    return replace(read, driven=lock_held(run_dir, locks))


# The records of runs no controller is running (finished, stopped, interrupted: an inventory's
# history), as last read, by their file's (inode, mtime, size): ``status --wait`` reads every run
# of the inventory each round, and such a record (a run of 1,000 hosts: about 150 kB of JSON)
# changes only when a resume replaces it (written whole to a new file: deployer/rollout/state.py).
# A running run's record is read every time.
_READ: dict[Path, tuple[tuple[int, int, int], RunInfo]] = {}


def _read_record(run_id: str, run_dir: Path, state: Path) -> RunInfo:
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
        status=data.get("status"),
        stop_reason=data.get("stop_reason"),
        inventory=data.get("inventory"),
        hosts=hosts,
    )


def take_over_refusal(
    run_id: str, take_over: Collection[str] = (), root: Path | None = None, locks: Path = PROC_LOCKS
) -> str | None:
    """Why a new run may not take over a node run ``run_id`` left drained, or None when it may:
    that run's record is on this controller and no controller drives it (it died mid-run), or
    the operator named it (``--take-over``) and no controller here drives it. A run this
    controller has no record of may be under way from another controller (the run lock and the
    records are per controller): taking its node over would run two rollouts on one host. One a
    controller here drives (its lock held) is alive whatever the operator says: a run id
    mistyped or mixed up in ``--take-over`` is refused rather than believed."""
    run = run_info(run_id, root, locks)
    if run.driven:
        named = " (--take-over names it, but it is alive)" if run_id in take_over else ""
        return (
            f"upgrade-driver run {run_id}, which a controller drives now (its record: "
            f"{run.where}){named}. Let that run finish, or stop it (Ctrl-C: it can be resumed)"
        )
    if run_id in take_over:
        return None
    if run.found and run.error is None:
        return None
    if run.found:
        said = f"whose record here cannot be read ({run.error})"
    else:
        said = (
            "which this controller has no record of: it may be under way from another "
            "controller (each controller knows only its own runs)"
        )
    return (
        f"upgrade-driver run {run_id}, {said}. Let that run finish; if it is dead for good (its "
        f"controller gone), start this one with --take-over {run_id} to upgrade and resume the "
        "hosts it left"
    )


def resume_command(run: RunInfo, inventory: str = "") -> str:
    """The command that resumes ``run``: its record's inventory, else ``inventory``."""
    inv = run.inventory or inventory or "INVENTORY"
    return f"gpumon-deploy upgrade-driver -i {inv} --resume {run.run_id}"


def runs_of(
    inventory: str | Path, root: Path | None = None, locks: Path = PROC_LOCKS
) -> list[RunInfo]:
    """Every readable run of ``inventory`` (by its real path, as the run recorded it) on this
    controller, oldest first: a run id begins with its UTC start time."""
    base = root or state_root()
    want = str(Path(inventory).resolve())
    try:
        names = sorted(p.name for p in base.iterdir() if (p / STATE_FILE).is_file())
    except OSError:  # no run yet
        return []
    runs = (run_info(name, base, locks) for name in names)
    return [r for r in runs if r.error is None and r.inventory == want]


def out_of_service_now(runs: list[RunInfo]) -> dict[str, str]:
    """host -> why, for each host a run a controller drives now has out of service (from its
    drain to its undrain): what its own ``status`` rows may fail of is pending, not failed."""
    return {
        h: f"out of service in upgrade-driver run {run.run_id} ({step.state})"
        for run in runs
        if run.driven
        for h, step in run.hosts.items()
        if step.state in OUT_OF_SERVICE
    }


def _with_hosts_out(runs: list[RunInfo]) -> list[tuple[RunInfo, dict[str, str]]]:
    """Each run (oldest first) with its hosts out of service (host -> step) that no later run
    of the inventory took up since (a host a later run holds a record of: resuming the earlier
    run would take it back to that run's target)."""
    found: list[tuple[RunInfo, dict[str, str]]] = []
    taken_up: set[str] = set()
    for run in reversed(runs):
        out = {
            h: step.state
            for h, step in run.hosts.items()
            if step.state in OUT_OF_SERVICE and h not in taken_up
        }
        taken_up.update(run.hosts)
        found.append((run, out))
    return found[::-1]


def _left(run: RunInfo, out: dict[str, str]) -> bool:
    """A controller left ``run`` mid-run (killed, or interrupted: the record neither finished
    nor stopped, its lock not held) with ``out`` (hosts no later run took up) out of service."""
    return bool(out) and not run.driven and run.status in ("running", "interrupted")


def left_mid_run(runs: list[RunInfo]) -> list[tuple[RunInfo, dict[str, str]]]:
    """The runs a controller left mid-run with hosts out of service no later run took up, each
    with those hosts (host -> step), oldest first."""
    return [(run, out) for run, out in _with_hosts_out(runs) if _left(run, out)]


def left_detail(run: RunInfo, out: dict[str, str]) -> str:
    """What a run left mid-run left, and the two ways out."""
    how = "died mid-run" if run.status == "running" else "was interrupted"
    hosts = ", ".join(f"{h} ({state})" for h, state in sorted(out.items()))
    return (
        f"run {run.run_id} {how} (no controller drives it) and left {hosts} mid-upgrade, out of "
        f"service; resume it: {resume_command(run)} (or, once those hosts are back by other "
        f"means, remove {run.where})"
    )


def rollout_checks(runs: list[RunInfo]) -> list[Check]:
    """``runs`` (``runs_of``, oldest first): a pending row for each run a controller drives now,
    naming the hosts it has out of service (``out_of_service_now``: their rows pending);
    a failed row for each run a controller left mid-run (killed, or interrupted: its record not
    finished or stopped, its lock not held) with hosts out of service that no later run of the
    inventory took up since. A run stopped at ``--max-failures`` leaves its failed host drained
    on purpose and said so when it stopped: no row."""
    rows: list[Check] = []
    for run, out in _with_hosts_out(runs):
        if run.driven:
            done = sum(step.state == "done" for step in run.hosts.values())
            hosts = ", ".join(f"{h} ({state})" for h, state in sorted(out.items()))
            now = (
                f"out of service now: {hosts} (what their rows fail of is pending meanwhile)"
                if out
                else "no host out of service now"
            )
            rows.append(Check("upgrade-driver", "*", UNDER_WAY, PENDING,
                              f"run {run.run_id} ({done}/{len(run.hosts)} hosts done); {now}"))  # fmt: skip
        elif _left(run, out):
            rows.append(Check("upgrade-driver", "*", LEFT, FAILED, left_detail(run, out)))
    return rows
