"""The Vagrantfile and Vagrant clusters that really boot.

Always run (they need the ``vagrant`` command, installed by scripts/setup): the Vagrantfile
validates, builds the lab's topology with the same names, addresses and groups, gives each VM
the provisioners its role needs, and picks the box as documented.

The Vagrant tier (``@pytest.mark.vagrant``, opt-in with ``GPUMON_VAGRANT=1``; ``.ci/run`` does
not run it: under software emulation it does not fit CI's hour, see README.md; scripts/setup-vagrant
installs what it needs): the lab's own box is built
(or taken from the cache), the VMs of ``deployer/lab/topologies/vagrant.yml`` (one GPU VM, one
Prometheus + Alertmanager VM) boot under software emulation, ``gpumon-deploy up`` converges them,
a second ``up`` changes nothing, ``status`` is green, and ``lab vagrant-down`` leaves nothing
running or defined in libvirt. Slow: see README.md, "Vagrant clusters", for how long.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.lab import libvirtd
from deployer.lab.topology import DEFAULT_TOPOLOGY, load_topology
from deployer.lab.vagrant_box import BOX_NAME, box_cache
from deployer.lab.vagrant_cluster import (
    MANAGEMENT_NETWORK,
    POOL,
    private_network_name,
    vagrant_state,
)
from tests.integration.labtools import run_cli

ROOT = Path(__file__).resolve().parents[2]
VAGRANT_TOPOLOGY = ROOT / "deployer" / "lab" / "topologies" / "vagrant.yml"

pytestmark = pytest.mark.skipif(
    shutil.which("vagrant") is None,
    reason="vagrant is not installed (scripts/setup installs it)",
)


@functools.cache
def has_libvirt_plugin() -> bool:
    out = subprocess.run(["vagrant", "plugin", "list"], capture_output=True, text=True,
                         timeout=120, check=False).stdout  # fmt: skip
    return "vagrant-libvirt" in out


def validate(vagrant_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "VAGRANT_CHECKPOINT_DISABLE": "1", **env}
    args = ["vagrant", "validate"]
    if has_libvirt_plugin():
        full_env["VAGRANT_DEFAULT_PROVIDER"] = "libvirt"
    else:
        args.append("--ignore-provider")
    return subprocess.run(args, cwd=vagrant_dir, env=full_env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def test_vagrantfile_validates():
    proc = validate(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_vagrantfile_builds_the_lab_topology_with_the_same_names_addresses_and_groups(
    tmp_path: Path,
):
    out = tmp_path / "topology.json"
    proc = validate(ROOT, GPUMON_VAGRANT_TOPOLOGY_OUT=str(out), GPUMON_GPU_NODES="6")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = [
        {"name": h.name, "address": h.address, "groups": list(h.groups)}
        for h in load_topology(gpu_nodes=6).hosts
    ]
    assert json.loads(out.read_text()) == expected


def test_a_misspelt_provider_setting_fails_validation(tmp_path: Path):
    if not has_libvirt_plugin():
        pytest.skip("provider settings are only validated with the vagrant-libvirt plugin")
    text = (ROOT / "Vagrantfile").read_text().replace("lv.memory =", "lv.memroy =")
    (tmp_path / "Vagrantfile").write_text(text)
    proc = validate(tmp_path, GPUMON_LAB_TOPOLOGY=str(DEFAULT_TOPOLOGY))
    assert proc.returncode != 0
    assert "memroy" in proc.stdout + proc.stderr


@functools.cache
def provisioners(topology: Path) -> dict[str, list[dict[str, Any]]]:
    """Each VM's provisioners as the Vagrantfile gives them for ``topology`` (asked once)."""
    tmp_path = Path(tempfile.mkdtemp(prefix="gpumon-vagrant-test-"))
    state = tmp_path / "state"
    for h in load_topology(topology).group("gpu"):
        (state / "vagrant" / "hardware" / h.name / "etc" / "gpusim").mkdir(parents=True)
    out = tmp_path / "provisioners.json"
    proc = validate(
        ROOT,
        GPUMON_LAB_TOPOLOGY=str(topology),
        GPUMON_LAB_STATE_DIR=str(state),
        GPUMON_VAGRANT_PROVISIONERS_OUT=str(out),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads(out.read_text())
    shutil.rmtree(tmp_path)
    return plan


def test_every_gpu_vm_and_only_those_get_their_simulated_hardware():
    # Each VM's own: a Ruby block assigning a top-level variable once gave every VM the last
    # host's role (no GPU VM was provisioned as one).
    plan = provisioners(DEFAULT_TOPOLOGY)
    for h in load_topology(DEFAULT_TOPOLOGY).hosts:
        names = [p["name"] for p in plan[h.name]]
        mirror = next(p for p in plan[h.name] if p["name"] == "gpumon-lab-mirror")
        assert ("gpusim-hardware" in names) is h.is_gpu, (h.name, names)
        assert mirror["config"][2] == ("yes" if h.is_gpu else "no"), h.name


def test_every_vm_learns_every_hosts_address():
    plan = provisioners(VAGRANT_TOPOLOGY)
    topo = load_topology(VAGRANT_TOPOLOGY)
    expected = " ".join(f"{h.name}={h.address}" for h in topo.hosts)
    for h in topo.hosts:
        mirror = next(p for p in plan[h.name] if p["name"] == "gpumon-lab-mirror")
        assert mirror["config"][0] == topo.gateway
        assert mirror["config"][4] == expected


def boxes(tmp_path: Path, **env: str) -> dict[str, str]:
    out = tmp_path / "boxes.json"
    home = tmp_path / "vagrant-home"
    home.mkdir(exist_ok=True)
    proc = validate(ROOT, VAGRANT_HOME=str(home), GPUMON_VAGRANT_BOXES_OUT=str(out), **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


def install_fake_box(tmp_path: Path, name: str, provider: str) -> None:
    slug = name.replace("/", "-VAGRANTSLASH-")
    box = tmp_path / "vagrant-home" / "boxes" / slug / "1.0.0" / provider
    box.mkdir(parents=True)
    (box / "metadata.json").write_text(json.dumps({"provider": provider}))


def test_the_public_box_is_used_unless_only_the_lab_box_is_installed(tmp_path: Path):
    assert boxes(tmp_path) == {"default": "debian/bookworm64", "libvirt": "debian/bookworm64"}
    install_fake_box(tmp_path, BOX_NAME, "libvirt")
    assert boxes(tmp_path) == {"default": "debian/bookworm64", "libvirt": BOX_NAME}
    install_fake_box(tmp_path, "debian/bookworm64", "libvirt")  # a user's habit wins
    assert boxes(tmp_path)["libvirt"] == "debian/bookworm64"


def test_virtualbox_keeps_the_public_box_and_a_named_box_wins(tmp_path: Path):
    install_fake_box(tmp_path, BOX_NAME, "libvirt")
    install_fake_box(tmp_path, BOX_NAME, "virtualbox")  # the lab box is libvirt-only anyway
    assert boxes(tmp_path)["default"] == "debian/bookworm64"
    named = boxes(tmp_path, GPUMON_VAGRANT_BOX="generic/debian12")
    assert named == {"default": "generic/debian12", "libvirt": "generic/debian12"}


# ---------------------------------------------------------------- the Vagrant tier

TIER = os.environ.get("GPUMON_VAGRANT") == "1"
UP_TIMEOUT_S = 3600  # the CLI bounds each step itself (vagrant up 1500 s, provision 900 s)
DEPLOY_TIMEOUT_S = 2400
SSH_TIMEOUT_S = 180


def tier_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "the Vagrant tier needs root (libvirt's system instance)"
    for tool in ("virsh", "qemu-system-x86_64", "qemu-img", "mkfs.ext4", "debootstrap"):
        if shutil.which(tool) is None:
            return f"the Vagrant tier needs {tool} (run scripts/setup-vagrant)"
    if not has_libvirt_plugin():
        return "the Vagrant tier needs the vagrant-libvirt plugin (run scripts/setup-vagrant)"
    return None


def tier_env() -> dict[str, str]:
    return {
        "GPUMON_LAB_TOPOLOGY": str(VAGRANT_TOPOLOGY),
        "GPUMON_LIBVIRT_DRIVER": os.environ.get("GPUMON_LIBVIRT_DRIVER", "qemu"),
        "VAGRANT_CHECKPOINT_DISABLE": "1",
    }


def gpumon(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=timeout, env=tier_env())


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, Any]]:
    if not TIER:
        pytest.skip("the Vagrant tier is opt-in: GPUMON_VAGRANT=1 (CI does not run it: README.md)")
    reason = tier_unavailable_reason()
    if reason:
        pytest.fail(f"GPUMON_VAGRANT=1 but {reason}")
    # Whatever a killed run left behind goes first.
    down = gpumon("lab", "vagrant-down", timeout=900)
    assert down.returncode == 0, down.stderr[-3000:]
    proc = gpumon("lab", "vagrant-up", timeout=UP_TIMEOUT_S)
    try:
        assert proc.returncode == 0, proc.stderr[-5000:]
        yield json.loads(proc.stdout)
    finally:
        # Never leave VMs running; test_destroy_... checks a clean teardown (a no-op after it).
        gpumon("lab", "vagrant-down", timeout=900)


