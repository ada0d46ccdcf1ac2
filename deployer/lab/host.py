"""One lab host on the machine: its overlay root filesystem, identity, supervisor and power.

A host lives in ``<state>/hosts/<name>/``: ``upper``/``work``/``merged`` (the overlay over the
shared base), ``supervisor.pid`` and ``nspawn.pid`` (tracked processes), ``console.log``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import deployer
from deployer.lab import cgroups, keys, procs
from deployer.lab.topology import LabHost, Topology

SUPERVISOR_PID = "supervisor.pid"
GRACEFUL_STOP_S = 20.0


class HostError(RuntimeError):
    """A host could not be prepared or started."""


@dataclass(frozen=True)
class HostFiles:
    """The paths of one host's on-machine state."""

    dir: Path

    @property
    def upper(self) -> Path:
        return self.dir / "upper"

    @property
    def work(self) -> Path:
        return self.dir / "work"

    @property
    def merged(self) -> Path:
        return self.dir / "merged"

    @property
    def supervisor_pid(self) -> Path:
        return self.dir / SUPERVISOR_PID

    @property
    def nspawn_pid(self) -> Path:
        return self.dir / "nspawn.pid"

    @property
    def console(self) -> Path:
        return self.dir / "console.log"


def is_mounted(path: Path) -> bool:
    target = os.path.realpath(path)
    return any(m == target for m in mount_points())


def mount_points() -> list[str]:
    """Mount points of this mount namespace, from /proc/self/mountinfo (decoded)."""
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        for line in handle:
            raw = line.split()[4]
            points.append(raw.encode().decode("unicode_escape"))
    return points


def unmount_below(root: Path) -> None:
    """Unmount everything mounted at or below ``root``, deepest first (lazily if busy)."""
    prefix = os.path.realpath(root)
    targets = [m for m in mount_points() if m == prefix or m.startswith(prefix + "/")]
    for target in sorted(set(targets), key=len, reverse=True):
        proc = subprocess.run(["umount", target], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            subprocess.run(["umount", "-l", target], capture_output=True, check=False)


def mount_overlay(files: HostFiles, base: Path) -> None:
    for d in (files.upper, files.work, files.merged):
        d.mkdir(parents=True, exist_ok=True)
    if is_mounted(files.merged):
        return
    opts = f"lowerdir={base},upperdir={files.upper},workdir={files.work}"
    proc = subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", opts, str(files.merged)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise HostError(f"mounting the overlay of {files.dir.name} failed: {proc.stderr.strip()}")


def boots(files: HostFiles) -> int:
    """How many times the host has booted (its supervisor counts them); 0 before the first."""
    try:
        return int((files.dir / "boots").read_text())
    except FileNotFoundError:
        return 0


def write_hosts_file(root: Path, host: LabHost, topology: Topology) -> None:
    """``/etc/hosts`` of ``host`` under ``root``: itself, every other lab host, the mirror.
    Written through a temporary file and a rename, as a running host may be reading it."""
    lines = ["127.0.0.1\tlocalhost", f"127.0.1.1\t{host.name}", "::1\tlocalhost"]
    lines += [f"{h.address}\t{h.name}" for h in topology.hosts if h.name != host.name]
    lines.append(f"{topology.gateway}\tgpumon-lab-mirror")
    target = root / "etc/hosts"
    staged = target.with_name(".hosts.gpumon-lab")
    staged.write_text("\n".join(lines) + "\n")
    os.chmod(staged, 0o644)
    os.replace(staged, target)


def write_identity(
    root: Path,
    host: LabHost,
    topology: Topology,
    authorized_key: str,
    apt_sources: str,
    apt_key: bytes,
) -> str:
    """Give a fresh root its hostname, address, host key, root key and apt sources.

    Returns the host's public host key line (``ssh-ed25519 AAAA...``) for known_hosts.
    """
    etc = root / "etc"
    (etc / "hostname").write_text(host.name + "\n")
    (etc / "machine-id").write_text(uuid.uuid4().hex + "\n")
    write_hosts_file(root, host, topology)
    network = etc / "systemd/network/10-host0.network"
    network.parent.mkdir(parents=True, exist_ok=True)
    network.write_text(
        "# gpumon lab: static address on the lab bridge; no gateway, the lab has no way out\n"
        "[Match]\nName=host0\n\n"
        f"[Network]\nAddress={host.address}/{topology.prefixlen}\nLinkLocalAddressing=no\n"
        "IPv6AcceptRA=no\n"
    )
    ssh_dir = etc / "ssh"
    for old in ssh_dir.glob("ssh_host_*"):
        old.unlink()
    host_key = keys.ensure_ed25519(ssh_dir / "ssh_host_ed25519_key", f"root@{host.name}")
    root_ssh = root / "root/.ssh"
    root_ssh.mkdir(parents=True, exist_ok=True)
    os.chmod(root_ssh, 0o700)
    auth = root_ssh / "authorized_keys"
    auth.write_text(authorized_key.strip() + "\n")
    os.chmod(auth, 0o600)
    keyrings = etc / "apt/keyrings"
    keyrings.mkdir(parents=True, exist_ok=True)
    (keyrings / "gpumon-lab-mirror.asc").write_bytes(apt_key)
    (etc / "apt/sources.list").unlink(missing_ok=True)
    sources_d = etc / "apt/sources.list.d"
    sources_d.mkdir(parents=True, exist_ok=True)
    for old in sources_d.iterdir():
        old.unlink()
    (sources_d / "gpumon-lab-mirror.sources").write_text(apt_sources)
    return keys.key_type_and_body(host_key)


def nspawn_command(
    files: HostFiles, machine: str, topology: Topology, extra: list[str]
) -> list[str]:
    return [
        "systemd-nspawn",
        "-D",
        str(files.merged),
        "-b",
        "--register=no",
        "--keep-unit",
        f"--network-bridge={topology.bridge}",
        "-M",
        machine,
        "--link-journal=no",
        "--console=read-only",
        *extra,
    ]


def cgroup_of(files: HostFiles) -> str:
    """The host's own cgroup: ``gpumon-lab/<lab>/<host>`` (from ``<state>/<lab>/hosts/<host>``)."""
    return cgroups.host_cgroup(files.dir.parent.parent.name, files.dir.name)


def start_supervisor(files: HostFiles, argv: list[str]) -> procs.Tracked:
    """Start the detached supervisor of one host and record its PID."""
    cgroups.remove(cgroup_of(files))  # what a killed earlier run of this host left
    env = dict(os.environ)
    repo = str(Path(deployer.__file__).resolve().parents[1])
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(files.dir / "supervisor.log", "ab") as log:
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "deployer.lab.supervisor",
                str(files.dir),
                cgroup_of(files),
                "--",
                *argv,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=env,
            cwd="/",
        )
    tracked = procs.track(child.pid)
    procs.save(files.supervisor_pid, tracked)
    return tracked


