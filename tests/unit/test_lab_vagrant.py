"""Inventory from `vagrant ssh-config`: parsing the OpenSSH config, the inventory it gives, and the
VMs' host keys checked against what they printed on their consoles."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from deployer.errors import InputError
from deployer.lab import vagrant
from deployer.lab.topology import load_topology
from deployer.lab.vagrant import (
    HOST_KEY_MARK,
    checked_host_key,
    console_fingerprints,
    fingerprint,
    machine_ids,
    parse_ssh_config,
    refresh_known_hosts,
    vagrant_inventory,
)

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


def test_inventory_reaches_each_vm_on_its_topology_address_with_its_user_and_key():
    inv = vagrant_inventory(two_host_topology(), SSH_CONFIG, known_hosts=Path("/kh"), mirror=MIRROR)
    prom01 = inv["all"]["hosts"]["prom01"]
    # Not Vagrant's 127.0.0.1:2222 (a NAT port) or DHCP lease: the private network's address.
    assert prom01["ansible_host"] == two_host_topology().host("prom01").address
    assert prom01["ansible_port"] == 22
    assert prom01["ansible_user"] == "vagrant"
    assert prom01["ansible_ssh_private_key_file"].endswith("insecure private key")
    gpu01 = inv["all"]["hosts"]["gpu01"]
    assert (gpu01["gpu_model"], gpu01["gpu_count"]) == ("H100", 8)


def test_the_vms_kernel_headers_are_the_roles_default_the_mirror_carries_the_boxs():
    """No override: the driver role installs the VMs' kernel headers from the mirror (a stand-in
    of the lab box's kernel: test_lab_vagrant_box), so DKMS builds the module there."""
    inv = vagrant_inventory(two_host_topology(), SSH_CONFIG, known_hosts=Path("/kh"), mirror=MIRROR)
    assert "nvidia_driver_kernel_headers" not in inv["all"]["vars"]


def test_a_vm_user_other_than_root_runs_commands_through_sudo():
    inv = vagrant_inventory(two_host_topology(), SSH_CONFIG, known_hosts=Path("/kh"), mirror=MIRROR)
    assert inv["all"]["hosts"]["gpu01"]["ansible_become"] is True
    root = SSH_CONFIG.replace("User vagrant\n  Port 22", "User root\n  Port 22")
    inv = vagrant_inventory(two_host_topology(), root, known_hosts=Path("/kh"), mirror=MIRROR)
    assert "ansible_become" not in inv["all"]["hosts"]["gpu01"]


def test_unverified_vms_pin_host_keys_on_first_use_and_mirror_vars_are_kept():
    inv = vagrant_inventory(two_host_topology(), SSH_CONFIG, known_hosts=Path("/kh"), mirror=MIRROR)
    v = inv["all"]["vars"]
    assert v["gpumon_host_key_policy"] == "verify"
    for host in ("gpu01", "prom01"):
        assert inv["all"]["hosts"][host]["gpumon_host_key_policy"] == "accept-new"
    assert v["gpumon_known_hosts_file"] == "/kh"
    assert v["apt_mirror_url"] == MIRROR["apt_mirror_url"]
    assert "ansible_user" not in v  # each VM's user comes from its ssh-config


def test_vms_whose_host_key_was_checked_are_verified_from_the_first_connection():
    inv = vagrant_inventory(
        two_host_topology(),
        SSH_CONFIG,
        known_hosts=Path("/kh"),
        mirror=MIRROR,
        verified=frozenset({"gpu01"}),
    )
    assert "gpumon_host_key_policy" not in inv["all"]["hosts"]["gpu01"]
    assert inv["all"]["hosts"]["prom01"]["gpumon_host_key_policy"] == "accept-new"


def test_a_vm_without_user_or_key_in_ssh_config_is_named():
    text = "Host gpu01\n  HostName 10.0.0.5\n  User vagrant\nHost prom01\n  HostName 10.0.0.6\n"
    with pytest.raises(InputError) as err:
        vagrant_inventory(two_host_topology(), text, known_hosts=Path("/kh"), mirror=MIRROR)
    assert err.value.key == "gpu01.IdentityFile"


def test_a_topology_host_missing_from_ssh_config_is_named():
    with pytest.raises(InputError, match="mon01"):
        vagrant_inventory(load_topology(), SSH_CONFIG, known_hosts=Path("/kh"), mirror=MIRROR)


