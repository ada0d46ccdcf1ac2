"""A scripted fleet of GPU hosts for command-level unit tests: the session's connections and
facts replaced, everything else (inventory, site, roles, plan, preflight, CLI) real.

``FakeFleet.install(monkeypatch)`` makes ``DeploySession`` open a ``ScriptedConnection`` per host
(recording every command) and read the facts the test set; a host in ``refused`` fails to
connect as a changed host key does. Asked what its package sources offer (``apt-cache policy``,
deployer/rollout/availability.py), a host offers what the plan installs, as ``apt-cache policy``
prints it, unless the test scripted another answer. Nothing here reaches a network.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from deployer import session as session_module
from deployer.connection import CommandResult, ScriptedConnection
from deployer.errors import FactsUnread, HostKeyRefused
from deployer.facts import GPU, HostFacts
from deployer.gpu import driver_record
from deployer.modules import boot_loader, module_signing
from deployer.rollout import availability, free_space
from deployer.session import DeploySession

MODEL_NAMES = {
    "H100": "NVIDIA H100 80GB HBM3",
    "A100": "NVIDIA A100-SXM4-80GB",
    "V100": "Tesla V100-SXM2-32GB",
}


def gpu_facts(
    host: str,
    *,
    model: str = "H100",
    count: int = 8,
    installed: str | None = "580.65.06",
    loaded: str | None = "580.65.06",
) -> HostFacts:
    """A Debian 12 GPU host's facts: ``count`` GPUs of ``model``, driver installed/loaded."""
    gpus = [
        GPU(
            index=i,
            uuid=f"GPU-{host}-{i}",
            name=MODEL_NAMES[model],
            memory_mib=81559,
            pci_bus_id=f"00000000:{i + 10:02X}:00.0",
            mig_mode="Disabled",
        )
        for i in range(count if loaded else 0)
    ]
    return HostFacts(
        host=host,
        os_id="debian",
        os_family="debian",
        os_version="12",
        arch="x86_64",
        kernel="6.1.0-28-amd64",
        nvidia_pci_gpus=count,
        gpus=gpus,
        nvidia_smi="ok" if loaded else "absent",
        driver_installed=installed,
        driver_loaded=loaded,
        driver_smi=loaded,
        kernel_module_flavour="open" if loaded else None,
        packages={"nvidia-open": f"{installed}-1"} if installed else {},
    )


@dataclass
class FleetConnection(ScriptedConnection):
    """A host of the fleet: scripted answers first; then, asked what its package sources offer,
    every package of the plan at the version the plan installs (its NVIDIA source configured),
    and, asked for free space (deployer/rollout/free_space.py), ``df``'s lines of ``free``, asked
    for its boot loader (deployer/modules/boot_loader.py), the lines of ``boot``, and for its
    module signing (deployer/modules/module_signing.py), those of ``signing``."""

    free: list[str] = field(default_factory=list)
    boot: list[str] = field(default_factory=list)
    signing: list[str] = field(default_factory=list)

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        if availability.PLAN_COMMENT in command and not any(n in command for n, _ in self.rules):
            self.commands.append(command)
            self.stdins.append(stdin)
            answer = offering(command, self.free, self.boot, self.signing)
            return CommandResult(command, 0, answer, "")
        return super().run(command, stdin=stdin, timeout=timeout)


def offering(
    command: str,
    free: Sequence[str] = (),
    boot: Sequence[str] = (),
    signing: Sequence[str] = (),
) -> str:
    """The answer of a host whose sources offer what the plan of ``command``
    (``availability.policy_script``) installs, whose ``df`` prints ``free`` and whose boot loader
    reads as ``boot``."""
    first = command.splitlines()[0]
    offered = {}
    for spec in first[len(availability.PLAN_COMMENT) :].split():
        name, _, version = spec.partition("=")
        offered[name] = (None, [version or "1.0-1"])
    asked_boot = boot_loader.MARK in command
    space = free if free_space.MARK in command else ()
    signed = signing if module_signing.MARK in command else None
    return policy_answer(offered, space, asked_boot, boot, signed)


