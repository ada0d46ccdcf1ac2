"""Facts parsing: captured outputs of the facts script in, HostFacts out."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from deployer.connection import CommandResult, LocalConnection
from deployer.errors import FactsUnread
from deployer.facts import FACTS_SCRIPT, HOST_CA_FILE, HostFacts, gather, parse_facts, unfinished
from deployer.tls import material
from tests.dpkgdb import Instance, write_db

OS = """@@os
id=debian
version_id=12
id_like=
pretty=Debian GNU/Linux 12 (bookworm)
arch=x86_64
kernel=6.1.0-28-amd64
"""

SMI_OK = """@@smi
0, GPU-1b2c3d4e-0000-1111-2222-333344445555, NVIDIA H100 80GB HBM3, 81559, 00000000:18:00.0, Disabled, 580.65.06
1, GPU-1b2c3d4e-0000-1111-2222-333344445556, NVIDIA H100 80GB HBM3, 81559, 00000000:2A:00.0, Disabled, 580.65.06
@@smi_rc
rc=0
"""

SMI_MISMATCH = """@@smi
Failed to initialize NVML: Driver/library version mismatch
NVML library version: 595.45.04
@@smi_rc
rc=18
"""

PROC_OPEN = """@@proc
NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Jul 29 2025
GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)
"""

PROC_PROPRIETARY = """@@proc
NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20  Wed Mar  5 2025
"""

PKGS = """@@pkgs
dpkg_arch=amd64
nvidia-open\t580.65.06-1\tii \tamd64
libnvidia-compute\t580.65.06-1\tii \tamd64
datacenter-gpu-manager-4-core\t1:4.4.2-1\thi \tamd64
datacenter-gpu-manager-4-cuda13\t1:4.4.2-1\thi \tamd64
datacenter-gpu-manager-exporter\t4.7.1-1\tii \tamd64
nvidia-fabricmanager\t580.65.06-1\thi \tamd64
nvidia-old-removed\t1.0\trc \tamd64
"""


def facts_of(*sections: str, pci: str = "@@pci\n", nvswitch: str = "@@nvswitch\n0\n"):
    return parse_facts("h", CommandResult("facts", 0, "".join([OS, pci, *sections, nvswitch]), ""))


def test_os_family_version_arch_and_kernel():
    f = facts_of("@@smi\n@@smi_rc\nrc=absent\n", "@@proc\n", "@@pkgs\n")
    assert (f.os_id, f.os_family, f.os_version, f.arch, f.kernel) == (
        "debian", "debian", "12", "x86_64", "6.1.0-28-amd64",
    )  # fmt: skip
    assert f.nvidia_smi == "absent" and f.gpus == [] and not f.reboot_required


@pytest.mark.parametrize(("line", "has"), [("kernel_headers=yes\n", True),
                                           ("kernel_headers=no\n", False), ("", None)])  # fmt: skip
def test_whether_the_running_kernels_headers_are_where_dkms_builds_against(line, has):
    # None: an output without the line (an older script's) says nothing either way
    f = parse_facts("h", CommandResult("facts", 0, OS + line + "@@pci\n@@nvswitch\n0\n", ""))
    assert f.kernel_headers is has


@pytest.mark.parametrize(
    ("installed", "newest", "has"),
    [
        # a kernel update installed, not booted yet: dkms builds for it too
        ({"6.1.0-28-amd64": "yes", "6.1.0-31-amd64": "no"}, "6.1.0-31-amd64", False),
        ({"6.1.0-28-amd64": "no", "6.1.0-31-amd64": "yes"}, "6.1.0-31-amd64", True),
        # ABIs compare as numbers (the glob lists 6.1.0-9 after 6.1.0-28)
        ({"6.1.0-28-amd64": "yes", "6.1.0-9-amd64": "no"}, "", None),
        ({"6.1.0-28-amd64": "yes"}, "", None),  # the running kernel is the newest
        ({"6.1.0-21-amd64": "no"}, "", None),  # an older one: dkms builds for the running only
        ({}, "", None),  # no /boot/config-* (a container)
        # the newest config has no /lib/modules/<release>: dkms then builds for no newer one
        ({"6.1.0-31-amd64": "no", "6.1.0-33-amd64": "gone"}, "", None),
        ({"6.12.9+bpo-amd64": "no"}, "6.12.9+bpo-amd64", False),  # a backport: a newer version
    ],
)
def test_the_newer_installed_kernel_dkms_also_builds_for_is_read_as_dkms_picks_it(
    installed, newest, has
):
    # dkms 3.0.10 /usr/lib/dkms/common.postinst, get_newest_kernel: the greatest VERSION-ABI of
    # /boot/config-* at least the running kernel's, if /lib/modules/<it> exists
    lines = "".join(f"installed_kernel={k} {state}\n" for k, state in installed.items())
    f = parse_facts("h", CommandResult("facts", 0, OS + lines + "@@pci\n@@nvswitch\n0\n", ""))
    assert (f.newest_kernel, f.newest_kernel_headers) == (newest, has)


def test_the_script_reads_the_headers_where_debians_dkms_tests_for_them():
    # dkms 3.0.10 /usr/lib/dkms/common.postinst, _check_kernel_dir: test -e $DIR/include, with
    # DIR=/lib/modules/$KVER/build; this machine's own answer is the script's
    import os

    f = gather(LocalConnection("controller"))
    assert f.kernel_headers is os.path.exists(f"/lib/modules/{f.kernel}/build/include")


def test_gpus_from_nvidia_smi():
    f = facts_of(SMI_OK, PROC_OPEN, PKGS)
    assert [g.index for g in f.gpus] == [0, 1]
    assert f.gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert f.gpus[0].memory_mib == 81559
    assert f.gpus[1].pci_bus_id == "00000000:2A:00.0"
    assert f.gpus[0].mig_mode == "Disabled"


def test_versions_agree_means_no_reboot_required():
    f = facts_of(SMI_OK, PROC_OPEN, PKGS)
    assert f.driver_installed == f.driver_loaded == f.driver_smi == "580.65.06"
    assert f.kernel_module_flavour == "open"
    assert not f.reboot_required


@pytest.mark.parametrize(
    ("smi", "proc", "expect_reboot"),
    [
        (SMI_OK, PROC_OPEN, False),
        (SMI_MISMATCH, PROC_OPEN, True),  # user space upgraded, module still old
        (SMI_OK, PROC_PROPRIETARY, True),  # loaded module differs from the package
    ],
    ids=["agree", "nvml-mismatch", "loaded-differs"],
)
def test_reboot_required_when_installed_loaded_and_seen_versions_differ(smi, proc, expect_reboot):
    assert facts_of(smi, proc, PKGS).reboot_required is expect_reboot


def test_nvml_mismatch_is_an_error_with_its_message():
    f = facts_of(SMI_MISMATCH, PROC_OPEN, PKGS)
    assert f.nvidia_smi == "error"
    assert "version mismatch" in f.nvidia_smi_error


def test_proprietary_module_flavour():
    assert facts_of(SMI_OK, PROC_PROPRIETARY, PKGS).kernel_module_flavour == "proprietary"


def test_package_versions_holds_and_removed_packages():
    f = facts_of(SMI_OK, PROC_OPEN, PKGS)
    assert f.dcgm_version == "4.4.2"
    assert f.dcgm_package == "datacenter-gpu-manager-4-cuda13"
    assert f.exporter_version == "4.7.1"
    assert f.fabricmanager_version == "580.65.06"
    assert "nvidia-fabricmanager" in f.held
    assert "nvidia-old-removed" not in f.packages


def test_pci_functions_and_nvswitch():
    pci = "@@pci\n0000:18:00.0 0x0302\n0000:2a:00.0 0x0302\n0000:05:00.0 0x0680\n"
    f = facts_of(SMI_OK, PROC_OPEN, PKGS, pci=pci)
    assert f.nvidia_pci_gpus == 2 and f.nvidia_pci_switches == 1 and f.nvswitch


def test_the_script_runs_on_a_real_machine_without_nvidia():
    f = gather(LocalConnection("controller"))
    assert f.os_family and f.arch and f.kernel
    assert f.nvidia_smi in ("absent", "ok", "error")


def test_the_script_is_read_only_shell():
    for word in ("rm ", "apt-get", "modprobe", "systemctl ", "> /"):
        assert word not in FACTS_SCRIPT


def test_nvml_mismatch_names_the_user_space_library_version():
    f = facts_of(SMI_MISMATCH, PROC_OPEN, PKGS)
    assert f.nvml_mismatch and f.nvml_library_version == "595.45.04"


def test_another_nvidia_smi_failure_is_no_nvml_mismatch():
    smi = (
        "@@smi\nNVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
        "@@smi_rc\nrc=9\n"
    )
    f = facts_of(smi, PROC_OPEN, PKGS)
    assert f.nvidia_smi == "error" and not f.nvml_mismatch and f.nvml_library_version is None
    assert "couldn't communicate" in f.nvidia_smi_error


@pytest.mark.parametrize(
    ("mode", "enabled"), [("Enabled", True), ("Disabled", False), ("[N/A]", False)]
)
def test_mig_mode_is_kept_as_printed_and_read_as_enabled_or_not(mode, enabled):
    smi = SMI_OK.replace("Disabled", mode, 1)
    g = facts_of(smi, PROC_OPEN, PKGS).gpus[0]
    assert (g.mig_mode, g.mig_enabled) == (mode, enabled)


def test_memory_not_reported_is_none():
    smi = SMI_OK.replace(", 81559,", ", [N/A],", 1)
    assert facts_of(smi, PROC_OPEN, PKGS).gpus[0].memory_mib is None


def test_gpumon_procfs_points_the_script_at_another_proc(tmp_path, monkeypatch):
    (tmp_path / "driver/nvidia").mkdir(parents=True)
    (tmp_path / "driver/nvidia/version").write_text(PROC_OPEN.split("\n", 1)[1])
    monkeypatch.setenv("GPUMON_PROCFS", str(tmp_path))
    f = gather(LocalConnection("controller"))
    assert f.driver_loaded == "580.65.06" and f.kernel_module_flavour == "open"


def _facts_script_on_dpkg(
    tmp_path: Path, *instances: Instance, status: str | None = None, native: str = "amd64"
) -> tuple[HostFacts, bool]:
    """The facts script run here on a dpkg database of the test's own (tests/dpkgdb.py: this
    machine's real dpkg-query, ``DPKG_ADMINDIR`` naming the database as dpkg reads it), its
    ``status`` file's text replaced when given (None: as written; "": no status file), dpkg-query
    leaving a mark when it runs: (the facts, whether dpkg-query ran)."""
    import os

    bindir = tmp_path / "bin"
    admin = write_db(tmp_path, bindir, native, *instances)
    if status == "":
        (admin / "status").unlink()
    elif status is not None:
        (admin / "status").write_text(status)
    mark = tmp_path / "dpkg-query-ran"
    real = bindir / "dpkg-query"
    real.rename(bindir / "dpkg-query.db")
    real.write_text(f'#!/bin/sh\ntouch {mark}\nexec {bindir}/dpkg-query.db "$@"\n')
    real.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "DPKG_ADMINDIR": str(admin)}
    out = subprocess.run(["sh", "-c", FACTS_SCRIPT], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return parse_facts("g1", CommandResult("facts", 0, out.stdout, "")), mark.exists()


def test_dpkg_query_runs_only_where_dpkgs_status_names_an_nvidia_package(tmp_path):
    """dpkg-query parses dpkg's whole status file (nine tenths of the script on a host of 850
    packages): a host whose status file names no package of the script's names skips it."""
    f, ran = _facts_script_on_dpkg(tmp_path, Instance("prometheus-node-exporter", "amd64", "1.5"))
    assert (f.packages, ran) == ({}, False)