# ---------------------------------------------------------------- host keys from the console


def key_pair(tmp_path: Path, name: str) -> tuple[str, str]:
    """A real ed25519 public key line and ssh-keygen's own fingerprint of it."""
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    line = path.with_suffix(".pub").read_text().strip()
    listed = subprocess.run(["ssh-keygen", "-l", "-f", str(path.with_suffix(".pub"))],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    return line, listed.split()[1]


def test_fingerprint_is_the_one_ssh_keygen_prints(tmp_path: Path):
    line, printed = key_pair(tmp_path, "k")
    assert fingerprint(line) == printed


def console_with(tmp_path: Path, *fingerprints: str) -> Path:
    log = tmp_path / "gpu01.log"
    lines = ["[    1.0] Linux version 6.1.0", "\x1b[0;32m  OK  \x1b[0m] Started ssh.service"]
    lines += [f"{HOST_KEY_MARK} 256 {fp} root@gpu01 (ED25519)\r" for fp in fingerprints]
    log.write_text("\n".join(lines) + "\n")
    return log


def test_console_fingerprints_are_read_in_boot_order(tmp_path: Path):
    log = console_with(tmp_path, "SHA256:first+/x", "SHA256:second")
    assert console_fingerprints(log) == ["SHA256:first+/x", "SHA256:second"]
    assert console_fingerprints(tmp_path / "missing.log") == []


def test_an_offered_key_matching_the_console_is_accepted(tmp_path: Path, monkeypatch):
    line, printed = key_pair(tmp_path, "k")
    offered = " ".join(line.split()[:2])  # keyscan's "type base64"
    monkeypatch.setattr(vagrant, "keyscan", lambda address, port=22: [offered])
    log = console_with(tmp_path, printed)
    assert checked_host_key("gpu01", "10.0.0.5", log) == offered


def test_an_offered_key_not_on_the_console_is_refused_naming_both(tmp_path: Path, monkeypatch):
    offered, _ = key_pair(tmp_path, "offered")
    _, printed = key_pair(tmp_path, "printed")
    monkeypatch.setattr(vagrant, "keyscan", lambda address, port=22: [offered])
    with pytest.raises(InputError) as err:
        checked_host_key("gpu01", "10.0.0.5", console_with(tmp_path, printed))
    assert printed in str(err.value) and fingerprint(offered) in str(err.value)


def test_a_vm_that_printed_nothing_is_left_to_first_use(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(vagrant, "keyscan", lambda address, port=22: pytest.fail("scanned"))
    assert checked_host_key("gpu01", "10.0.0.5", console_with(tmp_path)) is None


def test_known_hosts_holds_checked_keys_under_name_and_address(tmp_path: Path):
    kh = tmp_path / "known_hosts"
    topo = two_host_topology()
    refresh_known_hosts(kh, topo, {"gpu01": "ssh-ed25519 AAAA1"}, {"gpu01": "id1"})
    assert kh.read_text() == f"{topo.host('gpu01').address},gpu01 ssh-ed25519 AAAA1\n"
    assert kh.stat().st_mode & 0o777 == 0o600


def test_a_first_use_pin_is_kept_while_the_vm_is_the_same_and_dropped_when_recreated(
    tmp_path: Path,
):
    kh = tmp_path / "known_hosts"
    topo = two_host_topology()
    address = topo.host("prom01").address
    refresh_known_hosts(kh, topo, {}, {"prom01": "id1"})
    kh.write_text(f"{address} ssh-ed25519 PINNED\n")  # what accept-new appended
    refresh_known_hosts(kh, topo, {}, {"prom01": "id1"})
    assert "PINNED" in kh.read_text()
    refresh_known_hosts(kh, topo, {}, {"prom01": "id2"})  # vagrant destroy + up
    assert "PINNED" not in kh.read_text()


def test_machine_ids_are_read_from_the_vagrant_dot_directory(tmp_path: Path):
    for name, ident in (("gpu01", "uuid-1"), ("prom01", "uuid-2")):
        d = tmp_path / ".vagrant/machines" / name / "libvirt"
        d.mkdir(parents=True)
        (d / "id").write_text(ident)
    assert machine_ids(tmp_path) == {"gpu01": "uuid-1", "prom01": "uuid-2"}
