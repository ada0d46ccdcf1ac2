"""The lab's own Linux bridge, and cutting or restoring one host's link to it."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import time
import zlib

from deployer.lab.topology import Topology


class NetworkError(RuntimeError):
    """An ``ip`` command failed."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def link_exists(name: str) -> bool:
    return ip("link", "show", "dev", name, check=False).returncode == 0


def links_left(names: list[str], timeout: float) -> list[str]:
    """The links of ``names`` that still exist after waiting up to ``timeout`` seconds for them
    to go. The kernel removes a container's veth when its network namespace is torn down, after
    the container's processes are gone: asynchronously, so a link can outlive its machine by a
    moment."""
    deadline = time.monotonic() + timeout
    while True:
        left = [n for n in names if link_exists(n)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def delete_link(name: str) -> None:
    """Delete a link (a veth takes its peer with it); nothing when it is already gone."""
    ip("link", "delete", "dev", name, check=False)


def subnet_users(topology: Topology) -> list[str]:
    """Interfaces other than the lab's bridge with an address in the lab's subnet."""
    everything = json.loads(ip("-j", "addr", "show").stdout or "[]")
    users = []
    for iface in everything:
        if iface.get("ifname") == topology.bridge:
            continue
        for a in iface.get("addr_info", []):
            if a.get("family") == "inet" and ipaddress.IPv4Address(a["local"]) in topology.subnet:
                users.append(f"{iface['ifname']} ({a['local']})")
    return users


def ensure_bridge(topology: Topology) -> None:
    """Create the bridge with the lab's gateway address, up; no forwarding, no NAT."""
    taken = subnet_users(topology)
    if taken:
        raise NetworkError(
            f"subnet {topology.subnet} is already used by {', '.join(taken)}; give this lab "
            "another subnet (network.subnet in its topology) or take the other lab down"
        )
    if not link_exists(topology.bridge):
        ip("link", "add", "name", topology.bridge, "type", "bridge")
    want = f"{topology.gateway}/{topology.prefixlen}"
    addrs = json.loads(ip("-j", "addr", "show", "dev", topology.bridge).stdout or "[]")
    have = {
        f"{a['local']}/{a['prefixlen']}"
        for i in addrs
        for a in i.get("addr_info", [])
        if a.get("family") == "inet"
    }
    if want not in have:
        ip("addr", "add", want, "dev", topology.bridge)
    ip("link", "set", "dev", topology.bridge, "up")


def delete_bridge(name: str) -> None:
    if link_exists(name):
        ip("link", "delete", "dev", name, "type", "bridge")


def machine_name(lab: str, host: str) -> str:
    """The systemd-nspawn machine name of a host: the host name in the ``default`` lab; in any
    other lab the host name shortened and tagged with the lab, so that two labs with the same
    host names can run at once (nspawn names each veth ``vb-<machine>``, 15 characters at most).
    The hostname inside is always the host name (from its /etc/hostname)."""
    if lab == "default":
        return host
    return f"{host[:7]}-{zlib.crc32(lab.encode()) & 0xFFFF:04x}"


def host_veth(machine: str) -> str:
    """Machine-side name systemd-nspawn gives a machine's veth with --network-bridge."""
    return f"vb-{machine}"[:15]


def set_link(machine: str, up: bool) -> bool:
    """Bring the machine-side veth up or down; False when the machine has no link."""
    veth = host_veth(machine)
    if not link_exists(veth):
        return False
    ip("link", "set", "dev", veth, "up" if up else "down")
    return True


def link_is_up(machine: str) -> bool | None:
    proc = ip("-j", "link", "show", "dev", host_veth(machine), check=False)
    if proc.returncode != 0:
        return None
    info = json.loads(proc.stdout)[0]
    return "UP" in info.get("flags", [])
