"""The Ansible-compatible YAML inventory and the known_hosts file the lab writes for itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from deployer.lab.topology import MONITORING_GROUPS, Topology


def inventory_data(
    topology: Topology,
    *,
    private_key: Path,
    known_hosts: Path,
    mirror: dict[str, str],
    host_addresses: dict[str, str] | None = None,
    connection: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The inventory as data: ``all`` with connection and mirror vars, per-host vars, groups.

    ``mirror`` holds the mirror vars (``apt_mirror_url``, ``nvidia_repo_url``,
    ``nvidia_repo_key_url``, ``release_mirror_url``).  ``connection`` may override per-host
    connection vars (``ansible_host``, ``ansible_port``, ...), as the Vagrant inventory does.
    """
    all_vars: dict[str, Any] = {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(private_key),
        "gpumon_known_hosts_file": str(known_hosts),
        "gpumon_host_key_policy": "verify",
        **mirror,
    }
    hosts: dict[str, dict[str, Any]] = {}
    for host in topology.hosts:
        entry: dict[str, Any] = {
            "ansible_host": (host_addresses or {}).get(host.name, host.address)
        }
        entry.update((connection or {}).get(host.name, {}))
        if host.is_gpu:
            entry.update(gpu_model=host.gpu_model, gpu_count=host.gpu_count, nvswitch=host.nvswitch)
            if host.mig is not None:
                # The product's MIG host variable (the MIG dashboard is generated for it).
                entry["gpu_mig"] = host.mig
        entry.update(host.vars)
        hosts[host.name] = entry
    children: dict[str, Any] = {}
    gpu = topology.group("gpu")
    if gpu:
        children["gpu"] = {"hosts": {h.name: {} for h in gpu}}
    monitoring = {
        g: {"hosts": {h.name: {} for h in topology.group(g)}}
        for g in MONITORING_GROUPS
        if topology.group(g)
    }
    if monitoring:
        children["monitoring"] = {"children": monitoring}
    return {"all": {"vars": all_vars, "hosts": hosts, "children": children}}


LAB_HEADER = "# Written by `gpumon-deploy lab up`; rewritten on every `lab up`.\n"
SIMULATED_NOTE = "# GPU hosts in this lab are SIMULATED (deployer.lab.gpusim): no real GPU.\n"


def render_inventory(data: dict[str, Any], header: str = LAB_HEADER) -> str:
    return header + SIMULATED_NOTE + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def write_inventory(path: Path, data: dict[str, Any], header: str = LAB_HEADER) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(render_inventory(data, header))
    tmp.replace(path)


def known_hosts_lines(host_keys: dict[str, tuple[list[str], str]]) -> str:
    """known_hosts text from ``{host: ([names and addresses], "ssh-ed25519 AAAA...")}``."""
    lines = [f"{','.join(names)} {key}" for _host, (names, key) in sorted(host_keys.items())]
    return "\n".join(lines) + ("\n" if lines else "")
