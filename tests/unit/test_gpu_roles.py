"""The GPU roles as the planner makes them concrete for a host, before any connection.

Each test plans the site's GPU plays (nvidia_driver, dcgm, dcgm_exporter) for a fake host with
the ``facts`` and ``gpu_plan`` the session would give it, and reads the tasks' final arguments:
repository (Debian/Ubuntu and RHEL), pins and holds, packages from the compatibility matrix,
reboot guard, nv-hostengine binding, exporter unit, CSV and web config.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer import dcgm_fields
from deployer.connection import CommandResult
from deployer.errors import InputError
from deployer.facts import HostFacts
from deployer.gpu import gpu_plan
from deployer.lab.gpusim.standins.exporter import parse_csv
from deployer.modules.driver_switch import DriverSwitch
from deployer.plan import Planner
from deployer.roles import load_site

ROOT = Path(__file__).resolve().parents[2]
GPU_ROLES = ("nvidia_driver", "dcgm", "dcgm_exporter")
DEBIAN = {"os_id": "debian", "os_family": "debian", "os_version": "12", "arch": "x86_64"}
UBUNTU_ARM = {"os_id": "ubuntu", "os_family": "debian", "os_version": "22.04", "arch": "aarch64"}
ROCKY = {"os_id": "rocky", "os_family": "redhat", "os_version": "9.4", "arch": "x86_64"}
H100 = {"gpu_model": "H100", "gpu_count": 8, "nvswitch": True}
V100 = {"gpu_model": "V100", "gpu_count": 8, "nvswitch": False}


class FakeInventory:
    def __init__(self, host: str, variables: dict[str, Any]) -> None:
        self.variables = variables
        self.hosts = {host: None}
        self.groups = {"all": None, "gpu": None}

    def group_hosts(self, group: str) -> list[str]:
        return list(self.hosts)

    def resolve_vars(self, host: str, defaults: dict[str, Any]) -> dict[str, Any]:
        return {**defaults, **self.variables}


def gpu_plays():
    return [p for p in load_site(ROOT / "site.yml") if set(p.roles) & set(GPU_ROLES)]


def planned(variables: dict[str, Any], facts: dict[str, str] = DEBIAN) -> dict[str, Any]:
    """{task name: task} of every GPU play planned for one host, handlers included."""
    plays = gpu_plays()
    planner = Planner(FakeInventory("g1", variables), [ROOT / "roles"], ROOT / "templates")
    planner.load_roles(tuple(plays))
    defaults: dict[str, Any] = {}
    for play in plays:
        defaults.update(planner.play_defaults(play))
    host_facts = HostFacts(host="g1", **facts)
    context = {
        "facts": host_facts.to_json(),
        "gpu_plan": gpu_plan.template_plan("g1", {**defaults, **variables}, host_facts),
    }
    plan = planner.plan_host("g1", plays, context)
    out: dict[str, Any] = {}
    for hp in plan.plays:
        for t in [*hp.tasks, *hp.handlers.values()]:
            out[t.name] = t
    return out


def task(tasks: dict[str, Any], pattern: str) -> Any:
    found = [t for name, t in tasks.items() if re.search(pattern, name)]
    assert len(found) == 1, (pattern, list(tasks))
    return found[0]


def absent(tasks: dict[str, Any], pattern: str) -> bool:
    return not any(re.search(pattern, name) for name in tasks)


# ---- the site ---------------------------------------------------------------------------------


def test_the_site_runs_driver_dcgm_exporter_then_node_exporter_on_gpu_hosts():
    order = [r for p in load_site(ROOT / "site.yml") if p.hosts == "gpu" for r in p.roles]
    assert order == ["nvidia_driver", "dcgm", "dcgm_exporter", "node_exporter"]


# ---- repository ---------------------------------------------------------------------------------


def test_debian_gets_nvidias_repository_with_a_signed_by_key_by_default():
    repo = task(planned(H100), "CUDA repository \\(apt").args
    url = "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"
    assert repo["uris"] == [url]
    assert repo["suites"] == ["/"]
    assert repo["key_url"] == url + "3bf863cc.pub"


def test_ubuntu_on_arm_uses_the_ubuntu2204_sbsa_repository():
    repo = task(planned(H100, UBUNTU_ARM), "CUDA repository \\(apt").args
    assert repo["uris"] == [
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/sbsa/"
    ]


def test_a_mirror_replaces_the_repository_and_key_urls():
    mirror = {
        "nvidia_repo_url": "http://mirror.example/cuda/",
        "nvidia_repo_key_url": "http://mirror.example/k.asc",
    }
    repo = task(planned({**H100, **mirror}), "CUDA repository \\(apt").args
    assert repo["uris"] == ["http://mirror.example/cuda/"]
    assert repo["key_url"] == "http://mirror.example/k.asc"


def test_rhel_family_gets_a_dnf_repository_with_gpgcheck_and_no_apt_tasks():
    tasks = planned(H100, ROCKY)
    repo = task(tasks, "CUDA repository \\(dnf")
    content = repo.module.content(repo.args)
    url = "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64/"
    assert f"baseurl={url}\n" in content
    assert "gpgcheck=1\n" in content
    assert f"gpgkey={url}D42D0685.pub\n" in content
    assert absent(tasks, "\\(apt") and absent(tasks, "apt keeps")
    stream = task(tasks, "dnf module stream").args
    assert "nvidia-driver:595-open" in stream["cmd"]


def test_rhel_installs_the_driver_by_upstream_version_with_a_versionlock():
    driver = task(planned(V100, ROCKY), "^driver ").args
    assert driver["name"] == ["cuda-drivers"]
    assert driver["version"] == "580.126.20-*"
    assert driver["hold"] is True


# ---- driver: pin, packages, flavour, Fabric Manager --------------------------------------------


def test_the_driver_version_is_pinned_and_the_packages_held():
    tasks = planned(H100)
    pin = task(tasks, "apt keeps the NVIDIA packages")
    assert pin.module.content(pin.args) == (
        "Package: nvidia-* libnvidia-* libcuda1 cuda-drivers cuda-drivers-*\n"
        "Pin: version 595.45.04-*\nPin-Priority: 1001\n"
    )
    assert task(tasks, "pinning package").args["name"] == ["nvidia-driver-pinning-595"]


NO_HEADERS = {**DEBIAN, "kernel": "6.1.0-28-amd64", "kernel_headers": False}


def test_a_host_without_its_kernels_headers_gets_them_before_the_driver():
    # NVIDIA's packages build the module with DKMS against the running kernel's headers
    tasks = planned(H100, NO_HEADERS)
    names = list(tasks)
    headers = task(tasks, "kernel headers linux-headers-6.1.0-28-amd64,")
    assert headers.args["name"] == ["linux-headers-6.1.0-28-amd64"]
    assert headers.args["update_cache"] is True and headers.args.get("version") is None
    assert names.index(headers.name) < names.index(task(tasks, "^driver ").name)


# A kernel update installed and not booted yet: Debian's dkms builds the module for it too, and
# skips it without its headers (the host would boot it with no NVIDIA module)
NEWER = {"newest_kernel": "6.1.0-31-amd64", "newest_kernel_headers": False}


@pytest.mark.parametrize(
    ("facts", "wanted"),
    [
        ({**NO_HEADERS, **NEWER}, ["linux-headers-6.1.0-28-amd64", "linux-headers-6.1.0-31-amd64"]),
        ({**NO_HEADERS, **NEWER, "kernel_headers": True}, ["linux-headers-6.1.0-31-amd64"]),
        ({**NO_HEADERS, **NEWER, "newest_kernel_headers": True}, ["linux-headers-6.1.0-28-amd64"]),
    ],
)  # fmt: skip
def test_the_newer_installed_kernel_dkms_also_builds_for_gets_its_headers_too(facts, wanted):
    tasks = planned(H100, facts)
    headers = task(tasks, "^kernel headers ")
    assert headers.args["name"] == wanted
    assert headers.name.startswith(f"kernel headers {', '.join(wanted)}, which DKMS builds")


@pytest.mark.parametrize(
    ("facts", "variables"),
    [
        ({**NO_HEADERS, "kernel_headers": True}, {}),  # /lib/modules/<kernel>/build/include
        ({**NO_HEADERS, "kernel_headers": None}, {}),  # not read: nothing is guessed
        (NO_HEADERS, {"nvidia_driver_kernel_headers": False}),  # the site provides them
        ({**NO_HEADERS, **NEWER}, {"nvidia_driver_kernel_headers": False}),
        ({**ROCKY, "kernel": "5.14.0-427.el9.x86_64", "kernel_headers": False}, {}),  # Debian only
        ({**NO_HEADERS, "kernel": "6.1.0_custom"}, {}),  # no Debian package can carry that name
        ({**NO_HEADERS, "kernel_headers": True, **NEWER, "newest_kernel_headers": None}, {}),
    ],
)
def test_no_headers_are_installed_where_they_are_present_unknown_or_not_ours(facts, variables):
    tasks = planned({**H100, **variables}, facts)
    assert gpu_plan.kernel_headers_packages(facts, variables) == ()
    assert absent(tasks, "^kernel headers ")
    assert task(tasks, "^driver ")
    view = gpu_plan.template_plan("g1", {**H100, **variables}, HostFacts(host="g1", **facts))
    assert view["kernel_headers"] is None


# Room for the install, asked before anything of the role where something is to be installed:
# an install that runs out of space stops half-way (deployer/modules/disk_space.py)
ROOM = "^room for driver 595.45.04's install"
AT_PLAN = {"nvidia-open": "595.45.04-1", "nvidia-fabricmanager": "595.45.04-1",
           "libnvidia-nscq": "595.45.04-1"}  # fmt: skip


def test_a_host_with_a_driver_to_install_is_asked_for_room_before_anything_else():
    tasks = planned(H100)
    room = task(tasks, ROOM)
    assert room.name == "room for driver 595.45.04's install (/var, /usr, /boot)"
    assert room.args["needs"] == {"/var": 2048, "/usr": 2048, "/boot": 128}
    assert "nvidia_driver_min_free_mib" in room.args["hint"]
    assert next(iter(tasks)) == room.name  # before the repository, the pin, every package


@pytest.mark.parametrize(
    ("facts", "asked"),
    [
        ({**DEBIAN, "packages": AT_PLAN}, False),  # the planned driver is there: nothing asked
        ({**DEBIAN, "packages": {**AT_PLAN, "nvidia-open": "580.126.20-1"}}, True),  # upgrade
        ({**DEBIAN, "packages": {**AT_PLAN, "libnvidia-nscq": "580.126.20-1"}}, True),
        ({**NO_HEADERS, "packages": AT_PLAN}, True),  # headers to install
        ({**DEBIAN, "packages": {**AT_PLAN, "cuda-drivers-580": "580.126.20-1"}}, True),  # switch
        (ROCKY, False),  # an RPM host's versions are not compared here
    ],
)
def test_room_is_asked_only_where_something_of_the_driver_is_to_be_installed(facts, asked):
    tasks = planned(H100, facts)
    assert (not absent(tasks, ROOM)) is asked
    assert task(tasks, r"^driver 595\.45\.04 ")


def test_no_room_is_asked_when_nvidia_driver_min_free_mib_asks_none():
    assert absent(planned({**H100, "nvidia_driver_min_free_mib": False}), ROOM)
    room = task(planned({**H100, "nvidia_driver_min_free_mib": {"/var": 0, "/opt": 512}}), ROOM)
    assert room.args["needs"] == {"/opt": 512}


# The kernel the next boot starts, asked after the room: the new packages take the old module
# from every kernel and Debian's dkms builds the new one for the running and the newest installed
# kernel only (deployer/modules/boot_loader.py)
BOOT = r"^the reboot after driver 595\.45\.04's install starts a kernel its module is built for$"
RUNNING = {**DEBIAN, "kernel": "6.1.0-28-amd64", "kernel_headers": True}


def test_a_host_whose_driver_changes_is_asked_which_kernel_its_reboot_starts_before_any_package():
    tasks = planned(H100, {**RUNNING, **NEWER, "newest_kernel_headers": True})
    boot = task(tasks, BOOT)
    assert boot.module.name == "boot_loader"
    assert boot.args["running"] == "6.1.0-28-amd64" and boot.args["newest"] == "6.1.0-31-amd64"
    assert boot.args["purpose"] == "driver 595.45.04's install"
    names = list(tasks)
    assert names.index(boot.name) == 1  # after the room, before the repository and every package


@pytest.mark.parametrize(
    ("facts", "asked"),
    [
        ({**RUNNING, "packages": {**AT_PLAN, "nvidia-open": "580.126.20-1"}}, True),  # upgrade
        ({**RUNNING, "packages": {**AT_PLAN, "cuda-drivers-580": "580.126.20-1"}}, True),  # switch
        ({**RUNNING, "packages": AT_PLAN}, False),  # the planned driver is there: no module moves
        ({**RUNNING, "kernel_headers": False, "packages": AT_PLAN}, False),  # headers only
        ({**DEBIAN, "packages": {}}, False),  # the running kernel unknown: nothing to judge by
        ({**ROCKY, "kernel": "5.14.0-427.el9.x86_64"}, False),  # Debian's dkms only
    ],
)
def test_the_boot_loader_is_asked_only_where_the_drivers_packages_change(facts, asked):
    tasks = planned(H100, facts)
    assert (not absent(tasks, BOOT)) is asked
    assert task(tasks, r"^driver 595\.45\.04 ")


SIGNING = (
    r"^under Secure Boot, the module of driver 595\.45\.04 is signed by a key the kernel trusts$"
)


@pytest.mark.parametrize(
    ("facts", "asked"),
    [
        ({**RUNNING, "packages": {**AT_PLAN, "nvidia-open": "580.126.20-1"}}, True),  # upgrade
        ({**DEBIAN, "packages": {}}, True),  # a first install
        ({**RUNNING, "packages": AT_PLAN}, False),  # the planned driver is there
        ({**RUNNING, "kernel_headers": False, "packages": AT_PLAN}, False),  # headers only
        ({**ROCKY, "kernel": "5.14.0-427.el9.x86_64"}, False),  # Debian's dkms only
    ],
)
def test_module_signing_is_asked_after_the_boot_loader_where_the_drivers_packages_change(
    facts, asked
):
    tasks = planned(H100, facts)
    assert (not absent(tasks, SIGNING)) is asked
    if asked:
        names = list(tasks)
        signing = task(tasks, SIGNING)
        assert signing.module.name == "module_signing"
        assert signing.args["purpose"] == "driver 595.45.04's install"
        assert names.index(signing.name) < names.index(
            task(tasks, "NVIDIA CUDA repository .apt").name
        )


# After the driver's packages and before the reboot task: DKMS built the new module for the
# kernel the next boot starts (deployer/modules/driver_module.py)
BUILT = r"^the module of driver 595\.45\.04 is built for the kernel the next boot starts$"


@pytest.mark.parametrize(
    ("facts", "asked"),
    [
        ({**RUNNING, "packages": {**AT_PLAN, "nvidia-open": "580.126.20-1"}}, True),  # upgrade
        ({**RUNNING, "packages": {}}, True),  # a first install
        (
            {**RUNNING, "newest_kernel": "", "packages": AT_PLAN, "driver_loaded": "595.45.04"},
            False,
        ),  # all at plan, and no kernel newer than the running one
        (
            {**RUNNING, "packages": AT_PLAN, "driver_loaded": "595.45.04"},
            True,
        ),  # a newer kernel with its headers: whether its DKMS build failed is read every run
        ({**RUNNING, "packages": AT_PLAN, "driver_loaded": "580.126.20"}, True),  # reboot owed
        ({**RUNNING, "packages": AT_PLAN}, True),  # nothing loaded: the next boot loads it
        (
            {**RUNNING, "kernel_headers": False, "packages": AT_PLAN, "driver_loaded": "595.45.04"},
            True,
        ),  # the running kernel's headers installed: their hook builds its module
        (
            {
                **RUNNING,
                "newest_kernel_headers": False,
                "packages": AT_PLAN,
                "driver_loaded": "595.45.04",
            },
            True,
        ),  # a kernel put in later without headers: the same
        ({**DEBIAN, "packages": {}}, False),  # the running kernel unknown: nothing to judge by
        ({**ROCKY, "kernel": "5.14.0-427.el9.x86_64"}, False),  # Debian's dkms only
    ],
)
def test_the_built_module_is_asked_between_the_packages_and_the_reboot(facts, asked):
    facts = {**NEWER, "newest_kernel_headers": True, **facts}
    tasks = planned(H100, facts)
    assert (not absent(tasks, BUILT)) is asked
    if asked:
        names = list(tasks)
        built = task(tasks, BUILT)
        assert built.module.name == "driver_module"
        assert built.args == {
            "version": "595.45.04",
            "running": "6.1.0-28-amd64",
            "newest": "6.1.0-31-amd64",
        }
        assert names.index(task(tasks, r"^driver 595\.45\.04 ").name) < names.index(built.name)
        loaded = task(tasks, "^the loaded kernel module is driver")
        assert names.index(built.name) < names.index(loaded.name)
        rebooting = list(planned({**H100, "nvidia_driver_reboot": "if_required"}, facts))
        assert rebooting.index(built.name) < rebooting.index(
            next(n for n in rebooting if n.startswith("reboot into driver"))
        )


def test_a_site_that_installs_headers_itself_is_still_asked_about_a_newer_kernel():
    """nvidia_driver_kernel_headers false: no headers task, but a kernel newer than the running
    one needs the driver's module all the same before a reboot starts it."""
    site = {**H100, "nvidia_driver_kernel_headers": False}
    facts = {**RUNNING, **NEWER, "packages": AT_PLAN, "driver_loaded": "595.45.04"}
    assert not absent(planned(site, facts), BUILT)
    assert absent(planned(site, {**facts, "newest_kernel": ""}), BUILT)


