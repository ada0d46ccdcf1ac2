"""The lab's own Linux bridge, and cutting or restoring one host's link to it."""

from __future__ import annotations

import json
import subprocess

from deployer.lab.topology import Topology


class NetworkError(RuntimeError):
    """An ``ip`` command failed."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def link_exists(name: str) -> bool:
    return _ip("link", "show", "dev", name, check=False).returncode == 0


def ensure_bridge(topology: Topology) -> None:
    """Create the bridge with the lab's gateway address, up; no forwarding, no NAT."""
    if not link_exists(topology.bridge):
        _ip("link", "add", "name", topology.bridge, "type", "bridge")
    want = f"{topology.gateway}/{topology.prefixlen}"
    addrs = json.loads(_ip("-j", "addr", "show", "dev", topology.bridge).stdout or "[]")
    have = {
        f"{a['local']}/{a['prefixlen']}"
        for i in addrs
        for a in i.get("addr_info", [])
        if a.get("family") == "inet"
    }
    if want not in have:
        _ip("addr", "add", want, "dev", topology.bridge)
    _ip("link", "set", "dev", topology.bridge, "up")


def delete_bridge(name: str) -> None:
    if link_exists(name):
        _ip("link", "delete", "dev", name, "type", "bridge")


def host_veth(host: str) -> str:
    """Machine-side name systemd-nspawn gives a host's veth with --network-bridge."""
    return f"vb-{host}"[:15]


def set_link(host: str, up: bool) -> bool:
    """Bring the host's machine-side veth up or down; False when the host has no link."""
    veth = host_veth(host)
    if not link_exists(veth):
        return False
    _ip("link", "set", "dev", veth, "up" if up else "down")
    return True


def link_is_up(host: str) -> bool | None:
    proc = _ip("-j", "link", "show", "dev", host_veth(host), check=False)
    if proc.returncode != 0:
        return None
    info = json.loads(proc.stdout)[0]
    return "UP" in info.get("flags", [])