@pytest.mark.parametrize(
    "name",
    ["nvidia-driver", "nvidia-fabricmanager-580", "cuda-drivers-580", "libnvidia-compute-580",
     "libnvidia-nscq-580", "datacenter-gpu-manager-4-cuda12"],
)  # fmt: skip
def test_dpkg_query_runs_where_the_status_file_names_one(tmp_path, name):
    f, ran = _facts_script_on_dpkg(
        tmp_path,
        Instance("adduser", "all", "3.134", multi_arch=""),
        Instance(name, "amd64", "580.65.06-1"),
    )
    assert ran and f.packages == {name: "580.65.06-1"}


def test_dpkg_query_runs_when_the_status_file_cannot_be_read(tmp_path):
    """Never a fact lost to an unusual dpkg layout: without a readable status file, ask dpkg."""
    f, ran = _facts_script_on_dpkg(tmp_path, status="")
    assert ran and f.packages == {}


# A host with i386 enabled (dpkg --add-architecture i386) and Ubuntu's driver libraries: dpkg-query
# lists each package once per architecture, sorted by name, then by architecture.
NATIVE_580 = Instance("libnvidia-compute-580", "amd64", "580.95.05-0ubuntu1")


@pytest.mark.parametrize(
    ("instances", "driver", "foreign"),
    [
        # an old branch's 32-bit library, listed before the native driver by name
        ((Instance("libnvidia-compute-535", "i386", "535.274.02-0ubuntu1"), NATIVE_580),
         "580.95.05", {"libnvidia-compute-535:i386": "535.274.02-0ubuntu1"}),
        # the 32-bit instance of the same package at another version, listed after the native one
        ((NATIVE_580, Instance("libnvidia-compute-580", "i386", "580.65.06-0ubuntu1")),
         "580.95.05", {"libnvidia-compute-580:i386": "580.65.06-0ubuntu1"}),
        # the native instance removed, its configuration files left: no driver installed
        ((Instance("libnvidia-compute-580", "amd64", "580.95.05-0ubuntu1", "rc"),
          Instance("libnvidia-compute-580", "i386", "580.95.05-0ubuntu1")),
         None, {"libnvidia-compute-580:i386": "580.95.05-0ubuntu1"}),
    ],
    ids=["old-branch-i386", "same-package-i386-older", "native-removed"],
)  # fmt: skip
def test_the_hosts_driver_is_its_native_instance_never_a_32_bit_library(
    tmp_path, instances, driver, foreign
):
    """Before, the first ``libnvidia-compute-*`` by name (or dpkg's last line for a name) was the
    driver: a 32-bit library of an old branch read the host as on that branch, and as needing a
    reboot to the driver it had loaded all along."""
    f, _ = _facts_script_on_dpkg(tmp_path, *instances)
    assert (f.driver_installed, f.foreign_packages) == (driver, foreign)
    assert all(":" not in name for name in f.packages)


