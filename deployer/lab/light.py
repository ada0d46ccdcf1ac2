"""Lightweight lab hosts for scale tests: one network namespace per host running only sshd.

No systemd, no root filesystem of their own: each host is a namespace on the fleet's own bridge
with an address from a private subnet reserved for it (``10.214.0.0/22`` unless told otherwise;
traffic goes only to those namespaces), its own host key, and an sshd that accepts the fleet's
root key. The hosts share this machine's filesystem, so a role run on them must write only under
the host's ``bench_root`` variable (``<state>/roots/<host>``). Sessions see a passwd file of
their own in which root has a fresh home and ``/bin/sh`` (no profile of the machine's root). Everything started is recorded by
PID and start time; ``down`` ends exactly those processes, deletes the namespaces (their veths
go with them) and the bridge, and recovers from a fleet killed without a teardown.

The sshd binary comes from Debian's ``openssh-server`` package unpacked into the lab cache (the
machine has no sshd of its own, and installing one would start a daemon on the machine).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployer.lab import keys, network, paths, procs
from deployer.lab.paths import cache_root, state_root

DEFAULT_SUBNET = "10.214.0.0/22"
MAX_HOSTS = 1000
READY_TIMEOUT_S = 60.0
PRIVSEP_DIR = Path("/run/sshd")  # sshd's privilege separation directory (empty)
SSHD_PACKAGES = ("openssh-server", "openssh-sftp-server")
# Libraries Debian 12's sshd links that a machine without openssh-server may lack, and the
# package that has each (scripts/setup installs them).
SSHD_LIBRARY_PACKAGES = {"libwrap.so.0": "libwrap0"}
# The kernel's IPv4 neighbour (ARP) table is one table for every network namespace, and its
# hard limit (gc_thresh3, 1024 on Debian 12) counts them all: a fleet of N hosts holds about
# 2N entries (the machine's side of the bridge learns N hosts, each host learns the gateway).
# Past the limit new entries are refused ("neighbor table overflow!" in the kernel log, and
# "No route to host" at the client): at 1,000 hosts the 700th did not answer.
NEIGH_SYSCTL = Path("/proc/sys/net/ipv4/neigh/default")


class LightError(RuntimeError):
    """The fleet could not be brought up or down; the message says what and why."""


@dataclass(frozen=True)
class LightHost:
    name: str
    address: str
    namespace: str
    root: Path


def sshd_dir() -> Path:
    return cache_root() / "light-sshd"


def ensure_sshd() -> tuple[Path, Path]:
    """(sshd, sftp-server) unpacked from Debian's packages into the lab cache (once)."""
    root = sshd_dir() / "root"
    sshd = root / "usr/sbin/sshd"
    sftp = root / "usr/lib/openssh/sftp-server"
    if sshd.is_file() and sftp.is_file():
        return sshd, sftp
    debs = sshd_dir() / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["apt-get", "download", *SSHD_PACKAGES], cwd=debs, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise LightError(f"apt-get download {' '.join(SSHD_PACKAGES)}: {proc.stderr.strip()}")
    for deb in debs.glob("*.deb"):
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True, capture_output=True)
    if not sshd.is_file() or not sftp.is_file():
        raise LightError(f"sshd or sftp-server missing after unpacking into {root}")
    return sshd, sftp


def missing_libraries(binary: Path) -> list[str]:
    """The shared libraries ``binary`` links that the dynamic loader cannot find here."""
    proc = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
    return [
        line.split("=>")[0].strip()
        for line in proc.stdout.splitlines()
        if line.rstrip().endswith("not found")
    ]


def check_libraries(sshd: Path) -> None:
    """Refuse, naming the libraries and their packages, an sshd that cannot start here."""
    missing = missing_libraries(sshd)
    if missing:
        packages = sorted({SSHD_LIBRARY_PACKAGES.get(lib, "?") for lib in missing})
        raise LightError(
            f"{sshd} cannot start: this machine lacks {', '.join(missing)} "
            f"(Debian package(s): {', '.join(packages)}; '?' = find it with dpkg -S or "
            "packages.debian.org); scripts/setup installs them"
        )


def neighbour_limits_for(count: int) -> dict[str, int]:
    """The ARP table thresholds a fleet of ``count`` hosts needs (beside the machine's other
    entries: 1,024 to spare): soft limit 2 entries per host, hard limit 4."""
    return {"gc_thresh2": 2 * count + 1024, "gc_thresh3": 4 * count + 1024}