def test_nvidia_driver_kernel_headers_must_be_a_boolean():
    with pytest.raises(InputError) as exc:
        planned({**H100, "nvidia_driver_kernel_headers": "sometimes"}, NO_HEADERS)
    assert exc.value.key == "nvidia_driver_kernel_headers"


def test_an_nvswitch_h100_installs_open_modules_and_fabric_manager_at_the_driver_version():
    tasks = planned(H100)
    driver = task(tasks, "^driver ").args
    assert driver["name"] == ["nvidia-open", "nvidia-fabricmanager", "libnvidia-nscq"]
    assert driver["version"] == "595.45.04-1"
    assert driver["hold"] is True
    assert task(tasks, "Fabric Manager .* running").args["state"] == "started"


def test_a_v100_gets_the_proprietary_r580_driver_and_no_fabric_manager():
    tasks = planned(V100)
    driver = task(tasks, "^driver ").args
    assert driver["name"] == ["cuda-drivers"]
    assert driver["version"] == "580.126.20-1"
    assert absent(tasks, "Fabric Manager")


def test_an_explicit_driver_version_is_what_gets_installed():
    driver = task(planned({**H100, "nvidia_driver_version": "580.65.06"}), "^driver ").args
    assert driver["version"] == "580.65.06-1"


def test_nouveau_is_blacklisted_and_the_initramfs_regenerated_only_where_a_tool_exists():
    tasks = planned(H100)
    blacklist = task(tasks, "nouveau blacklisted").args
    assert "blacklist nouveau\noptions nouveau modeset=0\n" in blacklist["content"]
    initramfs = task(tasks, "initramfs").args
    assert "else exit 0" in initramfs["unless"]  # no update-initramfs nor dracut: nothing to do
    assert "update-initramfs -u" in initramfs["cmd"] and "dracut --force" in initramfs["cmd"]


