"""Lightweight lab hosts' names and addresses, and the planning benchmark's synthetic inventory."""

from __future__ import annotations

import ipaddress

import pytest

from bench.planning import HOSTS_PER_RACK, inventory_yaml
from deployer.inventory import load_inventory
from deployer.lab.light import MAX_HOSTS, LightError, LightFleet


def test_light_hosts_get_distinct_addresses_inside_the_reserved_subnet():
    fleet = LightFleet("bench")
    addresses = {fleet.host(i).address for i in range(1, MAX_HOSTS + 1)}
    assert len(addresses) == MAX_HOSTS
    assert all(ipaddress.IPv4Address(a) in fleet.subnet for a in addresses)
    assert fleet.gateway not in addresses


def test_light_interface_names_fit_the_kernel_limit():
    fleet = LightFleet("abcdef")
    assert len(fleet.veth(MAX_HOSTS)) <= 15
    assert len(fleet.bridge) <= 15


def test_light_fleet_names_are_short_and_plain():
    with pytest.raises(LightError):
        LightFleet("bench-1")
    with pytest.raises(LightError):
        LightFleet("toolongname")


def test_synthetic_inventory_has_every_gpu_host_in_racks_and_the_monitoring_groups(tmp_path):
    path = tmp_path / "inv.yml"
    path.write_text(inventory_yaml(70))
    inv = load_inventory(path)
    assert len(inv.group_hosts("gpu")) == 70
    assert len([g for g in inv.groups if g.startswith("rack")]) == -(-70 // HOSTS_PER_RACK)
    assert inv.group_hosts("prometheus") == ["prom01", "prom02"]
    assert inv.hosts["gpu000000"].vars["gpu_count"] == 8