def raise_neighbour_limits(count: int, sysctl: Path = NEIGH_SYSCTL) -> dict[str, int]:
    """Raise (never lower) the machine's ARP table thresholds to what ``count`` hosts need;
    the values now set. Left raised at ``down``: another fleet or lab may be using them, and a
    larger table costs nothing until it fills."""
    now: dict[str, int] = {}
    for name, wanted in neighbour_limits_for(count).items():
        path = sysctl / name
        current = int(path.read_text().strip())
        if current < wanted:
            path.write_text(f"{wanted}\n")
            current = wanted
        now[name] = current
    return now


def _namespaces() -> set[str]:
    out = network.ip("-j", "netns", "list", check=False).stdout or "[]"
    try:
        return {n["name"] for n in json.loads(out)}
    except ValueError:
        return set()


class LightFleet:
    """``count`` namespace hosts named ``<prefix>0001``...; state in ``<state root>/light-<name>``."""

    def __init__(self, name: str = "bench", subnet: str = DEFAULT_SUBNET) -> None:
        if not name or len(name) > 6 or not name.isalnum():
            raise LightError("a light fleet name is 1-6 letters or digits")
        self.name = name
        self.subnet = ipaddress.IPv4Network(subnet)
        self.dir = state_root() / f"light-{name}"
        self.bridge = f"glb-{name}"
        self.prefix = f"l{name}"

    # ---- paths ---------------------------------------------------------------------------
    @property
    def private_key_path(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def known_hosts_path(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    def host(self, i: int) -> LightHost:
        name = f"{self.prefix}{i:04d}"
        address = str(self.subnet.network_address + 1 + i)
        return LightHost(name, address, f"glns-{self.name}-{i}", self.dir / "roots" / name)

    def veth(self, i: int) -> str:
        """The machine-side end of host ``i``'s veth (interface names have 15 characters)."""
        return f"glv{self.name}-{i}"

    def hosts(self) -> list[LightHost]:
        state = self._state()
        return [self.host(i) for i in range(1, int(state.get("count", 0)) + 1)]

    def _state(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.dir / "fleet.json").read_text()))
        except (FileNotFoundError, ValueError):
            return {}

    def _save(self, state: dict[str, Any]) -> None:
        (self.dir / "fleet.json").write_text(json.dumps(state, indent=1))

    # ---- up ------------------------------------------------------------------------------
    def up(self, count: int, *, ready_timeout: float = READY_TIMEOUT_S) -> dict[str, float]:
        """Bring ``count`` hosts up (a fleet already up is taken down first). Timings in s."""
        if not 1 <= count <= min(MAX_HOSTS, self.subnet.num_addresses - 3):
            raise LightError(f"count must be 1..{min(MAX_HOSTS, self.subnet.num_addresses - 3)}")
        started = time.monotonic()
        self.down()
        shutil.rmtree(self.kept_logs_dir, ignore_errors=True)  # a previous failure's, now stale
        sshd, sftp = ensure_sshd()
        check_libraries(sshd)
        self._refuse_taken_subnet()
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        (self.dir / "hosts").mkdir(exist_ok=True)
        self._client_key()
        privsep = PRIVSEP_DIR
        created_privsep = not privsep.exists()
        privsep.mkdir(mode=0o755, exist_ok=True)
        self._passwd()
        base_state: dict[str, Any] = {
            "count": count,
            "subnet": str(self.subnet),
            "bridge": self.bridge,
            "created_privsep": created_privsep,
        }
        self._save({**base_state, "pids": {}})
        raise_neighbour_limits(count)
        network.ip("link", "add", "name", self.bridge, "type", "bridge")
        network.ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        network.ip("link", "set", "dev", self.bridge, "up")
        hosts = [self.host(i) for i in range(1, count + 1)]

        def prepare(h: LightHost) -> str:
            self._network(h)
            h.root.mkdir(parents=True, exist_ok=True)
            return self._host_key(h)

        with ThreadPoolExecutor(max_workers=8) as pool:
            keys = list(pool.map(prepare, hosts))
        self.known_hosts_path.write_text(
            "".join(f"{h.name},{h.address} {k}\n" for h, k in zip(hosts, keys, strict=True))
        )
        pids: dict[str, dict[str, Any]] = {}
        started_sshd: dict[str, subprocess.Popen[bytes]] = {}
        for h in hosts:
            proc = self._start_sshd(h, sshd, sftp)
            started_sshd[h.name] = proc
            pids[h.name] = {"pid": proc.pid, "start": procs.start_time(proc.pid)}
        self._save({**base_state, "pids": pids})
        timings = {"started": time.monotonic() - started}
        try:
            self._wait_ready(hosts, started_sshd, ready_timeout)
        except LightError as exc:
            # The teardown that follows a failed start deletes the fleet's directory: the sshd
            # logs the error names are kept outside it.
            raise LightError(self._keep_logs(str(exc))) from None
        timings["ready"] = time.monotonic() - started
        return timings

    @property
    def kept_logs_dir(self) -> Path:
        """Where a failed start leaves its hosts' sshd logs (``down`` does not delete it; the
        next ``up`` does)."""
        return state_root() / f"light-{self.name}-failed-logs"

    def _keep_logs(self, message: str) -> str:
        """Copy every host's sshd log to :attr:`kept_logs_dir`; ``message`` with the fleet's
        directory in it pointing there instead."""
        kept = self.kept_logs_dir
        shutil.rmtree(kept, ignore_errors=True)
        kept.mkdir(parents=True, mode=0o700)
        for log in sorted((self.dir / "hosts").glob("*/sshd.log")):
            shutil.copy2(log, kept / f"{log.parent.name}.sshd.log")
        return message.replace(str(self.dir / "hosts") + "/", str(kept) + "/").replace(
            "/sshd.log", ".sshd.log"
        )

    def _refuse_taken_subnet(self) -> None:
        everything = json.loads(network.ip("-j", "addr", "show").stdout or "[]")
        for iface in everything:
            for a in iface.get("addr_info", []):
                if a.get("family") != "inet":
                    continue
                if ipaddress.IPv4Address(a["local"]) in self.subnet:
                    raise LightError(
                        f"subnet {self.subnet} is already used by {iface['ifname']} "
                        f"({a['local']}); choose another subnet"
                    )

    def _network(self, h: LightHost) -> None:
        outer = self.veth(int(h.name[len(self.prefix) :]))
        network.ip("netns", "add", h.namespace)
        network.ip(
            "link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", h.namespace
        )
        network.ip("link", "set", "dev", outer, "master", self.bridge, "up")
        ns = ("-n", h.namespace)
        network.ip(*ns, "addr", "add", f"{h.address}/{self.subnet.prefixlen}", "dev", "eth0")
        network.ip(*ns, "link", "set", "dev", "eth0", "up")
        network.ip(*ns, "link", "set", "dev", "lo", "up")

    def _passwd(self) -> None:
        # root logs in to a home of its own with a plain /bin/sh: the machine's root shell
        # profile (pyenv, say) is not part of a host.
        home = self.dir / "root-home"
        home.mkdir(mode=0o700, exist_ok=True)
        lines = [
            f"root:x:0:0:root:{home}:/bin/sh" if line.startswith("root:") else line
            for line in Path("/etc/passwd").read_text().splitlines()
        ]
        if not any(line.startswith("sshd:") for line in lines):
            used = {int(line.split(":")[2]) for line in lines if line.count(":") >= 6}
            uid = next(u for u in range(64900, 65500) if u not in used)
            lines.append(f"sshd:x:{uid}:65534::/run/sshd:/usr/sbin/nologin")
        (self.dir / "passwd").write_text("\n".join(lines) + "\n")
        os.chmod(self.dir / "passwd", 0o644)

    def _client_key(self) -> None:
        public = keys.ensure_ed25519(self.private_key_path, f"gpumon-light-{self.name}")
        paths.write_secret(self.dir / "authorized_keys", public + "\n")

    def _host_key(self, h: LightHost) -> str:
        d = self.dir / "hosts" / h.name
        d.mkdir(parents=True, exist_ok=True)
        key = d / "ssh_host_ed25519_key"
        public = keys.ensure_ed25519(key, h.name)
        config = d / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"ListenAddress {h.address}:22",
                    f"HostKey {key}",
                    f"PidFile {d / 'sshd.pid'}",
                    f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "MaxSessions 64",
                    "MaxStartups 100:30:200",
                    f"Subsystem sftp {sshd_dir() / 'root/usr/lib/openssh/sftp-server'}",
                    "",
                ]
            )
        )
        return keys.key_type_and_body(public)

    def _start_sshd(self, h: LightHost, sshd: Path, sftp: Path) -> subprocess.Popen[bytes]:
        d = self.dir / "hosts" / h.name
        log = open(d / "sshd.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            return subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    h.namespace,
                    # sshd needs its privilege separation user: a private mount namespace sees a
                    # passwd file that has it, so the machine's own /etc/passwd stays as it is.
                    "unshare",
                    "--mount",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    f"mount --bind {self.dir / 'passwd'} /etc/passwd && exec {sshd} -D -e -f "
                    f"{d / 'sshd_config'}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        finally:
            log.close()

    def _wait_ready(
        self,
        hosts: list[LightHost],
        started: dict[str, subprocess.Popen[bytes]],
        timeout: float,
    ) -> None:
        deadline = time.monotonic() + timeout
        waiting = list(hosts)
        for _ in range(int(timeout / 0.1) + 1):
            waiting = [h for h in waiting if not _answers_ssh(h.address)]
            exited = [h for h in waiting if started[h.name].poll() is not None]
            if exited:  # an sshd that has exited will not answer: say so at once
                h = exited[0]
                log = self.dir / "hosts" / h.name / "sshd.log"
                raise LightError(
                    f"{len(exited)} hosts' sshd exited before answering SSH (first: {h.name}, "
                    f"exit status {started[h.name].returncode}: {_last_line(log)}; see {log})"
                )
            if not waiting or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if waiting:
            raise LightError(
                f"{len(waiting)} hosts not answering SSH after {timeout:.0f}s "
                f"(first: {waiting[0].name}; see {self.dir / 'hosts' / waiting[0].name / 'sshd.log'})"
            )

    # ---- down ----------------------------------------------------------------------------
    def down(self) -> None:
        """End the fleet's sshd processes (by recorded PID), delete its namespaces, veths and
        bridge, and its state. Safe to run on a fleet killed without a teardown, or none."""
        state = self._state()
        _end_all(
            [
                procs.Tracked(int(r["pid"]), int(r["start"]))
                for r in (state.get("pids") or {}).values()
                if r.get("start") is not None
            ]
        )
        ours = {n for n in _namespaces() if n.startswith(f"glns-{self.name}-")}
        for ns in sorted(ours):
            network.ip("netns", "delete", ns, check=False)
        others = [
            d for d in state_root().glob("light-*") if d != self.dir and (d / "fleet.json").exists()
        ]
        if state.get("created_privsep") and not others:  # another fleet's sshd still needs it
            with contextlib.suppress(OSError):  # not empty, or gone: not ours to clear
                PRIVSEP_DIR.rmdir()
        # A veth whose namespace is gone goes with it, but not always at once: delete any left.
        links = json.loads(network.ip("-j", "link", "show", check=False).stdout or "[]")
        for link in links:
            if str(link.get("ifname", "")).startswith(f"glv{self.name}-"):
                network.ip("link", "delete", "dev", link["ifname"], check=False)
        if network.link_exists(self.bridge):
            network.ip("link", "delete", "dev", self.bridge, "type", "bridge", check=False)
        if self.dir.is_dir():
            shutil.rmtree(self.dir)

    def inventory_hosts(self) -> list[dict[str, Any]]:
        return [
            {"name": h.name, "address": h.address, "bench_root": str(h.root)} for h in self.hosts()
        ]


def _last_line(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1] if lines else "nothing logged"


def _answers_ssh(address: str) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=0.5) as s:
            s.settimeout(0.5)
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def _end_all(records: list[procs.Tracked]) -> None:
    """SIGTERM each recorded sshd that is still the process we started, and its connection
    children; SIGKILL what is left after 5 s."""
    tracked: list[procs.Tracked] = []
    for rec in records:
        if not rec.alive():
            continue
        for child in procs.descendants(rec.pid):
            try:
                tracked.append(procs.track(child))
            except ProcessLookupError:
                continue
        tracked.append(rec)
    for t in tracked:
        t.signal(signal.SIGTERM)
    procs.kill_hard(procs.wait_gone(tracked, 5.0))