def test_persistenced_runs_with_persistence_mode():
    unit = task(planned(H100), "nvidia-persistenced enabled").args
    assert unit["enabled"] is True and unit["state"] == "started"
    assert "--persistence-mode" in unit["dropins"]["gpumon.conf"]


# ---- reboot -----------------------------------------------------------------------------------


def test_by_default_the_role_never_reboots_but_says_when_a_reboot_is_required():
    tasks = planned(H100)
    assert absent(tasks, "^reboot ")
    say = task(tasks, "else a reboot is required").args
    assert say["explain"].endswith("explain 595.45.04 never false")


def test_if_required_reboots_only_when_no_gpu_compute_process_runs():
    reboot = task(planned({**H100, "nvidia_driver_reboot": "if_required"}), "^reboot ").args
    assert reboot["test_command"] == (
        "/usr/local/libexec/gpumon/nvidia-driver-check reboot-needed 595.45.04"
        " && ! /usr/local/libexec/gpumon/nvidia-driver-check busy"
    )


def test_forcing_the_reboot_drops_the_compute_process_guard():
    variables = {
        **H100,
        "nvidia_driver_reboot": "if_required",
        "nvidia_driver_reboot_force": "true",
    }
    reboot = task(planned(variables), "^reboot ").args
    assert "busy" not in reboot["test_command"]


