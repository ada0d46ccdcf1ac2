"""The lab's own Vagrant box (what decides a rebuild, where Vagrant has it), the libvirt daemons
the lab starts by hand, and which box a Vagrant cluster uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployer.lab import vagrant_box
from deployer.lab.libvirtd import qemu_runs_as_root
from deployer.lab.topology import load_topology
from deployer.lab.vagrant_cluster import (
    PUBLIC_BOX,
    VagrantCluster,
    private_network_name,
)

ROOT = Path(__file__).resolve().parents[2]
VAGRANT_TOPOLOGY = ROOT / "deployer/lab/topologies/vagrant.yml"
BASE = Path("/cache/base/bookworm-771b723bbc1c/rootfs")
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOneKey vagrant@gpumon-lab-box"


def test_the_box_key_is_stable_for_the_same_inputs():
    assert vagrant_box.box_key(BASE, KEY) == vagrant_box.box_key(BASE, KEY)


def test_a_new_base_or_login_key_builds_a_new_box():
    other_base = Path("/cache/base/bookworm-000000000000/rootfs")
    assert vagrant_box.box_key(other_base, KEY) != vagrant_box.box_key(BASE, KEY)
    other_key = KEY.replace("OneKey", "TwoKey")
    assert vagrant_box.box_key(BASE, other_key) != vagrant_box.box_key(BASE, KEY)


def test_a_changed_recipe_builds_a_new_box(monkeypatch):
    before = vagrant_box.box_key(BASE, KEY)
    monkeypatch.setattr(vagrant_box, "CMD_LINE", vagrant_box.CMD_LINE + " debug")
    assert vagrant_box.box_key(BASE, KEY) != before


def test_the_box_records_the_kernel_its_vms_boot(tmp_path):
    """Read back from the box's .complete record; a release no package name can hold, or a
    box cached before the kernel was recorded, has none."""
    for recorded, kernel in (("6.1.0-41-amd64", "6.1.0-41-amd64"), (None, None),
                             ("6.1.0 ; rm -rf /", None), ("", None)):  # fmt: skip
        meta = {"key": "k", "version": "12.0.1", "sha256": "x"}
        if recorded is not None:
            meta["kernel"] = recorded
        (tmp_path / ".complete").write_text(json.dumps(meta))
        box = vagrant_box._box_at(tmp_path, "k", built=False, started=0.0)
        assert box.kernel == kernel, recorded


def test_the_mirror_keeps_the_box_kernels_it_carries_and_adds_those_asked():
    from deployer.lab import mirror

    assert mirror.kept_box_kernels({}, ()) == ()
    assert mirror.kept_box_kernels({}, ("6.1.0-41-amd64",)) == ("6.1.0-41-amd64",)
    kept = {"box_kernels": ["6.1.0-41-amd64"]}
    assert mirror.kept_box_kernels(kept, ()) == ("6.1.0-41-amd64",)  # a lab naming none
    assert mirror.kept_box_kernels(kept, ("6.1.0-42-amd64",)) == (
        "6.1.0-41-amd64", "6.1.0-42-amd64",
    )  # fmt: skip
    assert mirror.gpusim_digest(("6.1.0-41-amd64",)) != mirror.gpusim_digest(())


def test_the_box_vagrantfile_boots_the_shipped_kernel_with_the_generated_key():
    text = vagrant_box.BOX_VAGRANTFILE
    assert 'File.join(box_dir, "vagrant_key")' in text
    assert "config.ssh.insert_key = false" in text
    assert 'lv.kernel = File.join(box_dir, "vmlinuz")' in text
    assert vagrant_box.CMD_LINE in text
    assert "net.ifnames=0" in vagrant_box.CMD_LINE  # eth0 management, eth1 private


def test_the_host_key_unit_prints_what_the_inventory_looks_for():
    from deployer.lab.vagrant import HOST_KEY_MARK

    assert vagrant_box.HOST_KEY_MARK == HOST_KEY_MARK
    assert HOST_KEY_MARK in vagrant_box.HOST_KEY_UNIT


def installed(home: Path, name: str, version: str, stamp: dict | None = None) -> Path:
    d = home / "boxes" / name.replace("/", "-VAGRANTSLASH-") / version / "libvirt"
    d.mkdir(parents=True)
    if stamp is not None:
        (d / vagrant_box.STAMP).write_text(json.dumps(stamp))
    return d


def test_installed_versions_and_key_are_read_from_vagrants_box_store(tmp_path, monkeypatch):
    monkeypatch.setenv("VAGRANT_HOME", str(tmp_path))
    assert vagrant_box.installed_versions() == {}
    assert vagrant_box.installed_key() is None
    d = installed(tmp_path, vagrant_box.BOX_NAME, "12.0.5", {"key": "abc"})
    assert vagrant_box.installed_versions() == {"12.0.5": d}
    assert vagrant_box.installed_key() == "abc"


def test_a_box_vagrant_already_has_is_not_added_again(tmp_path, monkeypatch):
    monkeypatch.setenv("VAGRANT_HOME", str(tmp_path))
    installed(tmp_path, vagrant_box.BOX_NAME, "12.0.5", {"key": "abc"})
    box = vagrant_box.Box(tmp_path / "x.box", "abc", "12.0.5", "00", built=False, seconds=0)
    monkeypatch.setattr(vagrant_box, "_vagrant", lambda *a: pytest.fail("vagrant called"))
    assert vagrant_box.install(box, {}) is False


def test_a_rebuilt_box_is_added_by_catalog_and_older_versions_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("VAGRANT_HOME", str(tmp_path / "home"))
    installed(tmp_path / "home", vagrant_box.BOX_NAME, "12.0.5", {"key": "old"})
    calls: list[list[str]] = []
    monkeypatch.setattr(vagrant_box, "_vagrant", lambda args, env, log: calls.append(args))
    box = vagrant_box.Box(tmp_path / "b.box", "new", "12.0.9", "f00d", built=True, seconds=1)
    assert vagrant_box.install(box, {}) is True
    catalog = json.loads((tmp_path / "catalog.json").read_text())
    provider = catalog["versions"][0]["providers"][0]
    assert (catalog["name"], catalog["versions"][0]["version"]) == (vagrant_box.BOX_NAME, "12.0.9")
    assert (provider["checksum_type"], provider["checksum"]) == ("sha256", "f00d")
    assert provider["url"] == (tmp_path / "b.box").as_uri()
    assert calls[0][:2] == ["box", "add"]
    assert calls[1][:3] == ["box", "remove", vagrant_box.BOX_NAME]
    assert "12.0.5" in calls[1]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('user = "root"\ngroup = "root"\n', True),
        ('#user = "root"\n#group = "root"\n', False),
        ('user = "root"\n', False),
        ('user = "root"\ngroup = "root"\nuser = "libvirt-qemu"\n', False),
    ],
)
def test_qemu_conf_must_run_qemu_as_root_for_a_hand_started_libvirtd(tmp_path, text, expected):
    conf = tmp_path / "qemu.conf"
    conf.write_text(text)
    assert qemu_runs_as_root(conf) is expected


def test_a_missing_qemu_conf_does_not_run_qemu_as_root(tmp_path):
    assert qemu_runs_as_root(tmp_path / "none.conf") is False


def cluster(box: str) -> VagrantCluster:
    return VagrantCluster(topology_file=VAGRANT_TOPOLOGY, vagrant_dir=ROOT, box=box)


def test_auto_takes_the_public_box_when_vagrant_has_it_for_libvirt(tmp_path, monkeypatch):
    monkeypatch.setenv("VAGRANT_HOME", str(tmp_path))
    installed(tmp_path, vagrant_box.BOX_NAME, "12.0.5")
    installed(tmp_path, PUBLIC_BOX, "12.20240101.1")
    assert cluster("auto").choose_box() == PUBLIC_BOX


def test_auto_takes_the_lab_box_where_no_public_box_is_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("VAGRANT_HOME", str(tmp_path))
    assert cluster("auto").choose_box() == vagrant_box.BOX_NAME
    assert cluster("public").choose_box() == PUBLIC_BOX
    assert cluster("generic/debian12").choose_box() == "generic/debian12"


def test_the_cluster_passes_the_topology_and_disables_the_checkpoint_call():
    env = cluster("auto").env("some/box")
    assert env["VAGRANT_CHECKPOINT_DISABLE"] == "1"
    assert env["GPUMON_LAB_TOPOLOGY"] == str(VAGRANT_TOPOLOGY)
    assert env["GPUMON_VAGRANT_BOX"] == "some/box"


def test_the_private_network_is_named_after_the_topologys_bridge():
    assert private_network_name(load_topology(VAGRANT_TOPOLOGY)) == "gpumon-gpumonvg0"
    assert private_network_name(load_topology()) == "gpumon-gpumonbr0"


def test_the_vagrant_topology_has_one_gpu_and_one_monitoring_host_off_the_named_labs_range():
    topo = load_topology(VAGRANT_TOPOLOGY)
    assert [h.name for h in topo.group("gpu")] == ["gpu01"]
    assert {g for h in topo.hosts for g in h.groups} >= {"gpu", "prometheus", "alertmanager"}
    assert len(topo.hosts) == 2
    third = int(str(topo.subnet.network_address).split(".")[2])
    assert third > 250  # named nspawn labs take 10.213.1-250.0/24 (topology.for_lab_name)