@pytest.fixture(scope="module")
def inventory(cluster: dict[str, Any]) -> Path:
    return Path(cluster["inventory"])


def inventory_data(inventory: Path) -> dict[str, Any]:
    return yaml.safe_load(inventory.read_text())


def vm_ssh(inventory: Path, host: str, command: str) -> subprocess.CompletedProcess[str]:
    """``command`` on ``host`` over SSH as the inventory says, host key checked strictly."""
    data = inventory_data(inventory)
    h = data["all"]["hosts"][host]
    known_hosts = data["all"]["vars"]["gpumon_known_hosts_file"]
    cmd = ["ssh", "-i", h["ansible_ssh_private_key_file"], "-o", "IdentitiesOnly=yes",
           "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
           "-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
           "-o", "ConnectTimeout=60", f"{h['ansible_user']}@{h['ansible_host']}", command]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=SSH_TIMEOUT_S, check=False)


def up_json(inventory: Path) -> tuple[int, dict[str, Any], str]:
    proc = gpumon("up", "-i", str(inventory), "--output", "json", timeout=DEPLOY_TIMEOUT_S)
    assert proc.stdout.strip(), proc.stderr[-4000:]
    return proc.returncode, json.loads(proc.stdout), proc.stderr


@pytest.mark.vagrant
def test_the_vms_boot_the_lab_box_under_software_emulation(cluster: dict[str, Any]):
    assert cluster["box"] == BOX_NAME
    for host in load_topology(VAGRANT_TOPOLOGY).hosts:
        domains = libvirtd.virsh("list", "--name").split()
        domain = next(d for d in domains if d.endswith(f"_{host.name}"))
        xml = libvirtd.virsh("dumpxml", domain)
        assert "<domain type='qemu'" in xml or tier_env()["GPUMON_LIBVIRT_DRIVER"] == "kvm"
        assert "/libvirt/vmlinuz</kernel>" in xml  # the kernel shipped in the box