def test_a_held_32_bit_instance_names_its_package_held_once(tmp_path):
    f, _ = _facts_script_on_dpkg(
        tmp_path,
        Instance("libnvidia-compute-580", "amd64", "580.95.05-0ubuntu1", "hi"),
        Instance("libnvidia-compute-580", "i386", "580.95.05-0ubuntu1", "hi"),
    )
    assert f.held == ["libnvidia-compute-580"]
    assert f.packages == {"libnvidia-compute-580": "580.95.05-0ubuntu1"}


def test_rpm_lines_carry_no_architecture_and_are_the_hosts_packages():
    f = facts_of(SMI_OK, PROC_OPEN, "@@pkgs\nnvidia-open\t580.65.06-1.el9\tii \n")
    assert f.packages == {"nvidia-open": "580.65.06-1.el9"} and f.foreign_packages == {}
    assert f.driver_installed == "580.65.06"


class _Answers:
    """A connection answering the facts script with each of ``outputs`` in turn."""

    name = "gpu01"

    def __init__(self, *outputs: CommandResult) -> None:
        self.outputs = list(outputs)
        self.calls = 0

    def run(self, command: str, **_: object) -> CommandResult:
        self.calls += 1
        return self.outputs.pop(0)


def _whole() -> CommandResult:
    return LocalConnection().run(FACTS_SCRIPT)