@pytest.mark.parametrize(
    ("key", "value"), [("nvidia_driver_reboot", "always"), ("nvidia_driver_reboot_force", "maybe")]
)
def test_reboot_settings_out_of_range_are_refused_naming_the_key(key, value):
    with pytest.raises(InputError) as err:
        planned({**H100, key: value})
    assert err.value.key == key


def test_the_driver_verification_checks_version_and_gpu_count():
    verify = task(planned(H100), "^verified -- loaded").args
    assert verify["that"].endswith("verify 595.45.04 8 nvidia-open")


# ---- dcgm -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variables", "variant"),
    [(H100, "datacenter-gpu-manager-4-cuda13"), (V100, "datacenter-gpu-manager-4-cuda12")],
)
def test_dcgm_takes_the_variant_of_the_drivers_cuda_major_pinned_and_held(variables, variant):
    tasks = planned({**variables, "dcgm_exporter_version": "4.5.3-4.8.2"})
    dcgm = task(tasks, "^DCGM 4.5.3").args
    assert dcgm["name"] == ["datacenter-gpu-manager-4-core", variant]
    assert dcgm["version"] == "1:4.5.3-1" and dcgm["hold"] is True
    pin = task(tasks, "apt keeps DCGM")
    assert "Pin: version 1:4.5.3-1\n" in pin.module.content(pin.args)
    conflicts = task(tasks, "DCGM 3 packages absent").args
    assert conflicts["name"] == ["datacenter-gpu-manager", "datacenter-gpu-manager-config"]
    assert conflicts["state"] == "absent"