# ---------------------------------------------------------------- CLI: gpumon-deploy lab light


def light_command() -> Any:
    """The ``lab light`` click group (up / down / inventory), registered by deployer.lab.cli."""
    import click

    @click.group("light")
    def light() -> None:
        """Lightweight hosts for scale tests: network namespaces running only sshd."""

    name_option = click.option("--name", default="bench", show_default=True)

    @light.command("up")
    @click.option("--count", type=click.IntRange(1, MAX_HOSTS), required=True)
    @click.option("--subnet", default=DEFAULT_SUBNET, show_default=True)
    @name_option
    def up_cmd(count: int, subnet: str, name: str) -> None:
        """Bring COUNT hosts up (replacing the fleet's previous hosts)."""
        fleet = LightFleet(name, subnet)
        try:
            timings = fleet.up(count)
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            fleet.down()
            raise click.ClickException(str(exc)) from exc
        click.echo(json.dumps({k: round(v, 2) for k, v in timings.items()}))

    @light.command("down")
    @name_option
    def down_cmd(name: str) -> None:
        """End every sshd, delete the namespaces, veths and bridge."""
        LightFleet(name).down()

    @light.command("hosts")
    @name_option
    def hosts_cmd(name: str) -> None:
        """Print the hosts as JSON (name, address, bench_root) with the key and known_hosts."""
        fleet = LightFleet(name)
        click.echo(
            json.dumps(
                {
                    "private_key": str(fleet.private_key_path),
                    "known_hosts": str(fleet.known_hosts_path),
                    "hosts": fleet.inventory_hosts(),
                },
                indent=1,
            )
        )

    return light