def _cut(after: str = "@@os") -> CommandResult:
    whole = _whole().stdout
    return CommandResult(FACTS_SCRIPT, 1, whole[: whole.index("\n", whole.index(after)) + 1],
                         "bash: fork: retry: Resource temporarily unavailable\n")  # fmt: skip


SUDO_REFUSED = CommandResult(FACTS_SCRIPT, 1, "", "sudo: a password is required\n")


def test_a_whole_read_of_the_script_is_finished_and_a_cut_one_says_where_it_stopped():
    assert unfinished(_whole()) is None
    why = unfinished(_cut())
    assert why is not None and "before its 'pci' section (exit 1)" in why
    assert why.endswith("Resource temporarily unavailable")
    assert unfinished(SUDO_REFUSED) == (
        "the facts script stopped before its 'os' section (exit 1): sudo: a password is required"
    )


def test_a_cut_facts_read_is_read_once_more():
    conn = _Answers(_cut(), _whole())
    facts = gather(conn)  # type: ignore[arg-type]
    assert conn.calls == 2 and facts.arch and facts.os_id


def test_a_facts_read_cut_twice_fails_the_host_saying_why():
    # not a host with no architecture, refused later by a template far from the cause
    conn = _Answers(_cut(), _cut("@@pkgs"))
    with pytest.raises(FactsUnread, match=r"^the facts script stopped before its 'nvswitch'"):
        gather(conn)  # type: ignore[arg-type]