def test_nv_hostengine_is_bound_to_loopback_5555_by_a_dropin():
    unit = task(planned(H100), "nv-hostengine bound").args
    assert unit["name"] == "nvidia-dcgm.service"
    dropin = unit["dropins"]["gpumon.conf"]
    assert "ExecStart=\n" in dropin
    assert "/usr/bin/nv-hostengine -n --service-account nvidia-dcgm -b 127.0.0.1 -p 5555" in dropin
    assert unit["enabled"] is True and unit["state"] == "started"


def test_dcgm_verification_names_every_gpu_uuid_from_facts():
    plays = planned(H100)  # no GPUs in these facts: the count alone is checked
    assert task(plays, "^verified -- dcgmi").args["that"].endswith("verify 127.0.0.1 5555 8 ")


# ---- dcgm-exporter ------------------------------------------------------------------------------


def exporter_unit(variables: dict[str, Any]) -> str:
    return task(planned(variables), "^dcgm-exporter hardened unit").args["content"]


def test_the_exporter_unit_runs_as_its_own_user_against_the_host_engine():
    unit = exporter_unit({**H100, "dcgm_exporter_version": "4.5.3-4.8.2"})
    assert "User=dcgm-exporter\n" in unit
    assert "-r localhost:5555" in unit
    assert "-f /etc/dcgm-exporter/gpumon-counters.csv" in unit
    assert "-a :9400" in unit and "-c 30000" in unit
    assert "--web-config-file" not in unit
    for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "CapabilityBoundingSet=\n"):
        assert line in unit
    filters = [x for x in unit.splitlines() if x.startswith("SystemCallFilter=")]
    assert filters == ["SystemCallFilter=@system-service"]  # ~@resources kills Go (setrlimit)


def test_listen_address_and_interval_come_from_variables():
    unit = exporter_unit(
        {
            **H100,
            "dcgm_exporter_listen_address": "127.0.0.1:9500",
            "dcgm_exporter_collect_interval_ms": 10000,
        }
    )
    assert "-a 127.0.0.1:9500" in unit and "-c 10000" in unit


def test_a_csv_change_restarts_the_exporter_then_verifies_it():
    tasks = planned(H100)
    csv = task(tasks, "metrics CSV")
    assert csv.notify == (
        "restart dcgm-exporter",
        "dcgm-exporter serves every GPU after its restart",
    )
    assert csv.args["content"] == dcgm_fields.render_csv(dcgm_fields.DEFAULT_GROUPS)


def test_the_package_install_is_pinned_held_and_the_vendor_unit_stopped():
    tasks = planned({**H100, "dcgm_exporter_version": "4.5.3-4.8.2"})
    pkg = task(tasks, "package, held").args
    assert pkg["name"] == ["datacenter-gpu-manager-exporter"]
    assert pkg["version"] == "4.8.2-1" and pkg["hold"] is True
    vendor = task(tasks, "packaged nvidia-dcgm-exporter").args
    assert vendor["enabled"] is False and vendor["state"] == "stopped"


def test_the_archive_install_is_sha256_pinned_and_skips_the_package():
    tasks = planned(
        {
            **H100,
            "dcgm_exporter_version": "4.5.3-4.8.2",
            "dcgm_exporter_install": "archive",
            "dcgm_exporter_archive_url": "http://mirror.example/dcgm-exporter-4.5.3-4.8.2.tar.gz",
            "dcgm_exporter_archive_sha256": "a" * 64,
        }
    )
    archive = task(tasks, "archive \\(pinned sha256\\)").args
    assert archive["sha256"] == "a" * 64
    assert archive["dest"] == "/opt/dcgm-exporter/4.5.3-4.8.2"
    assert absent(tasks, "package, held")
    assert (
        "ExecStart=/opt/dcgm-exporter/4.5.3-4.8.2/dcgm-exporter"
        in task(tasks, "^dcgm-exporter hardened unit").args["content"]
    )