def policy_answer(
    packages: dict[str, tuple[str | None, list[str]]],
    free: Sequence[str] = (),
    asked_boot: bool = False,
    boot: Sequence[str] = (),
    signing: Sequence[str] | None = None,
) -> str:
    """``availability.policy_script``'s output on a host with its NVIDIA source and nothing for
    ``dpkg --audit``, its ``apt-cache policy`` (apt 2.6's layout) of ``packages``: name ->
    (installed version or None, the versions its sources offer); with ``free``, df's lines;
    asked, the boot loader's lines and (``signing`` not None) the module signing ones."""
    out = [f"{availability.SOURCE_MARK} yes"]
    if free:
        out += [free_space.MARK, "File        Avail Mounted on", *free]
    if asked_boot:
        out += [boot_loader.MARK, *boot]
    if signing is not None:
        out += [module_signing.MARK, *signing]
    out += [availability.AUDIT_MARK, availability.POLICY_MARK]
    for name, (installed, versions) in packages.items():
        out += [
            f"{name}:",
            f"  Installed: {installed or '(none)'}",
            f"  Candidate: {versions[0] if versions else installed or '(none)'}",
            "  Version table:",
        ]
        for v in versions:
            out += [
                f" {'***' if v == installed else '   '} {v} 500",
                "        500 http://repo.example/cuda/debian12/x86_64  Packages",
            ]
            if v == installed:
                out.append("        100 /var/lib/dpkg/status")
    return "\n".join(out) + "\n"


@dataclass
class FakeFleet:
    facts: dict[str, HostFacts] = field(default_factory=dict)
    files: dict[str, dict[str, str]] = field(default_factory=dict)  # host -> path -> content
    refused: set[str] = field(default_factory=set)
    unread: dict[str, str] = field(default_factory=dict)  # host -> why its facts script stopped
    conns: dict[str, ScriptedConnection] = field(default_factory=dict)

    def connection(self, host: str) -> ScriptedConnection:
        if host not in self.conns:
            conn = FleetConnection(name=host)
            for path, text in self.files.get(host, {}).items():
                conn.on(path, 0, text)
            self.conns[host] = conn
        return self.conns[host]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeFleet:
        def open_(session: DeploySession, host: str) -> ScriptedConnection:
            if host in self.refused:
                raise HostKeyRefused(f"{host}: host key changed (SHA256:test)")
            return self.connection(host)

        def gather(conn: ScriptedConnection) -> HostFacts:
            if conn.name in self.unread:
                raise FactsUnread(self.unread[conn.name])
            return self.facts[conn.name]

        def gather_with_reads(conn: ScriptedConnection, scripts: list[str]) -> tuple:
            # The facts the test set and the upgrade record as the host holds it; the first
            # play's reads not taken (None, as when a host's output is cut: the executor then
            # reads them itself), so a test sees the commands a host runs as before.
            if conn.name in self.unread:
                raise FactsUnread(self.unread[conn.name])
            return self.facts[conn.name], [
                conn.run(s) if s == driver_record.READ_COMMAND else None for s in scripts
            ]

        monkeypatch.setattr(DeploySession, "open_connection", open_)
        monkeypatch.setattr(session_module, "gather", gather)
        monkeypatch.setattr(session_module, "gather_with_reads", gather_with_reads)
        return self

    def commands(self, host: str) -> list[str]:
        return list(self.conns[host].commands) if host in self.conns else []


def write_inventory(tmp_path: Path, hosts: dict[str, dict], gpu_vars: dict | None = None) -> Path:
    """A YAML inventory with ``hosts`` (name -> vars) in group ``gpu`` (its ``gpu_vars``)."""
    import yaml

    inv = tmp_path / "inventory.yml"
    data = {
        "all": {
            "vars": {"nvidia_repo_url": "http://192.0.2.9/nvidia/"},
            "children": {
                "gpu": {
                    "vars": gpu_vars or {},
                    "hosts": {
                        h: {"ansible_host": "192.0.2.1", "gpu_count": 8, **v}
                        for h, v in hosts.items()
                    },
                }
            },
        }
    }
    inv.write_text(yaml.safe_dump(data))
    return inv
