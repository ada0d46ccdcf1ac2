"""The lab's topology on Vagrant VMs: the hardware files the Vagrantfile uploads to GPU VMs, and
the inventory written from ``vagrant ssh-config``.

The Vagrantfile (repository root) reads the same topology YAML; ``gpumon-deploy lab mirror``
serves the same offline mirror on the VMs' private network, so the GPU simulation and every
package come from it, as on the nspawn lab.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any

from deployer.errors import InputError
from deployer.lab.inventory import inventory_data, write_inventory
from deployer.lab.topology import Topology

# ssh-config keys that become inventory connection vars.
_CONNECTION = {"hostname": "ansible_host", "port": "ansible_port", "user": "ansible_user",
               "identityfile": "ansible_ssh_private_key_file"}  # fmt: skip


def parse_ssh_config(text: str, source: str = "vagrant ssh-config") -> dict[str, dict[str, str]]:
    """``Host`` blocks of an OpenSSH client config: ``{host: {lowercased key: value}}``.

    Values keep their first occurrence (as ssh does); quotes around values are removed.
    """
    hosts: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.replace("=", " ", 1).partition(" ")
        key, value = key.lower(), value.strip()
        if key == "host":
            names = shlex.split(value)
            if len(names) != 1:
                raise InputError("expected one name per Host block", source=source, line=number)
            current = hosts.setdefault(names[0], {})
            continue
        if current is None:
            raise InputError(f"{key!r} before any Host line", source=source, line=number)
        if not value:
            raise InputError(f"{key!r} has no value", source=source, line=number, key=key)
        current.setdefault(key, value.strip('"'))
    return hosts


def vagrant_connection(
    topology: Topology, ssh_config: dict[str, dict[str, str]], source: str = "vagrant ssh-config"
) -> dict[str, dict[str, Any]]:
    """Per-host connection vars for every host of the topology, from parsed ssh-config."""
    missing = [h.name for h in topology.hosts if h.name not in ssh_config]
    if missing:
        raise InputError(
            f"no ssh-config for {', '.join(missing)} (are those VMs up? `vagrant up`)",
            source=source,
        )
    out: dict[str, dict[str, Any]] = {}
    for h in topology.hosts:
        entry: dict[str, Any] = {}
        for key, var in _CONNECTION.items():
            if key in ssh_config[h.name]:
                value: Any = ssh_config[h.name][key]
                entry[var] = int(value) if var == "ansible_port" else value
        if "ansible_host" not in entry:
            raise InputError("no HostName", source=source, key=f"{h.name}.HostName")
        out[h.name] = entry
    return out


def vagrant_inventory(
    topology: Topology,
    ssh_config_text: str,
    *,
    known_hosts: Path,
    mirror: dict[str, str],
    source: str = "vagrant ssh-config",
) -> dict[str, Any]:
    """The inventory of a Vagrant cluster of this topology.

    VM host keys are not known before the first connection, so this inventory says
    ``gpumon_host_key_policy: accept-new``: each key is pinned in ``known_hosts`` on first use
    and verified from then on.
    """
    conn = vagrant_connection(topology, parse_ssh_config(ssh_config_text, source), source)
    data = inventory_data(
        topology,
        private_key=Path("/dev/null"),
        known_hosts=known_hosts,
        mirror=mirror,
        connection=conn,
    )
    all_vars = data["all"]["vars"]
    all_vars["gpumon_host_key_policy"] = "accept-new"
    # Each VM has its own key and user in ssh-config; no lab-wide defaults apply.
    del all_vars["ansible_ssh_private_key_file"]
    del all_vars["ansible_user"]
    return data


def run_ssh_config(vagrant_dir: Path) -> str:
    """``vagrant ssh-config`` output for every running VM of the Vagrantfile in ``vagrant_dir``."""
    try:
        proc = subprocess.run(["vagrant", "ssh-config"], cwd=vagrant_dir, capture_output=True,
                              text=True, timeout=300, check=False)  # fmt: skip
    except FileNotFoundError as exc:
        raise InputError("vagrant is not installed", source="vagrant") from exc
    if proc.returncode != 0 and not proc.stdout.strip():
        raise InputError(f"vagrant ssh-config failed: {proc.stderr.strip()[-500:]}",
                         source=str(vagrant_dir / "Vagrantfile"))  # fmt: skip
    return proc.stdout


def write_vagrant_inventory(
    topology: Topology, ssh_config_text: str, out: Path, mirror: dict[str, str], source: str
) -> Path:
    data = vagrant_inventory(topology, ssh_config_text, known_hosts=out.with_name(
        "known_hosts"), mirror=mirror, source=source)  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    write_inventory(
        out,
        data,
        header="# Written by `gpumon-deploy lab vagrant-inventory` from `vagrant ssh-config`.\n",
    )
    return out


def prepare_hardware(topology: Topology, outdir: Path) -> list[Path]:
    """Write, per GPU host, the files gpusim.prepare_root puts into a host's root filesystem
    (``<outdir>/<host>/etc/gpusim/hardware.json`` ...); the Vagrantfile uploads that tree."""
    from deployer.lab.lab import gpusim_module

    sim = gpusim_module()
    if sim is None:
        raise InputError("the GPU simulation (deployer.lab.gpusim) is not available")
    written = []
    for h in topology.group("gpu"):
        root = outdir / h.name
        root.mkdir(parents=True, exist_ok=True)
        sim.prepare_root(
            root, sim.hardware_for(h.gpu_model, h.gpu_count, h.name, h.nvswitch, mig=h.mig)
        )
        written.append(root)
    return written
