"""The GPU roles (nvidia_driver, dcgm, dcgm_exporter, then node_exporter) on the lab's GPU hosts.

The real CLI converges ``--limit gpu`` twice (the second run must change nothing), testinfra checks
the hosts over SSH with strict host-key checking, and ``check`` / ``up`` refuse incompatible or
malformed plans without touching any host.

The lab's simulated NVIDIA repository holds DCGM 4.4.2/4.5.3 and exporters 4.4.2-4.7.1 /
4.5.3-4.8.2, while the matrix's default pair is the newer 4.6.0-4.8.3, and its release mirror holds
node_exporter 1.5.0 (the role defaults to 1.9.1): the runs pin both with ``-e`` (LAB_VERSIONS).

Set ``GPUMON_GPU_ROLES_LAB=<name>`` to run against another lab that is already up (development);
by default the session's ``lab`` fixture is used.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from deployer.lab import Lab
from tests.integration.labtools import infra, lab_named_by, run_cli, write_ssh_config

pytestmark = pytest.mark.lab

MY_ROLES = ("nvidia_driver", "dcgm", "dcgm_exporter")
LAB_VERSIONS = ("-e", "dcgm_exporter_version=4.5.3-4.8.2", "-e", "node_exporter_version=1.5.0")


gpumon = functools.partial(run_cli, timeout=1200)


@pytest.fixture(scope="module")
def gpu_lab(request) -> Lab:
    return lab_named_by("GPUMON_GPU_ROLES_LAB", request)


@pytest.fixture(scope="module")
def gpu_hosts(gpu_lab) -> dict[str, dict]:
    """GPU host name -> its inventory variables (gpu_model, gpu_count, nvswitch, ...)."""
    data = yaml.safe_load(gpu_lab.inventory_path.read_text())["all"]
    members = data["children"]["gpu"]["hosts"]
    return {h: data["hosts"][h] for h in members}


@pytest.fixture(scope="module")
def ssh_config(gpu_lab, tmp_path_factory) -> Path:
    return write_ssh_config(gpu_lab, tmp_path_factory.mktemp("ssh") / "config")


def up_json(lab: Lab, *args: str) -> tuple[int, dict, str]:
    proc = gpumon("up", "-i", str(lab.inventory_path), "--output", "json", *args)
    assert proc.stdout.strip(), proc.stderr[-4000:]
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def tasks_of(report: dict, roles: tuple[str, ...] = MY_ROLES) -> list[dict]:
    """Every task result of ``roles`` in a JSON report, with its host added."""
    return [
        {**t, "host": host}
        for host, h in report["hosts"].items()
        for t in h["tasks"]
        if t["role"] in roles
    ]


@pytest.fixture(scope="module")
def runs(gpu_lab) -> tuple[tuple[int, dict], tuple[int, dict]]:
    """Two converges of the GPU hosts, back to back."""
    first = up_json(gpu_lab, "--limit", "gpu", *LAB_VERSIONS)
    second = up_json(gpu_lab, "--limit", "gpu", *LAB_VERSIONS)
    return first[:2], second[:2]


# ---- converge and idempotence -----------------------------------------------------------------


def test_the_gpu_roles_converge_on_every_gpu_host(runs, gpu_hosts):
    (_, report), _ = runs
    assert set(report["hosts"]) == set(gpu_hosts)
    failed = [
        (t["host"], t["task"], t.get("error")) for t in tasks_of(report) if t["status"] == "failed"
    ]
    assert failed == []
    for host in gpu_hosts:
        roles = {t["role"] for t in report["hosts"][host]["tasks"]}
        assert set(MY_ROLES) <= roles, host


def test_all_four_roles_converge_and_the_run_succeeds(runs):
    (rc, report), _ = runs
    roles = (*MY_ROLES, "node_exporter")
    failed = [(t["host"], t["role"], t["task"], t.get("error")) for t in tasks_of(report, roles)
              if t["status"] not in ("ok", "changed")]  # fmt: skip
    assert failed == []
    assert rc == 0


def test_the_second_run_changes_nothing_in_the_gpu_roles(runs):
    _, (_, report) = runs
    changed = [(t["host"], t["task"]) for t in tasks_of(report) if t["status"] != "ok"]
    assert changed == []


def test_the_second_run_reports_zero_changes(runs):
    _, (rc, report) = runs
    assert rc == 0
    assert report["totals"].get("changed", 0) == 0, report["totals"]


# ---- the hosts, as testinfra sees them ---------------------------------------------------------


def test_driver_dcgm_and_exporter_packages_are_held_at_their_planned_versions(
    runs, gpu_hosts, ssh_config
):
    for name, hv in gpu_hosts.items():
        host = infra(ssh_config, name)
        held = set(host.check_output("apt-mark showhold").split())
        v100 = hv["gpu_model"] == "V100"
        driver = "cuda-drivers" if v100 else "nvidia-open"  # proprietary for Volta (compat)
        dcgm_variant = (
            "datacenter-gpu-manager-4-cuda12" if v100 else "datacenter-gpu-manager-4-cuda13"
        )
        expected = {driver, "datacenter-gpu-manager-4-core", dcgm_variant,
                    "datacenter-gpu-manager-exporter"}  # fmt: skip
        if hv["nvswitch"]:
            expected |= {"nvidia-fabricmanager", "libnvidia-nscq"}
        assert expected <= held, name
        assert host.package("datacenter-gpu-manager-4-core").version == "1:4.5.3-1"
        assert host.package("datacenter-gpu-manager-exporter").version == "4.8.2-1"
        driver_version = host.package(driver).version
        assert driver_version == ("580.126.20-1" if v100 else "595.45.04-1")
        if hv["nvswitch"]:
            assert host.package("nvidia-fabricmanager").version == driver_version


def test_apt_would_not_move_the_pinned_driver(runs, gpu_hosts, ssh_config):
    for name, hv in gpu_hosts.items():
        host = infra(ssh_config, name)
        driver = "cuda-drivers" if hv["gpu_model"] == "V100" else "nvidia-open"
        policy = host.check_output(f"apt-cache policy {driver}")
        installed = [x.split(":", 1)[1].strip() for x in policy.splitlines() if "Installed:" in x]
        candidate = [x.split(":", 1)[1].strip() for x in policy.splitlines() if "Candidate:" in x]
        assert installed == candidate, policy
        upgrade = host.run("apt-get -s -o Debug::NoLocking=1 upgrade")
        assert upgrade.rc == 0
        nvidia = re.compile(
            r"^Inst (nvidia-|libnvidia-|libcuda|cuda-drivers|datacenter-gpu-manager)"
        )
        moved = [x for x in upgrade.stdout.splitlines() if nvidia.match(x)]
        assert moved == [], name


def test_services_are_active_enabled_and_listening(runs, gpu_hosts, ssh_config):
    for name, hv in gpu_hosts.items():
        host = infra(ssh_config, name)
        units = ["nvidia-persistenced", "nvidia-dcgm", "dcgm-exporter"]
        if hv["nvswitch"]:
            units.append("nvidia-fabricmanager")
        for unit in units:
            service = host.service(unit)
            assert service.is_running and service.is_enabled, f"{name}: {unit}"
        assert host.socket("tcp://127.0.0.1:5555").is_listening
        assert not host.socket("tcp://0.0.0.0:5555").is_listening
        assert host.socket("tcp://0.0.0.0:9400").is_listening
        assert host.check_output("systemctl show -p User --value dcgm-exporter") == "dcgm-exporter"
        assert "-r localhost:5555" in host.check_output(
            "systemctl show -p ExecStart --value dcgm-exporter"
        )


def test_the_exporter_serves_every_simulated_gpu(runs, gpu_hosts, ssh_config):
    for name, hv in gpu_hosts.items():
        host = infra(ssh_config, name)
        uuids = host.check_output("nvidia-smi --query-gpu=uuid --format=csv,noheader").split()
        assert len(uuids) == hv["gpu_count"]
        metrics = host.check_output("curl -fsS http://127.0.0.1:9400/metrics")
        temps = [x for x in metrics.splitlines() if x.startswith("DCGM_FI_DEV_GPU_TEMP{")]
        # one series per GPU, or per GPU instance of a GPU in MIG mode (each with the GPU's UUID)
        assert {x.split('UUID="')[1].split('"')[0] for x in temps} == set(uuids)
        mig = "Enabled" in host.check_output(
            "nvidia-smi --query-gpu=mig.mode.current --format=csv,noheader"
        )
        # profiling is opt-in; a host with a GPU in MIG mode collects its instances' activity
        profiling = {x.split("{")[0] for x in metrics.splitlines() if x.startswith("DCGM_FI_PROF_")}
        assert profiling == ({"DCGM_FI_PROF_GR_ENGINE_ACTIVE"} if mig else set()), name


def test_a_changed_field_group_restarts_the_exporter_with_the_new_csv(
    runs, gpu_lab, gpu_hosts, ssh_config
):
    name = next(iter(gpu_hosts))
    host = infra(ssh_config, name)
    before = host.check_output("systemctl show -p InvocationID --value dcgm-exporter")
    extra = ("-e", '{"dcgm_exporter_field_groups": ["upstream", "profiling"]}')
    try:
        _, report, _ = up_json(gpu_lab, "--limit", name, *LAB_VERSIONS, *extra)
        restarted = [t for t in tasks_of(report) if t["task"] == "restart dcgm-exporter"]
        assert [t["status"] for t in restarted] == ["changed"]
        assert host.check_output("systemctl show -p InvocationID --value dcgm-exporter") != before
        assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in host.check_output(
            "curl -fsS http://127.0.0.1:9400/metrics"
        )
    finally:
        up_json(gpu_lab, "--limit", name, *LAB_VERSIONS)


# ---- refusals touch nothing ----------------------------------------------------------------------


def snapshot(ssh_config: Path, name: str) -> str:
    host = infra(ssh_config, name)
    return host.check_output(
        "find /etc/apt /etc/systemd/system /etc/dcgm-exporter /etc/modprobe.d -type f "
        "-exec sha256sum {} + | sort; dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n'"
    )


def test_check_refuses_a_branch_after_r580_on_the_v100_host_and_touches_nothing(
    runs, gpu_lab, gpu_hosts, ssh_config
):
    v100 = next(h for h, hv in gpu_hosts.items() if hv["gpu_model"] == "V100")
    before = {h: snapshot(ssh_config, h) for h in gpu_hosts}
    proc = gpumon(
        "check", "-i", str(gpu_lab.inventory_path), "--limit", v100,
        "-e", "nvidia_driver_branch=595",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{v100}:" in proc.stderr and "[arch-last-branch]" in proc.stderr
    refused_up = gpumon(
        "up", "-i", str(gpu_lab.inventory_path), "--limit", v100, *LAB_VERSIONS,
        "-e", "nvidia_driver_branch=595",
    )  # fmt: skip
    assert refused_up.returncode == 2
    assert "arch-last-branch" in refused_up.stderr
    assert {h: snapshot(ssh_config, h) for h in gpu_hosts} == before


@pytest.mark.parametrize(
    ("extra", "key", "words"),
    [
        ("gpu_model=Z900", "gpu_model", "unknown GPU model 'Z900'"),
        ("nvidia_driver_branch=999", "nvidia_driver_branch", "unknown branch R999"),
        ("nvidia_driver_version=58O.65.06", "nvidia_driver_version", "is not a driver version"),
        ("dcgm_version=4.5", "dcgm_version", "is not a DCGM version"),
        ("nvidia_driver_reboot=always", "nvidia_driver_reboot", "is not one of never, if_required"),
    ],
)
def test_malformed_plans_are_refused_before_any_host_is_touched(
    runs, gpu_lab, gpu_hosts, ssh_config, extra, key, words
):
    name = next(iter(gpu_hosts))
    before = snapshot(ssh_config, name)
    for command in ("check", "up"):
        proc = gpumon(command, "-i", str(gpu_lab.inventory_path), "--limit", name, "-e", extra)
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        assert key in proc.stderr and words in proc.stderr, proc.stderr
    assert snapshot(ssh_config, name) == before


# ---- an inventory the product did not write (issue 14) -----------------------------------------


def write_inventory_copy(lab: Lab, data: dict, dest: Path) -> Path:
    """``data`` (the lab's inventory, changed) written as ``dest/inventory.yml``, beside a copy
    of the lab's group_vars: the path."""
    dest.mkdir()
    if (lab.inventory_path.parent / "group_vars").is_dir():
        shutil.copytree(lab.inventory_path.parent / "group_vars", dest / "group_vars")
    path = dest / "inventory.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def deepops_copy(lab: Lab, dest: Path, group: str = "slurm-node", declared: bool = False) -> Path:
    """The lab's inventory as DeepOps (or kubespray: ``group="kube_node"``) would have it: the
    GPU hosts in ``group``, no ``gpu`` group, and unless ``declared`` no GPU variable (model,
    count, NVSwitch)."""
    data = yaml.safe_load(lab.inventory_path.read_text())
    groups = data["all"]["children"]
    groups[group] = groups.pop("gpu")
    for h in groups[group]["hosts"]:
        for key in () if declared else ("gpu_model", "gpu_count", "nvswitch"):
            data["all"]["hosts"][h].pop(key, None)
            (groups[group]["hosts"][h] or {}).pop(key, None)
    return write_inventory_copy(lab, data, dest)


def test_a_deepops_shaped_inventory_is_mapped_initialised_from_facts_and_converged(
    runs, gpu_lab, gpu_hosts, tmp_path
):
    inv = deepops_copy(gpu_lab, tmp_path / "deepops")
    # unmapped: the GPU hosts are in none of the site's groups, and the run says so
    nothing = gpumon("up", "-i", str(inv), "--limit", "slurm-node", "--check", *LAB_VERSIONS)
    assert nothing.returncode == 2, nothing.stderr
    assert "no selected host is in a group the site's plays apply to" in nothing.stderr
    # init reads the facts and writes what the product needs, beside the inventory
    init = gpumon("init", "-i", str(inv), "--group", "gpu=slurm-node")
    assert init.returncode == 0, init.stdout + init.stderr
    for host, declared in gpu_hosts.items():
        assert f"{host}: gpu_model={declared['gpu_model']}" in init.stdout, init.stdout
        assert f"gpu_count={declared['gpu_count']}" in init.stdout
    # and with them, the converged lab is converged for this inventory too: nothing to change
    code, report, err = up_json_at(inv, "--limit", "gpu", "--check", *LAB_VERSIONS)
    assert code == 0, err[-3000:]
    assert set(report["hosts"]) == set(gpu_hosts)
    changed = [(t["host"], t["task"]) for t in tasks_of(report) if t["status"] == "changed"]
    assert changed == []


def test_a_kubespray_shaped_inventory_with_its_models_declared_converges_with_group(
    runs, gpu_lab, gpu_hosts, tmp_path
):
    inv = deepops_copy(gpu_lab, tmp_path / "kubespray", group="kube_node", declared=True)
    code, report, err = up_json_at(inv, "--group", "gpu=kube_node", "--limit", "gpu", *LAB_VERSIONS)
    assert code == 0, err[-3000:]
    assert set(report["hosts"]) == set(gpu_hosts)
    changed = [(t["host"], t["task"]) for t in tasks_of(report) if t["status"] == "changed"]
    assert changed == []


def facts_only_copy(lab: Lab, dest: Path, keep: tuple[str, ...]) -> Path:
    """The lab's inventory as a cluster of the GPU hosts ``keep`` (the others left out) whose
    inventory declares no ``gpu_count``: the count comes from facts."""
    data = yaml.safe_load(lab.inventory_path.read_text())
    gpu = set(data["all"]["children"]["gpu"]["hosts"])
    for h in gpu - set(keep):
        data["all"]["hosts"].pop(h)
        data["all"]["children"]["gpu"]["hosts"].pop(h)
    for h in keep:
        data["all"]["hosts"][h].pop("gpu_count")
    return write_inventory_copy(lab, data, dest)


def test_status_holds_hosts_without_gpu_count_to_the_count_up_planned_from_facts(gpu_lab, tmp_path):
    keep = ("gpu05", "gpu06")  # 2 GPUs each (2xH100 with MIG on GPU 0, 2xL40S)
    inv = facts_only_copy(gpu_lab, tmp_path / "facts-only", keep)
    # The count comes from facts: nvidia-smi's once the driver is in, the (simulated) PCI bus's
    # before. A first converge with the lab's own inventory puts the lab's driver there.
    # --out-of-service: another module may have left a GPU host's driver elsewhere (no GPU work)
    code, _, err = up_json(gpu_lab, "--limit", ":".join(keep), "--out-of-service", *LAB_VERSIONS)
    assert code == 0, err[-4000:]
    code, _, err = up_json_at(inv, "--out-of-service", *LAB_VERSIONS)
    assert code == 0, err[-4000:]
    for h in keep:  # what up recorded: the count it planned from the facts
        proc = gpu_lab.ssh(h, "cat /var/lib/node_exporter/textfile_collector/gpumon.prom")
        assert "gpumon_expected_gpus 2" in proc.stdout, (h, proc.stdout, proc.stderr)
    proc = gpumon("status", "-i", str(inv), "--output", "json", "--wait", "300", timeout=420)
    data = json.loads(proc.stdout)
    assert proc.returncode == 0, [c for c in data["checks"] if not c["ok"]]
    rows = {(c["component"], c["host"]): c for c in data["checks"]}
    for h in keep:
        row = rows[("gpus", h)]
        assert row["check"] == "2 GPUs in the exporter's metrics", row
        assert row["detail"] == "2/2 (distinct UUIDs) on 2 replica(s) (recorded by up)", row


def up_json_at(inventory: Path, *args: str) -> tuple[int, dict, str]:
    proc = gpumon("up", "-i", str(inventory), "--output", "json", *args)
    assert proc.stdout.strip(), proc.stderr[-4000:]
    return proc.returncode, json.loads(proc.stdout), proc.stderr