def test_sudo_refusing_the_facts_script_fails_the_host_naming_sudo():
    with pytest.raises(FactsUnread, match="sudo: a password is required"):
        gather(_Answers(SUDO_REFUSED, SUDO_REFUSED))  # type: ignore[arg-type]


def _script_reading_ca(tmp_path: Path, content: bytes | None) -> str:
    ca = tmp_path / "ca.pem"
    if content is not None:
        ca.write_bytes(content)
    script = FACTS_SCRIPT.replace(HOST_CA_FILE, str(ca))
    assert script != FACTS_SCRIPT
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout


@pytest.mark.parametrize("ending", [b"\n", b""])
def test_the_ca_bundle_the_host_trusts_is_read_whole_with_or_without_a_last_newline(
    tmp_path, ending
):
    bundle = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n" * 2
    out = _script_reading_ca(tmp_path, bundle.rstrip(b"\n") + ending)
    f = parse_facts("prom01", CommandResult("", 0, out, ""))
    assert f.tls_ca_pem == bundle.decode()
    assert unfinished(CommandResult("", 0, out, "")) is None


def test_a_host_without_the_tiers_ca_has_none(tmp_path):
    out = _script_reading_ca(tmp_path, None)
    assert "@@tls_ca\n@@nvswitch" in out
    assert parse_facts("prom01", CommandResult("", 0, out, "")).tls_ca_pem is None


def test_the_script_reads_the_file_the_tiers_roles_write():
    assert HOST_CA_FILE == material.HOST_CA_FILE


def test_a_read_of_a_script_without_the_ca_section_is_still_whole():
    """The section is read when printed: an older script's output (or a stand-in's) is whole."""
    whole = _whole().stdout
    start = whole.index("@@tls_ca\n")
    older = whole[:start] + whole[whole.index("@@nvswitch", start) :]
    result = CommandResult(FACTS_SCRIPT, 0, older, "")
    assert unfinished(result) is None and parse_facts("gpu01", result).tls_ca_pem is None
