"""libvirtd and virtlogd for the lab's Vagrant VMs, on a machine whose libvirt is not running.

On a normal host libvirtd runs from systemd and the lab only uses it. On a machine without systemd
(CI containers) the lab starts ``virtlogd`` and ``libvirtd`` by hand, records them by PID and
start time (``deployer.lab.procs``) and ends exactly those when the Vagrant cluster goes down.
That needs ``user``/``group`` root in ``/etc/libvirt/qemu.conf`` (``scripts/setup-vagrant`` sets
it): without it every libvirt call re-probes qemu and ``vagrant up`` takes minutes longer.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

from deployer.lab import procs

URI = "qemu:///system"
QEMU_CONF = Path("/etc/libvirt/qemu.conf")
START_WAIT_S = 30.0
STOP_WAIT_S = 15.0
VIRSH_TIMEOUT_S = 60
DAEMONS = ("libvirtd", "virtlogd")  # stopped in this order (libvirtd logs through virtlogd)


class LibvirtError(RuntimeError):
    """libvirt is missing, cannot be started, or a virsh call failed; the message says why."""


def virsh(*args: str, check: bool = True, timeout: float = VIRSH_TIMEOUT_S) -> str:
    """``virsh -c qemu:///system ARGS``; its stdout. Raises LibvirtError on failure if ``check``."""
    cmd = ["virsh", "-q", "-c", URI, *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise LibvirtError("virsh is not installed (run scripts/setup-vagrant)") from exc
    except subprocess.TimeoutExpired as exc:
        raise LibvirtError(f"virsh {' '.join(args)} did not answer within {timeout:g}s") from exc
    if check and proc.returncode != 0:
        raise LibvirtError(f"virsh {' '.join(args)}: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def responds() -> bool:
    try:
        virsh("version", timeout=15)
    except LibvirtError:
        return False
    return True


def systemd_is_init() -> bool:
    try:
        return Path("/proc/1/comm").read_text().strip() == "systemd"
    except OSError:
        return False


def qemu_runs_as_root(conf: Path = QEMU_CONF) -> bool:
    """Whether qemu.conf sets both ``user = "root"`` and ``group = "root"`` (last one wins)."""
    try:
        text = conf.read_text()
    except OSError:
        return False
    settings: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r'^\s*(user|group)\s*=\s*"([^"]*)"', line)
        if match:
            settings[match.group(1)] = match.group(2)
    return settings.get("user") == "root" and settings.get("group") == "root"


def ensure_running(state: Path) -> bool:
    """libvirt answering on ``qemu:///system``: used as it is, or started here (without
    systemd). Returns True when this call started the daemons."""
    if responds():
        return False
    if systemd_is_init():
        raise LibvirtError(
            "libvirtd does not answer on qemu:///system: start it (systemctl start libvirtd)"
        )
    for daemon in DAEMONS:
        if shutil.which(daemon) is None:
            raise LibvirtError(f"{daemon} is not installed (run scripts/setup-vagrant)")
    if not qemu_runs_as_root():
        raise LibvirtError(
            f'{QEMU_CONF} must set user = "root" and group = "root" for a libvirtd started '
            "without systemd (run scripts/setup-vagrant)"
        )
    state.mkdir(parents=True, exist_ok=True)
    started: dict[str, dict[str, int]] = {}
    for daemon in reversed(DAEMONS):  # virtlogd first
        pid_file = state / f"{daemon}.pid"
        pid_file.unlink(missing_ok=True)
        proc = subprocess.run(
            [daemon, "--daemon", "--pid-file", str(pid_file)],
            capture_output=True,
            text=True,
            timeout=START_WAIT_S,
            check=False,
        )
        if proc.returncode != 0:
            stop(state, started)
            raise LibvirtError(f"{daemon} did not start: {proc.stderr.strip()[-500:]}")
        tracked = _wait_pid_file(pid_file)
        if tracked is None:
            stop(state, started)
            raise LibvirtError(f"{daemon} started but wrote no PID to {pid_file}")
        started[daemon] = {"pid": tracked.pid, "start": tracked.start}
        _record(state, started)
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        if responds():
            return True
        time.sleep(0.5)
    stop(state)
    raise LibvirtError(f"libvirtd started but did not answer within {START_WAIT_S:g}s")


def stop(state: Path, started: dict[str, dict[str, int]] | None = None) -> list[str]:
    """End the daemons ``ensure_running`` started (by recorded PID and start time); none other.
    Returns the names of those it stopped."""
    record = started if started is not None else _recorded(state)
    stopped = []
    for daemon in DAEMONS:
        entry = record.get(daemon)
        if not entry:
            continue
        tracked = procs.Tracked(int(entry["pid"]), int(entry["start"]))
        if tracked.signal(15):
            if procs.wait_gone([tracked], STOP_WAIT_S):
                procs.kill_hard([tracked])
            stopped.append(daemon)
    (state / "libvirt-daemons.json").unlink(missing_ok=True)
    return stopped


def started_here(state: Path) -> list[str]:
    """Daemons recorded as started by the lab that are still alive."""
    out = []
    for daemon, entry in _recorded(state).items():
        if procs.Tracked(int(entry["pid"]), int(entry["start"])).alive():
            out.append(daemon)
    return out


def _wait_pid_file(pid_file: Path) -> procs.Tracked | None:
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        try:
            return procs.track(int(pid_file.read_text().strip()))
        except (FileNotFoundError, ValueError, ProcessLookupError):
            time.sleep(0.1)
    return None


def _record(state: Path, started: dict[str, dict[str, int]]) -> None:
    (state / "libvirt-daemons.json").write_text(json.dumps(started, indent=2))


def _recorded(state: Path) -> dict[str, dict[str, int]]:
    try:
        return dict(json.loads((state / "libvirt-daemons.json").read_text()))
    except (FileNotFoundError, ValueError):
        return {}
