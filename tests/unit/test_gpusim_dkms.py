"""The lab's SIMULATED DKMS: the driver's module is on disk per kernel where Debian's dkms puts
it, read by the real ``modinfo`` and ``depmod``, and a kernel without one boots without a driver."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from deployer.lab.gpusim import build_packages, hardware_for, prepare_root
from deployer.lab.gpusim.catalog import DKMS_TOOL
from deployer.lab.gpusim.sandbox import pick, run, unpack
from deployer.lab.gpusim.standins import dkms

KERNEL = platform.release()
OPEN_580 = ("libnvidia-ml1_580.65.06", "libcuda1_580.65.06", "nvidia-smi_580.65.06",
            "nvidia-kernel-open-dkms_580.65.06")  # fmt: skip
needs_kmod = pytest.mark.skipif(
    shutil.which("modinfo", path="/usr/sbin:/sbin:/usr/bin") is None,
    reason="kmod (modinfo, depmod) is not installed: scripts/setup installs it",
)


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_packages(tmp_path_factory.mktemp("debs"))


def modinfo(root: Path, kernel: str, field: str = "version") -> subprocess.CompletedProcess:
    exe = shutil.which("modinfo", path="/usr/sbin:/sbin:/usr/bin")
    return subprocess.run([exe, "-b", str(root), "-k", kernel, "-F", field, "nvidia"],
                          capture_output=True, text=True, check=False)  # fmt: skip


def reboot(root: Path) -> subprocess.CompletedProcess:
    for p in (root / "run").rglob("*"):  # a reboot empties /run
        if p.is_file():
            p.unlink()
    return run(root, ["/usr/libexec/gpusim/nvidia-module-load"])


def installed(tmp_path: Path, debs: list[Path], packages=OPEN_580) -> Path:
    root = tmp_path / "root"
    unpack(pick(debs, *packages), root)
    prepare_root(root, hardware_for("H100", 2, "gpu01", True))
    return root


@needs_kmod
def test_the_module_is_built_for_the_running_kernel_where_modinfo_finds_it(tmp_path, debs) -> None:
    root = installed(tmp_path, debs)
    assert (root / f"lib/modules/{KERNEL}/updates/dkms/nvidia.ko").is_file()
    assert modinfo(root, KERNEL).stdout == "580.65.06\n"
    assert modinfo(root, KERNEL, "license").stdout == "Dual MIT/GPL\n"  # the open flavour
    assert modinfo(root, KERNEL, "vermagic").stdout.startswith(f"{KERNEL} SMP ")
    assert "SIMULATED" in modinfo(root, KERNEL, "description").stdout


@needs_kmod
def test_the_proprietary_flavour_says_its_license(tmp_path, debs) -> None:
    root = installed(tmp_path, debs, ("libnvidia-ml1_535.54.03", "nvidia-kernel-dkms_535.54.03"))
    assert modinfo(root, KERNEL).stdout == "535.54.03\n"
    assert modinfo(root, KERNEL, "license").stdout == "NVIDIA\n"


def test_the_module_is_read_back_as_the_stand_ins_wrote_it() -> None:
    from deployer.lab.gpusim.standins import common

    data = dkms.module_bytes([("version", "580.126.20"), ("license", "NVIDIA")])
    assert common.module_info(data) == {"version": "580.126.20", "license": "NVIDIA"}
    assert common.module_info(b"not an ELF file") == {}


def test_without_headers_nothing_is_built_and_said_as_dkms_says_it(tmp_path, debs) -> None:
    root = installed(tmp_path, debs)
    other = "99.0.0-1-amd64"  # newer than any kernel this runs on: dkms' newest
    (root / f"lib/modules/{other}").mkdir(parents=True)
    (root / f"boot/config-{other}").parent.mkdir(parents=True, exist_ok=True)
    (root / f"boot/config-{other}").write_text("")
    done = run(root, [DKMS_TOOL, "autoinstall"])
    assert done.returncode == 0
    assert f"Building for {KERNEL} and {other}" in done.stdout
    assert f"Module build for kernel {other} was skipped since the" in done.stdout
    assert not (root / f"lib/modules/{other}/updates").exists()


def test_a_newer_kernel_with_headers_gets_the_module_too(tmp_path, debs) -> None:
    root = installed(tmp_path, debs)
    newer = "99.0.0-1-amd64"  # newer than any kernel this runs on
    (root / f"lib/modules/{newer}/build/include").mkdir(parents=True)
    (root / "boot").mkdir(exist_ok=True)
    (root / f"boot/config-{newer}").write_text("")
    done = run(root, [DKMS_TOOL, "autoinstall"])
    assert f"Building for {KERNEL} and {newer}" in done.stdout
    assert (root / f"lib/modules/{newer}/updates/dkms/nvidia.ko").is_file()


def test_autoinstall_disabled_builds_nothing(tmp_path, debs) -> None:
    root = tmp_path / "root"
    (root / "etc/dkms").mkdir(parents=True)
    (root / "etc/dkms/no-autoinstall").write_text("")
    unpack(pick(debs, *OPEN_580), root)
    assert not (root / f"lib/modules/{KERNEL}/updates/dkms/nvidia.ko").exists()


def test_headers_installed_later_build_the_module_for_their_kernel(tmp_path, debs) -> None:
    root = installed(tmp_path, debs)
    later = "6.1.0-98-amd64"
    (root / f"lib/modules/{later}/build/include").mkdir(parents=True)
    hook = root / "etc/kernel/header_postinst.d/gpusim-nvidia-dkms"
    assert hook.is_file()
    done = run(root, [DKMS_TOOL, "kernel", later])
    assert done.returncode == 0
    assert (root / f"lib/modules/{later}/updates/dkms/nvidia.ko").is_file()


def test_remove_takes_this_versions_module_off_every_kernel(tmp_path, debs) -> None:
    root = installed(tmp_path, debs)
    assert run(root, [DKMS_TOOL, "remove"]).returncode == 0
    assert not (root / f"lib/modules/{KERNEL}/updates/dkms/nvidia.ko").exists()


def test_a_kernel_without_the_module_boots_without_a_driver(tmp_path, debs) -> None:
    root = installed(tmp_path, debs)
    run(root, [DKMS_TOOL, "remove"])
    booted = reboot(root)
    assert booted.returncode == 1
    assert f"Module nvidia not found in directory /lib/modules/{KERNEL}" in booted.stderr
    smi = run(root, ["/usr/bin/nvidia-smi", "-L"])
    assert "couldn't communicate with the NVIDIA driver" in smi.stdout


def test_the_kernel_loads_the_module_on_disk_not_the_package_version(tmp_path, debs) -> None:
    """An upgrade whose build was skipped (the old module left on disk by no prerm here) boots
    the old module: NVML then sees the library/driver mismatch, as a real host would."""
    root = installed(tmp_path, debs)
    (root / "etc/dkms").mkdir(parents=True, exist_ok=True)
    (root / "etc/dkms/no-autoinstall").write_text("")
    unpack(pick(debs, *(p.replace("580.65.06", "580.126.20") for p in OPEN_580)), root)
    assert reboot(root).returncode == 0
    assert "580.65.06" in (root / "run/gpusim/proc-driver/nvidia/version").read_text()
    smi = run(root, ["/usr/bin/nvidia-smi", "-L"])
    assert "Driver/library version mismatch" in smi.stdout