def test_tls_and_basic_auth_write_a_0600_web_config_and_a_secret_key():
    variables = {
        **H100,
        "dcgm_exporter_tls_cert": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        "dcgm_exporter_tls_private_key": "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n",
        "dcgm_exporter_basic_auth_users": {"prometheus": "$2y$10$abcdefghijklmnopqrstuv"},
        "dcgm_exporter_scrape_user": "prometheus",
        "dcgm_exporter_scrape_password": "hunter22",
    }
    tasks = planned(variables)
    key = task(tasks, "TLS private key")
    assert key.args["mode"] == "600" and key.args["secret"] is True
    assert "content" in key.secret_args
    web = task(tasks, "web configuration \\(TLS")
    assert web.args["mode"] == "600" and web.args["secret"] is True
    config = yaml.safe_load(web.args["content"])
    assert config == {
        "tls_server_config": {
            "cert_file": "/etc/dcgm-exporter/tls/cert.pem",
            "key_file": "/etc/dcgm-exporter/tls/key.pem",
        },
        "basic_auth_users": {"prometheus": "$2y$10$abcdefghijklmnopqrstuv"},
    }
    assert (
        "--web-config-file /etc/dcgm-exporter/web-config.yml"
        in task(tasks, "^dcgm-exporter hardened unit").args["content"]
    )
    verify = task(tasks, "^verified -- a scrape").args
    assert verify["that"].split()[2].startswith("https://127.0.0.1:9400/")
    assert " basic " in verify["that"]
    assert absent(tasks, "web configuration absent")


def test_without_tls_or_auth_the_web_config_is_removed():
    tasks = planned(H100)
    assert task(tasks, "web configuration absent").args["state"] == "absent"
    assert absent(tasks, "TLS private key")


def test_the_roles_field_group_default_is_the_modules_default():
    defaults = yaml.safe_load((ROOT / "roles/dcgm_exporter/defaults/main.yml").read_text())
    assert tuple(defaults["dcgm_exporter_field_groups"]) == dcgm_fields.DEFAULT_GROUPS


# ---- gpu_plan --------------------------------------------------------------------------------


def test_a_refused_plan_validates_with_a_stand_in_and_is_refused_by_the_preflight_later():
    view = gpu_plan.template_plan("g1", {**V100, "nvidia_driver_branch": "595"})
    assert view["stand_in"] is True
    assert view["driver_branch"] == "580"  # the model's default, only to check templates


def test_a_malformed_version_is_refused_even_while_validating():
    with pytest.raises(InputError) as err:
        gpu_plan.template_plan("g1", {**H100, "nvidia_driver_version": "595.45"[:3] + "x"})
    assert err.value.key == "nvidia_driver_version"


def test_with_facts_a_refused_plan_raises():
    from deployer.errors import PlanRefused

    with pytest.raises(PlanRefused):
        gpu_plan.template_plan(
            "g1", {**V100, "nvidia_driver_branch": "595"}, HostFacts(host="g1", **DEBIAN)
        )


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        (DEBIAN, ("debian12", "x86_64")),
        (UBUNTU_ARM, ("ubuntu2204", "sbsa")),
        (ROCKY, ("rhel9", "x86_64")),
        (
            {"os_id": "almalinux", "os_family": "redhat", "os_version": "8.10", "arch": "aarch64"},
            ("rhel8", "sbsa"),
        ),
    ],
)
def test_repository_names_follow_nvidias_distro_and_arch_pattern(facts, expected):
    assert gpu_plan.repo_names(facts) == expected


# ---- the metrics CSV -------------------------------------------------------------------------------


def test_the_default_csv_has_memory_temperature_xid_count_and_row_remapping_but_no_profiling():
    names = [n for n, _t, _h in parse_csv(dcgm_fields.render_csv(dcgm_fields.DEFAULT_GROUPS))]
    for wanted in (
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_EXP_XID_ERRORS_COUNT",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DRIVER_VERSION",
    ):
        assert wanted in names
    assert not [n for n in names if n.startswith("DCGM_FI_PROF_")]
    assert len(names) == len(set(names))


def test_profiling_is_opt_in():
    csv = dcgm_fields.csv_from_vars({"dcgm_exporter_field_groups": ["upstream", "profiling"]})
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge," in csv


def test_every_csv_line_has_exactly_two_commas_and_a_known_type():
    csv = dcgm_fields.render_csv(tuple(dcgm_fields.GROUPS))
    for line in csv.splitlines():
        if line and not line.startswith("#"):
            assert line.count(",") == 2, line
            assert line.split(",")[1].strip() in dcgm_fields.TYPES, line


def test_every_field_of_every_group_is_one_the_exporter_knows():
    # the simulated exporter refuses unknown fields as the real one does ("could not find")
    assert parse_csv(dcgm_fields.render_csv(tuple(dcgm_fields.GROUPS)))


def test_extra_fields_are_appended():
    csv = dcgm_fields.csv_from_vars(
        {
            "dcgm_exporter_field_groups": ["xid"],
            "dcgm_exporter_extra_fields": [
                {
                    "field": "DCGM_FI_DEV_PCIE_LINK_GEN",
                    "type": "gauge",
                    "help": "PCIe link generation",
                }
            ],
        }
    )
    assert csv.rstrip().endswith("DCGM_FI_DEV_PCIE_LINK_GEN, gauge, PCIe link generation")