@pytest.mark.vagrant
def test_the_box_is_cached_and_not_rebuilt(cluster: dict[str, Any]):
    proc = gpumon("lab", "vagrant-box", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert (result["built"], result["added"]) == (False, False)
    assert Path(result["file"]).parent.parent == box_cache() / "boxes"


@pytest.mark.vagrant
def test_every_vm_host_key_is_verified_from_its_console(inventory: Path):
    data = inventory_data(inventory)
    assert data["all"]["vars"]["gpumon_host_key_policy"] == "verify"
    for name, host in data["all"]["hosts"].items():
        assert "gpumon_host_key_policy" not in host, name
    lines = Path(data["all"]["vars"]["gpumon_known_hosts_file"]).read_text().splitlines()
    assert len(lines) == len(data["all"]["hosts"])


@pytest.mark.vagrant
def test_the_vms_have_no_route_beyond_this_machine(inventory: Path):
    topo = load_topology(VAGRANT_TOPOLOGY)
    for host in topo.hosts:
        proc = vm_ssh(inventory, host.name, "ip -4 route show; ip -6 route show")
        assert proc.returncode == 0, proc.stderr
        assert "default" not in proc.stdout, (host.name, proc.stdout)


@pytest.mark.vagrant
def test_the_gpu_vm_has_its_simulated_gpus_and_the_lab_mirror_only(inventory: Path):
    proc = vm_ssh(inventory, "gpu01", "cat /etc/gpusim/hardware.json; grep -rh '^URIs\\|^deb' "
                  "/etc/apt/sources.list.d/")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count('"uuid"') == load_topology(VAGRANT_TOPOLOGY).host("gpu01").gpu_count
    gateway = load_topology(VAGRANT_TOPOLOGY).gateway
    uris = [line for line in proc.stdout.splitlines() if line.startswith(("URIs", "deb"))]
    assert uris and all(gateway in line for line in uris), uris


@pytest.fixture(scope="module")
def first_up(inventory: Path) -> dict[str, Any]:
    rc, report, stderr = up_json(inventory)
    assert rc == 0, json.dumps(report["hosts"], indent=1)[:4000] + stderr[-2000:]
    return report


@pytest.mark.vagrant
def test_up_converges_the_gpu_and_the_monitoring_vm(first_up: dict[str, Any]):
    for host in ("gpu01", "prom01"):
        counts = first_up["hosts"][host]["counts"]
        assert counts["failed"] == 0 and counts["unreachable"] == 0, (host, counts)
    assert first_up["totals"]["changed"] > 0


@pytest.mark.vagrant
def test_a_second_up_changes_nothing(inventory: Path, first_up: dict[str, Any]):
    rc, report, stderr = up_json(inventory)
    assert rc == 0, stderr[-3000:]
    changed = [
        (h, t["task"]) for h, v in report["hosts"].items() for t in v["tasks"] if t["changed"]
    ]
    assert report["totals"]["changed"] == 0, changed


@pytest.mark.vagrant
def test_status_is_green(inventory: Path, first_up: dict[str, Any]):
    proc = gpumon("status", "-i", str(inventory), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def libvirt_inventory() -> dict[str, list[str]]:
    """Domains, networks, pools and volumes libvirt has, asked of libvirtd (started for the
    question if it is not running, and stopped again)."""
    probe = vagrant_state() / "probe"
    started = libvirtd.ensure_running(probe)
    try:
        pools = libvirtd.virsh("pool-list", "--all", "--name").split()
        volumes = []
        for pool in pools:
            listing = libvirtd.virsh("vol-list", "--pool", pool, check=False)
            volumes += [line.split()[0] for line in listing.splitlines() if line.strip()]
        return {
            "domains": libvirtd.virsh("list", "--all", "--name").split(),
            "networks": libvirtd.virsh("net-list", "--all", "--name").split(),
            "pools": pools,
            "volumes": volumes,
        }
    finally:
        if started:
            libvirtd.stop(probe)


@pytest.mark.vagrant
def test_destroy_leaves_nothing_running_or_defined_in_libvirt(cluster: dict[str, Any]):
    topo = load_topology(VAGRANT_TOPOLOGY)
    proc = gpumon("lab", "vagrant-down", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    left = libvirt_inventory()
    assert not [d for d in left["domains"] if d.rsplit("_", 1)[-1] in {h.name for h in topo.hosts}]
    assert private_network_name(topo) not in left["networks"]
    assert MANAGEMENT_NETWORK not in left["networks"]
    assert POOL not in left["pools"]
    assert not [v for v in left["volumes"] if "gpumon-lab" in v], left["volumes"]
    assert libvirtd.started_here(vagrant_state()) == []
    running = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not [p for p in running.splitlines() if p.startswith("/usr/bin/qemu-system")
                and any(f"_{h.name}," in p for h in topo.hosts)]  # fmt: skip
