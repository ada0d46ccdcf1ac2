"""The tools under test and how each is invoked on a fleet: gpumon-deploy, ansible-core, pyinfra
and the raw floor (one OpenSSH command per host, in parallel, no connection sharing).

A *fleet* is the hosts plus how to reach them (root key, known_hosts); a *workload* is the same
role written for each tool (``node_exporter`` on the lab, ``files`` on lightweight hosts).
Each tool's configuration is what its users would choose for speed; see bench/README.md.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.measure import (
    Outcome,
    Sample,
    ansible_changed,
    gpumon_changed,
    gpumon_failures,
    pyinfra_changed,
    run_measured,
)

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
GPUMON = REPO / ".venv" / "bin" / "gpumon-deploy"
# ansible-core and pyinfra live in their own virtualenv: pyinfra pins an older paramiko than
# gpumon-deploy's, so sharing .venv would change the engine under test.
PEERS_VENV = Path(os.environ.get("GPUMON_BENCH_VENV", "/var/cache/gpumon-bench/venv"))
# Ansible's (and so Mitogen's) connection timeout in the benches' ansible.cfg; see
# write_ansible_cfg.
CONNECT_TIMEOUT_S = 120
TEXTFILES = ("hardware", "software", "gpus", "rack", "schedule")


@dataclass(frozen=True)
class Target:
    name: str
    address: str
    port: int = 22
    vars: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class Fleet:
    """Hosts and how to reach them as root, host keys checked against ``known_hosts``."""

    hosts: tuple[Target, ...]
    private_key: Path
    known_hosts: Path
    user: str = "root"
    vars: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class Workload:
    """One role in every tool's language, plus the floor's checks and the cold reset."""

    name: str
    gpumon_site: Path
    ansible_playbook: Path
    pyinfra_deploy: Path
    floor_script: Callable[[Target], str]
    reset_script: Callable[[Target], str]
    gpumon_extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    # Once per host before any run (not timed): (script, stdin) for what every tool assumes.
    prepare: Callable[[Target], tuple[str, bytes | None]] | None = None
    # The reset done on this machine instead of over SSH, where the hosts share its filesystem
    # (lightweight hosts): the same effect without a thousand SSH handshakes between runs.
    reset_here: Callable[[Target], None] | None = None


# ---------------------------------------------------------------- the node_exporter workload

NODE_EXPORTER_FLOOR = " ; ".join(
    [
        "sha256sum /etc/apt/sources.list.d/bench-node-exporter.sources"
        " /etc/apt/keyrings/bench-node-exporter.gpg /etc/default/prometheus-node-exporter"
        + "".join(f" /var/lib/bench-node-exporter/textfile/{f}.prom" for f in TEXTFILES),
        "stat -c '%n %a %U %G' /var/lib/bench-node-exporter/textfile /etc/default/prometheus-node-exporter"
        + "".join(f" /var/lib/bench-node-exporter/textfile/{f}.prom" for f in TEXTFILES),
        "dpkg-query -W -f='${Status} ${Version}\\n' prometheus-node-exporter",
        "systemctl is-enabled prometheus-node-exporter.service",
        "systemctl is-active prometheus-node-exporter.service",
    ]
)

NODE_EXPORTER_RESET = " ; ".join(
    [
        "systemctl stop prometheus-node-exporter.service 2>/dev/null",
        "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q prometheus-node-exporter >/dev/null",
        "rm -f /etc/apt/sources.list.d/bench-node-exporter.*",
        "rm -rf /var/lib/bench-node-exporter /etc/default/prometheus-node-exporter",
        "true",
    ]
)


DEBS_DIR = Path("/var/cache/gpumon-bench/debs")
# ansible's apt and apt_repository modules import python3-apt on the host.
PYTHON_APT_DEBS = ("python3-apt", "python-apt-common", "distro-info-data")


def python_apt_bundle() -> bytes:
    """A tar of python3-apt and its two missing dependencies (downloaded once with apt-get
    download on this Debian 12 machine, which matches the hosts)."""
    import io
    import tarfile

    DEBS_DIR.mkdir(parents=True, exist_ok=True)
    have = {p.name.split("_")[0]: p for p in DEBS_DIR.glob("*.deb")}
    missing = [d for d in PYTHON_APT_DEBS if d not in have]
    if missing:
        subprocess.run(
            ["apt-get", "download", *missing], cwd=DEBS_DIR, check=True, capture_output=True
        )
        have = {p.name.split("_")[0]: p for p in DEBS_DIR.glob("*.deb")}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in PYTHON_APT_DEBS:
            tar.add(have[d], arcname=have[d].name)
    return buf.getvalue()


def node_exporter_prepare(keyring: bytes) -> Callable[[Target], tuple[str, bytes | None]]:
    """The hosts' apt source for the mirror becomes the role's job (the lab's own source is
    removed: apt refuses two Signed-By for one URI); the keyring all three tools verify with
    is written once; python3-apt is installed for ansible's apt modules."""
    bundle = python_apt_bundle()
    import base64

    key_b64 = base64.b64encode(keyring).decode()
    script = " && ".join(
        [
            "rm -f /etc/apt/sources.list.d/gpumon-lab-mirror.sources",
            "mkdir -p /etc/apt/keyrings",
            f"echo {key_b64} | base64 -d > /etc/apt/keyrings/bench-node-exporter.gpg",
            "chmod 0644 /etc/apt/keyrings/bench-node-exporter.gpg",
            "( python3 -c 'import apt_pkg' 2>/dev/null || { d=$(mktemp -d) && tar -x -C $d"
            " && dpkg -i $d/*.deb >/dev/null && rm -rf $d; } )",
        ]
    )
    return lambda _t: (script, bundle)