@pytest.mark.parametrize(
    ("variables", "key"),
    [
        ({"dcgm_exporter_field_groups": ["upstream", "everything"]}, "dcgm_exporter_field_groups"),
        ({"dcgm_exporter_field_groups": "upstream"}, "dcgm_exporter_field_groups"),
        ({"dcgm_exporter_field_groups": []}, "dcgm_exporter_field_groups"),
        (
            {"dcgm_exporter_extra_fields": [{"field": "gpu_temp", "type": "gauge"}]},
            "dcgm_exporter_extra_fields[0]",
        ),
        (
            {"dcgm_exporter_extra_fields": [{"field": "DCGM_FI_X", "type": "histogram"}]},
            "dcgm_exporter_extra_fields[0]",
        ),
        (
            {
                "dcgm_exporter_extra_fields": [
                    {"field": "DCGM_FI_X", "type": "gauge", "help": "a, b"}
                ]
            },
            "dcgm_exporter_extra_fields[0]",
        ),
    ],
)
def test_bad_field_settings_are_refused_naming_the_key(variables, key):
    with pytest.raises(InputError) as err:
        dcgm_fields.csv_from_vars(variables)
    assert err.value.key == key


def test_every_catalogue_entry_cites_the_reference():
    for f in dcgm_fields.FIELDS.values():
        assert f.source.startswith("dcgm-exporter.md §4"), f.name


def test_pinning_packages_of_another_branch_are_removed():
    facts = {
        **DEBIAN,
        "packages": {"nvidia-driver-pinning-580": "580.126.20-1", "nvidia-open": "x"},
    }
    tasks = planned(H100, facts)
    stale = task(tasks, "pinning packages of other branches purged").args
    assert stale["purge"] == ["nvidia-driver-pinning-580"]
    assert absent(planned(H100), "pinning packages of other branches")


# ---- moving between branches: the other branch's packages go in the install transaction --------

A100 = {"gpu_model": "A100", "gpu_count": 4, "nvswitch": False}
R535_PROPRIETARY = {
    "packages": {"cuda-drivers-535": "535.54.03-1", "cuda-drivers": "535.54.03-1",
                 "nvidia-driver": "535.54.03-1", "nvidia-smi": "535.54.03-1",
                 "datacenter-gpu-manager-4-core": "1:4.6.0-1",
                 "datacenter-gpu-manager-4-cuda12": "1:4.6.0-1"},
    "held": ["cuda-drivers-535", "datacenter-gpu-manager-4-core",
             "datacenter-gpu-manager-4-cuda12"],
}  # fmt: skip
R580_OPEN = {
    "packages": {"nvidia-open": "580.126.20-1", "nvidia-driver-pinning-580": "580.126.20-1",
                 "nvidia-driver": "580.126.20-1"},
    "held": ["nvidia-open"],
}  # fmt: skip


