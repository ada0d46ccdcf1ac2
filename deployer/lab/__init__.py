"""The lab: a local multi-host test cluster of systemd-nspawn hosts with simulated GPUs.

Public API: ``Lab`` (up, down, status, fault, heal, ssh, reboot, inventory_path,
known_hosts_path, hosts), ``load_topology`` / ``parse_topology`` / ``Topology``.  The GPU
simulation lives in ``deployer.lab.gpusim`` and is a lab-only package, never a product default.
"""

from __future__ import annotations

from deployer.lab.lab import Lab, LabError, default_topology
from deployer.lab.topology import LabHost, Topology, load_topology, parse_topology

__all__ = [
    "Lab",
    "LabError",
    "LabHost",
    "Topology",
    "default_topology",
    "load_topology",
    "parse_topology",
]