def node_exporter_workload(apt_key: str) -> Workload:
    from deployer.modules.repositories import dearmor

    return Workload(
        prepare=node_exporter_prepare(dearmor(apt_key.encode())),
        name="node_exporter",
        gpumon_site=BENCH_DIR / "gpumon" / "site.yml",
        ansible_playbook=BENCH_DIR / "ansible" / "playbook.yml",
        pyinfra_deploy=BENCH_DIR / "pyinfra" / "deploy.py",
        floor_script=lambda _t: NODE_EXPORTER_FLOOR,
        reset_script=lambda _t: NODE_EXPORTER_RESET,
        gpumon_extra={"bench_apt_key": apt_key},
    )


# ---------------------------------------------------------------- the files workload


def files_floor(t: Target) -> str:
    root = t.vars["bench_root"]
    paths = [f"{root}/etc/bench", f"{root}/etc/bench/bench.conf"] + [
        f"{root}/etc/bench/textfile/{f}.prom" for f in TEXTFILES
    ]
    return (
        f"sha256sum {' '.join(paths[1:])} ; stat -c '%n %a %U %G' {' '.join(paths)} "
        f"{root}/etc/bench/textfile"
    )


def files_reset(t: Target) -> str:
    return f"rm -rf {shlex.quote(t.vars['bench_root'])}/etc/bench"


def files_reset_here(t: Target) -> None:
    shutil.rmtree(Path(t.vars["bench_root"]) / "etc" / "bench", ignore_errors=True)


# gpumon-deploy's --forks in every bench: its workers are threads of one process, and past a
# hundred they only contend for the interpreter's lock. 1,000 light hosts no-op, one run each,
# alone (2026-12-02): --forks 100 27.9 s and 12.0 CPU-s, 200 29.6 s and 14.3, 1,000 31.3 s and
# 16.8 (bench/README.md, "Round four"). The peers keep forks >= hosts: Ansible's are processes.
GPUMON_FORKS = 100


def files_workload() -> Workload:
    return Workload(
        reset_here=files_reset_here,
        name="files",
        gpumon_site=BENCH_DIR / "gpumon" / "files-site.yml",
        ansible_playbook=BENCH_DIR / "ansible" / "files.yml",
        pyinfra_deploy=BENCH_DIR / "pyinfra" / "files_deploy.py",
        floor_script=files_floor,
        reset_script=files_reset,
    )