def switch(variables: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    host_facts = HostFacts(host="g1", **DEBIAN, **facts)
    return gpu_plan.template_plan("g1", variables, host_facts)["driver_switch"]


def test_r535_to_r580_purges_the_held_branch_suffixed_metapackage_and_the_other_flavour():
    moved = switch({**A100, "nvidia_driver_version": "580.126.20"}, R535_PROPRIETARY)
    # A100 on R580 takes open modules: the proprietary cuda-drivers goes as well
    assert moved["purge"] == ["cuda-drivers", "cuda-drivers-535"]
    assert moved["unhold"] == ["cuda-drivers", "cuda-drivers-535"]
    assert moved["install"] == ["nvidia-open=580.126.20-1"] and moved["needed"] is True


def test_r580_to_r570_open_unholds_the_unversioned_metapackage_it_depends_on():
    moved = switch(
        {**A100, "nvidia_driver_version": "570.133.20", "nvidia_module_flavour": "open"}, R580_OPEN
    )
    assert moved["purge"] == []  # nvidia-driver-570-open depends on nvidia-open: it stays
    assert moved["unhold"] == ["nvidia-open"]
    assert moved["install"] == ["nvidia-driver-570-open=570.133.20-1"]


def test_a_fabric_manager_of_another_branch_goes_with_its_nscq_library():
    facts = {
        "packages": {"cuda-drivers-535": "535.54.03-1", "nvidia-fabricmanager-535": "535.54.03-1",
                     "cuda-drivers-fabricmanager-535": "535.54.03-1"},
        "held": ["cuda-drivers-535", "nvidia-fabricmanager-535"],
    }  # fmt: skip
    moved = switch({**H100, "nvidia_driver_version": "580.126.20"}, facts)
    assert moved["purge"] == [
        "cuda-drivers-535", "cuda-drivers-fabricmanager-535", "libnvidia-nscq-535",
        "nvidia-fabricmanager-535",
    ]  # fmt: skip
    assert moved["install"] == [
        "nvidia-open=580.126.20-1", "nvidia-fabricmanager=580.126.20-1",
        "libnvidia-nscq=580.126.20-1",
    ]  # fmt: skip


def test_another_branchs_package_installed_only_for_a_foreign_architecture_is_purged_too():
    """dpkg --add-architecture i386: an old branch's instance alone holds that branch in place;
    the switch purges its package by name, which takes every instance (modules/driver_switch.py).
    The planned branch's own 32-bit instance stays."""
    facts = {
        "packages": {"nvidia-open": "580.126.20-1", "nvidia-driver-pinning-580": "580.126.20-1"},
        "foreign_packages": {"nvidia-driver-535-open:i386": "535.54.03-1",
                             "nvidia-open:i386": "580.126.20-1"},
        "held": ["nvidia-open"],
    }  # fmt: skip
    moved = switch({**A100, "nvidia_driver_version": "580.126.20"}, facts)
    assert (moved["purge"], moved["unhold"]) == (["nvidia-driver-535-open"],) * 2


def test_a_host_already_on_the_planned_branch_switches_nothing():
    moved = switch({**A100, "nvidia_driver_version": "580.126.20"}, R580_OPEN)
    assert (moved["needed"], moved["purge"], moved["unhold"]) == (False, [], [])
    tasks = planned({**A100, "nvidia_driver_version": "580.126.20"}, {**DEBIAN, **R580_OPEN})
    assert absent(tasks, "driver packages of other branches purged")


def test_the_switch_unholds_then_installs_and_purges_in_one_apt_transaction():
    tasks = planned({**A100, "nvidia_driver_version": "580.126.20"}, {**DEBIAN, **R535_PROPRIETARY})
    switch_task = task(tasks, "driver packages of other branches purged")
    args = switch_task.args
    assert args["unhold"] == ["cuda-drivers", "cuda-drivers-535"]
    assert args["install"] == ["nvidia-open=580.126.20-1"]
    # what the host says: both held and installed (hi), the planned driver not there yet
    read = "cuda-drivers\thi \t535.54.03-1\ncuda-drivers-535\thi \t535.54.03-1\n"
    obs = switch_task.module.observe(args, CommandResult("", 0, read, ""))
    cmd = switch_task.module.transaction(args, obs)
    assert "apt-mark unhold -- cuda-drivers cuda-drivers-535 " in cmd
    install = cmd.split(" install -- ")[1].split(" 2>&1")[0]
    assert install == "nvidia-open=580.126.20-1 cuda-drivers- cuda-drivers-535-"
    assert "--purge" in cmd and "--allow-downgrades" in cmd
    assert obs.differences["installed"] == (["cuda-drivers", "cuda-drivers-535"], [])
    names = list(tasks)
    assert names.index(switch_task.name) < names.index(
        task(tasks, r"^driver 580\.126\.20 .*held$").name
    )


def test_dcgm_drops_the_variant_of_the_previous_cuda_major():
    tasks = planned({**A100, "nvidia_driver_version": "580.126.20"}, {**DEBIAN, **R535_PROPRIETARY})
    stale = task(tasks, "DCGM variants of another CUDA major absent").args
    assert stale["name"] == ["datacenter-gpu-manager-4-cuda12"] and stale["state"] == "absent"
    assert absent(planned({**A100, "nvidia_driver_version": "535.54.03"}, {**DEBIAN,
                  **R535_PROPRIETARY}), "DCGM variants of another CUDA major")  # fmt: skip


# ---- the driver role's check script, run here with a stand-in nvidia-smi ---------------------------

CHECK = ROOT / "roles/nvidia_driver/files/nvidia-driver-check"


def run_check(tmp_path: Path, apps: str, *args: str) -> subprocess.CompletedProcess[str]:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '%s' '{apps}'\n")
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    return subprocess.run(["sh", str(CHECK), *args], capture_output=True, text=True, env=env)


def test_busy_lists_running_gpu_compute_processes(tmp_path):
    proc = run_check(tmp_path, "4242, python3, 1024 MiB\n", "busy")
    assert proc.returncode == 0 and "4242, python3" in proc.stdout


def test_an_idle_host_is_not_busy(tmp_path):
    assert run_check(tmp_path, "", "busy").returncode == 1


def test_explain_names_the_jobs_that_keep_an_allowed_reboot_from_happening(tmp_path):
    proc = run_check(
        tmp_path, "4242, python3, 1024 MiB\n", "explain", "580.126.20", "if_required", "false"
    )
    assert proc.returncode == 1
    assert "reboot required" in proc.stderr
    assert "GPU compute processes are running" in proc.stderr and "4242, python3" in proc.stderr
    assert "nvidia_driver_reboot_force" in proc.stderr


def test_explain_tells_how_to_allow_the_reboot_when_the_policy_is_never(tmp_path):
    proc = run_check(tmp_path, "", "explain", "580.126.20", "never", "false")
    assert proc.returncode == 1 and "set nvidia_driver_reboot: if_required" in proc.stderr


# ---- the switch's reading of dpkg (deployer/modules/driver_switch.py; was the check script's) ---


def dpkg_read(states: dict[str, str]) -> CommandResult:
    """dpkg-query's ``${Package}\\t${db:Status-Abbrev}\\t${Version}`` lines for ``states``."""
    return CommandResult("", 0, "".join(f"{n}\t{st} \t1.0-1\n" for n, st in states.items()), "")


def test_installed_of_prints_the_installed_or_half_removed_packages_only():
    m = DriverSwitch()
    args = m.validate({"purge": ["cuda-drivers-535", "old", "gone", "unknown"]})
    obs = m.observe(args, dpkg_read({"cuda-drivers-535": "hi", "old": "rc", "gone": "un"}))
    assert obs.actual["installed"] == ["cuda-drivers-535", "old"]


@pytest.mark.parametrize(
    ("states", "switched"),
    [
        ({"cuda-drivers-535": "un", "nvidia-open": "ii"}, True),
        ({"cuda-drivers-535": "hi", "nvidia-open": "ii"}, False),  # still installed
        ({"cuda-drivers-535": "un", "nvidia-open": "hi"}, False),  # still held
    ],
)
def test_switched_means_nothing_to_purge_is_left_and_nothing_to_unhold_is_held(states, switched):
    m = DriverSwitch()
    args = m.validate({"purge": ["cuda-drivers-535"], "unhold": ["nvidia-open"]})
    assert m.observe(args, dpkg_read(states)).in_desired_state is switched