def running(files: HostFiles) -> bool:
    sup = procs.load(files.supervisor_pid)
    return sup is not None and sup.alive()


def process_tree(files: HostFiles) -> list[procs.Tracked]:
    """The supervisor, nspawn and everything under them (the container), as tracked PIDs."""
    roots = [
        p
        for p in (procs.load(files.supervisor_pid), procs.load(files.nspawn_pid))
        if p is not None and p.alive()
    ]
    seen: dict[int, procs.Tracked] = {}
    for root in roots:
        seen[root.pid] = root
        for pid in procs.descendants(root.pid):
            start = procs.start_time(pid)
            if start is not None:
                seen[pid] = procs.Tracked(pid, start)
    return list(seen.values())


def power_off(files: HostFiles) -> None:
    """Pull the plug: SIGKILL supervisor, nspawn and the container at once; no restart."""
    tree = process_tree(files)
    procs.kill_hard(tree)
    files.supervisor_pid.unlink(missing_ok=True)
    files.nspawn_pid.unlink(missing_ok=True)


def request_stop(files: HostFiles) -> list[procs.Tracked]:
    """Ask the host to shut down cleanly (SIGTERM to its supervisor); returns what to wait for."""
    tree = process_tree(files)
    sup = procs.load(files.supervisor_pid)
    if sup is not None:
        sup.signal(signal.SIGTERM)
    return tree


def finish_stop(files: HostFiles, tree: list[procs.Tracked], timeout: float) -> None:
    """Wait (bounded) for a requested stop, kill whatever is left, and forget the PIDs."""
    left = procs.wait_gone(tree, timeout)
    if left:
        procs.kill_hard(left)
    files.supervisor_pid.unlink(missing_ok=True)
    files.nspawn_pid.unlink(missing_ok=True)


def remove(files: HostFiles) -> None:
    """Unmount the host's overlay and delete its directory and cgroup (its processes must be
    gone)."""
    unmount_below(files.dir)
    cgroups.remove(cgroup_of(files))
    propagate = Path("/run/systemd/nspawn/propagate") / files.dir.name
    if propagate.exists():
        unmount_below(propagate)
        shutil.rmtree(propagate, ignore_errors=True)
    if is_mounted(files.merged):
        raise HostError(f"{files.merged} is still mounted; not deleting {files.dir}")
    if files.dir.exists():
        shutil.rmtree(files.dir)
