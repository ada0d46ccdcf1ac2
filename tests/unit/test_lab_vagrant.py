"""Inventory from `vagrant ssh-config`: parsing the OpenSSH config and the inventory it gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.errors import InputError
from deployer.lab.topology import load_topology
from deployer.lab.vagrant import parse_ssh_config, vagrant_inventory

SSH_CONFIG = """\
Host gpu01
  HostName 192.168.121.11
  User vagrant
  Port 22
  UserKnownHostsFile /dev/null
  StrictHostKeyChecking no
  PasswordAuthentication no
  IdentityFile /work/.vagrant/machines/gpu01/libvirt/private_key
  IdentitiesOnly yes
  LogLevel FATAL

Host prom01
  HostName 127.0.0.1
  User vagrant
  Port 2222
  IdentityFile "/home/u/.vagrant.d/insecure private key"
"""

MIRROR = {"apt_mirror_url": "http://10.213.0.1:8680/debian"}


def test_ssh_config_blocks_are_parsed_per_host_with_lowercased_keys():
    hosts = parse_ssh_config(SSH_CONFIG)
    assert set(hosts) == {"gpu01", "prom01"}
    assert hosts["gpu01"]["hostname"] == "192.168.121.11"
    assert hosts["prom01"]["port"] == "2222"


def test_quoted_identity_file_with_spaces_is_unquoted():
    assert parse_ssh_config(SSH_CONFIG)["prom01"]["identityfile"] == (
        "/home/u/.vagrant.d/insecure private key"
    )


def test_first_value_wins_as_in_ssh():
    hosts = parse_ssh_config("Host a\n  Port 1\n  Port 2\n")
    assert hosts["a"]["port"] == "1"


def test_key_before_any_host_is_an_error_with_its_line():
    with pytest.raises(InputError) as err:
        parse_ssh_config("# c\nPort 22\n", source="cfg")
    assert (err.value.source, err.value.line) == ("cfg", 2)


def two_host_topology():
    topo = load_topology()
    return topo.__class__(
        bridge=topo.bridge,
        subnet=topo.subnet,
        mirror_port=topo.mirror_port,
        hosts=(topo.host("gpu01"), topo.host("prom01")),
    )


def test_inventory_uses_each_vms_address_port_user_and_key():
    inv = vagrant_inventory(two_host_topology(), SSH_CONFIG, known_hosts=Path("/kh"), mirror=MIRROR)
    prom01 = inv["all"]["hosts"]["prom01"]
    assert prom01["ansible_host"] == "127.0.0.1"
    assert prom01["ansible_port"] == 2222
    assert prom01["ansible_user"] == "vagrant"
    assert prom01["ansible_ssh_private_key_file"].endswith("insecure private key")
    gpu01 = inv["all"]["hosts"]["gpu01"]
    assert (gpu01["gpu_model"], gpu01["gpu_count"]) == ("H100", 8)


def test_inventory_pins_vm_host_keys_on_first_use_and_keeps_mirror_vars():
    inv = vagrant_inventory(two_host_topology(), SSH_CONFIG, known_hosts=Path("/kh"), mirror=MIRROR)
    v = inv["all"]["vars"]
    assert v["gpumon_host_key_policy"] == "accept-new"
    assert v["gpumon_known_hosts_file"] == "/kh"
    assert v["apt_mirror_url"] == MIRROR["apt_mirror_url"]
    assert "ansible_user" not in v  # each VM's user comes from its ssh-config


def test_a_topology_host_missing_from_ssh_config_is_named():
    with pytest.raises(InputError, match="mon01"):
        vagrant_inventory(load_topology(), SSH_CONFIG, known_hosts=Path("/kh"), mirror=MIRROR)
