"""Processes the lab started, tracked by PID *and* start time so that a recycled PID is never
mistaken for ours (and never signalled)."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from deployer.lab.paths import write_atomic


@dataclass(frozen=True)
class Tracked:
    """A PID and the kernel start time it had when the lab recorded it."""

    pid: int
    start: int

    def alive(self) -> bool:
        return start_time(self.pid) == self.start

    def signal(self, sig: int) -> bool:
        """Send ``sig`` if this is still the process we started; False if it is gone."""
        if not self.alive():
            return False
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks since boot), None if there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces and parentheses; fields follow the last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def track(pid: int) -> Tracked:
    start = start_time(pid)
    if start is None:
        raise ProcessLookupError(pid)
    return Tracked(pid, start)


def save(path: Path, proc: Tracked) -> None:
    write_atomic(path, json.dumps({"pid": proc.pid, "start": proc.start}))


def load(path: Path) -> Tracked | None:
    try:
        data = json.loads(path.read_text())
        return Tracked(int(data["pid"]), int(data["start"]))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (all of its threads)."""
    kids: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except (FileNotFoundError, ProcessLookupError):
        # gone, or exiting: listing an exiting process' tasks fails with ESRCH, not ENOENT (a
        # host powered off while its tree was walked: CI, 2026-12-05)
        return kids
    for task in tasks:
        try:
            kids += [int(x) for x in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return kids


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents before children."""
    out: list[int] = []
    frontier = [pid]
    for _ in range(10_000):
        if not frontier:
            break
        current = frontier.pop(0)
        for kid in children(current):
            out.append(kid)
            frontier.append(kid)
    return out


def wait_gone(procs: list[Tracked], timeout: float) -> list[Tracked]:
    """Wait (bounded) until none of ``procs`` is alive; returns those still alive."""
    deadline = time.monotonic() + timeout
    remaining = [p for p in procs if p.alive()]
    while remaining and time.monotonic() < deadline:
        time.sleep(0.1)
        _reap()
        remaining = [p for p in remaining if p.alive()]
    return remaining


def kill_hard(procs: list[Tracked]) -> None:
    for proc in procs:
        proc.signal(signal.SIGKILL)
    wait_gone(procs, 5.0)


def _reap() -> None:
    """Collect exited children of this process so they do not linger as zombies."""
    for _ in range(100):
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