# ---------------------------------------------------------------- per-run files


def ssh_options(fleet: Fleet) -> list[str]:
    return [
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={fleet.known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "LogLevel=ERROR",
    ]


def write_inventory(fleet: Fleet, path: Path) -> None:
    """An Ansible YAML inventory both gpumon-deploy and ansible-core read."""
    hosts: dict[str, Any] = {}
    for t in fleet.hosts:
        entry: dict[str, Any] = {"ansible_host": t.address, **t.vars}
        if t.port != 22:
            entry["ansible_port"] = t.port
        hosts[t.name] = entry
    data = {
        "all": {
            "vars": {
                "ansible_user": fleet.user,
                "ansible_ssh_private_key_file": str(fleet.private_key),
                "gpumon_known_hosts_file": str(fleet.known_hosts),
                "gpumon_host_key_policy": "verify",
                "ansible_python_interpreter": "/usr/bin/python3",
                **fleet.vars,
            },
            "hosts": hosts,
        }
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def mitogen_strategy_dir() -> Path | None:
    """Mitogen for Ansible's strategy plugins in the peers' virtualenv (None: not installed)."""
    found = sorted(PEERS_VENV.glob("lib/python3*/site-packages/ansible_mitogen/plugins/strategy"))
    return found[-1] if found else None


def write_mitogen_cfg(fleet: Fleet, workdir: Path) -> Path:
    """Ansible with Mitogen as its documentation configures it (``strategy_plugins`` pointing
    at ansible_mitogen's, ``strategy = mitogen_linear``), on top of the same configuration as
    plain ansible-core (forks, host key checking, the SSH options)."""
    plain = write_ansible_cfg(fleet, workdir).read_text()
    strategy = mitogen_strategy_dir()
    if strategy is None:
        raise RuntimeError(f"mitogen is not installed in {PEERS_VENV} (scripts/setup-bench)")
    cfg = workdir / "ansible-mitogen.cfg"
    cfg.write_text(
        plain.replace(
            "[defaults]\n",
            f"[defaults]\nstrategy_plugins = {strategy}\nstrategy = mitogen_linear\n",
            1,
        )
    )
    return cfg


def write_ansible_cfg(fleet: Fleet, workdir: Path) -> Path:
    """Ansible as its users configure it for speed: pipelining, forks >= hosts, no fact
    gathering, SSH ControlPersist (its default); host key checking on."""
    cp = workdir / "cp"
    cp.mkdir(exist_ok=True)
    ssh_args = " ".join(
        [
            "-o ControlMaster=auto",
            "-o ControlPersist=60s",
            "-o IdentitiesOnly=yes",
            f"-o UserKnownHostsFile={fleet.known_hosts}",
            "-o GlobalKnownHostsFile=/dev/null",
        ]
    )
    cfg = workdir / "ansible.cfg"
    cfg.write_text(
        "[defaults]\n"
        f"forks = {max(5, len(fleet.hosts))}\n"
        "host_key_checking = True\n"
        "gathering = explicit\n"
        "retry_files_enabled = False\n"
        # Ansible's connection `timeout` (10 s by default) is, under Mitogen, the deadline for
        # the whole bootstrap of the remote interpreter (mitogen/parent.py, Options:
        # connect_deadline = now + connect_timeout, set from this option by
        # ansible_mitogen/connection.py): 10 s is not enough for 10 or 50 hosts starting their
        # Python at once on this 2-core machine under load ("Connection timed out.",
        # UNREACHABLE, rc 4). For plain ansible-core it is OpenSSH's ConnectTimeout only.
        f"timeout = {CONNECT_TIMEOUT_S}\n"
        "interpreter_python = /usr/bin/python3\n"
        f"local_tmp = {workdir}/ansible-local\n"
        "[ssh_connection]\n"
        "pipelining = True\n"
        f"ssh_args = {ssh_args}\n"
        f"control_path_dir = {cp}\n"
    )
    return cfg


def write_pyinfra_inventory(fleet: Fleet, path: Path) -> None:
    hosts = []
    for t in fleet.hosts:
        data = {
            "ssh_hostname": t.address,
            "ssh_port": t.port,
            "ssh_user": fleet.user,
            "ssh_key": str(fleet.private_key),
            "ssh_known_hosts_file": str(fleet.known_hosts),
            "ssh_strict_host_key_checking": "yes",
            **fleet.vars,
            **t.vars,
        }
        hosts.append((t.name, data))
    path.write_text(f"hosts = {hosts!r}\n")


@dataclass
class Prepared:
    """Everything one benchmark needs on disk for one fleet and workload."""

    fleet: Fleet
    workload: Workload
    workdir: Path
    inventory: Path = field(init=False)
    gpumon_vars: Path = field(init=False)
    ansible_cfg: Path = field(init=False)
    mitogen_cfg: Path | None = field(init=False)
    pyinfra_inventory: Path = field(init=False)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.inventory = self.workdir / "inventory.yml"
        write_inventory(self.fleet, self.inventory)
        self.gpumon_vars = self.workdir / "gpumon-vars.yml"
        self.gpumon_vars.write_text(yaml.safe_dump(self.workload.gpumon_extra or {"bench": 1}))
        os.chmod(self.gpumon_vars, 0o600)
        self.ansible_cfg = write_ansible_cfg(self.fleet, self.workdir)
        self.mitogen_cfg = (
            write_mitogen_cfg(self.fleet, self.workdir) if mitogen_strategy_dir() else None
        )
        self.pyinfra_inventory = self.workdir / "pyinfra_inventory.py"
        write_pyinfra_inventory(self.fleet, self.pyinfra_inventory)

    # ---- one run of each tool --------------------------------------------------------------
    def run(self, tool: str, scenario: str, timeout_s: float = 600.0) -> Sample:
        if tool == "floor":
            return self.floor(scenario)
        argv, env, cwd, parse = self._command(tool)
        got = run_measured(argv, cwd=cwd, env=env, timeout_s=timeout_s)
        changed = parse(got.stdout + "\n" + got.stderr)
        note = (
            "" if got.rc == 0 else (tool == "gpumon" and gpumon_failures(got.stdout)) or _tail(got)
        )
        return Sample(
            tool, scenario, got.wall_s, got.cpu_s, got.peak_rss_mib, got.rc, changed, note
        )

    def _command(
        self, tool: str
    ) -> tuple[list[str], dict[str, str], Path | None, Callable[[str], int | None]]:
        env = dict(os.environ)
        env.pop("ANSIBLE_CONFIG", None)
        # As users run them: bytecode caches on (this machine's shell sets the variable).
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        if tool == "gpumon":
            argv = [
                str(GPUMON),
                "up",
                "-i",
                str(self.inventory),
                "--site",
                str(self.workload.gpumon_site),
                "-e",
                f"@{self.gpumon_vars}",
                "--forks",
                str(GPUMON_FORKS),
                "--output",
                "json",
            ]
            return argv, env, None, gpumon_changed
        if tool in ("ansible", "mitogen"):
            # The same playbook and configuration; Mitogen's adds its strategy.
            cfg = self.mitogen_cfg if tool == "mitogen" else self.ansible_cfg
            if cfg is None:
                raise RuntimeError(f"mitogen is not installed in {PEERS_VENV}")
            env["ANSIBLE_CONFIG"] = str(cfg)
            env["ANSIBLE_NOCOLOR"] = "1"
            argv = [
                str(PEERS_VENV / "bin" / "ansible-playbook"),
                "-i",
                str(self.inventory),
                str(self.workload.ansible_playbook),
            ]
            return argv, env, None, ansible_changed
        if tool == "pyinfra":
            env["PYINFRA_PROGRESS"] = "off"
            argv = [
                str(PEERS_VENV / "bin" / "pyinfra"),
                "-y",
                "--parallel",
                str(max(1, len(self.fleet.hosts))),
                "--no-wait",
                str(self.pyinfra_inventory),
                self.workload.pyinfra_deploy.name,
            ]
            return argv, env, self.workload.pyinfra_deploy.parent, pyinfra_changed
        raise ValueError(f"unknown tool {tool!r}")

    def floor(self, scenario: str) -> Sample:
        """One ``ssh host '<all the checks>'`` per host, all in parallel, ControlMaster off."""
        before = os.times()
        started = time.perf_counter()
        outcomes = self.ssh_all(lambda t: self.workload.floor_script(t))
        wall = time.perf_counter() - started
        after = os.times()
        cpu = (after.children_user - before.children_user) + (
            after.children_system - before.children_system
        )
        bad = [o for o in outcomes if o.returncode != 0]
        return Sample(
            "floor",
            scenario,
            wall,
            cpu,
            0.0,
            1 if bad else 0,
            0,
            bad[0].stderr[-300:] if bad else "",
        )

    def prepare(self) -> None:
        """The workload's one-time host preparation (not timed)."""
        if self.workload.prepare is None:
            return
        bad = [o for o in self.ssh_all(self.workload.prepare) if o.returncode != 0]
        if bad:
            raise RuntimeError(f"prepare failed: {bad[0].stderr[-300:]}")

    def reset(self) -> None:
        """Remove the workload's state from every host (not timed)."""
        if self.workload.reset_here is not None:
            for t in self.fleet.hosts:
                self.workload.reset_here(t)
            return
        bad = [o for o in self.ssh_all(self.workload.reset_script) if o.returncode != 0]
        if bad:
            raise RuntimeError(f"reset failed: {bad[0].stderr[-300:]}")

    def ssh_all(
        self,
        script: Callable[[Target], str] | Callable[[Target], tuple[str, bytes | None]],
        timeout_s: float = 300.0,
    ) -> list[subprocess.CompletedProcess[str]]:
        base = ["ssh", "-i", str(self.fleet.private_key), *ssh_options(self.fleet)]
        base += ["-o", "ControlMaster=no", "-o", "ControlPath=none"]

        def one(t: Target) -> subprocess.CompletedProcess[str]:
            got = script(t)
            command, stdin = got if isinstance(got, tuple) else (got, None)
            argv = [*base, "-p", str(t.port), f"{self.fleet.user}@{t.address}", command]
            proc = subprocess.run(
                argv, input=stdin or b"", capture_output=True, timeout=timeout_s, check=False
            )
            return subprocess.CompletedProcess(
                argv,
                proc.returncode,
                proc.stdout.decode("utf-8", "replace"),
                proc.stderr.decode("utf-8", "replace"),
            )

        with ThreadPoolExecutor(max_workers=max(1, min(256, len(self.fleet.hosts)))) as pool:
            return list(pool.map(one, self.fleet.hosts))

    def close(self) -> None:
        """End Ansible's persisted SSH masters (by their control sockets) and remove files."""
        cp = self.workdir / "cp"
        if cp.is_dir():
            for sock in cp.iterdir():
                subprocess.run(
                    ["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"],
                    capture_output=True,
                    check=False,
                    timeout=10,
                )
        shutil.rmtree(self.workdir, ignore_errors=True)


def _tail(got: Outcome) -> str:
    # Ansible says why a host failed on stdout (its stderr is warnings): those lines first.
    why = [
        line
        for line in got.stdout.splitlines()
        if line.startswith(("fatal:", "ERROR!", "[ERROR]")) or "UNREACHABLE!" in line
    ]
    text = why or (got.stderr.strip() or got.stdout.strip()).splitlines()
    return "\n".join(text[-6:])[-600:]


def available(tools: Sequence[str]) -> list[str]:
    """The tools of ``tools`` whose executables exist here."""
    exe = {
        "gpumon": GPUMON,
        "ansible": PEERS_VENV / "bin" / "ansible-playbook",
        "pyinfra": PEERS_VENV / "bin" / "pyinfra",
    }
    return [
        t
        for t in tools
        if t == "floor"
        or (mitogen_strategy_dir() is not None if t == "mitogen" else exe[t].exists())
    ]
