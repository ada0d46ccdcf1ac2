"""``driver_module``: the driver role's check, after the packages and before any reboot, that
the planned driver's module is on disk for the kernel the next boot starts -- read by this
machine's shell and the real ``modinfo`` from modules under a temporary root (written as the
lab's simulated DKMS writes them, ``depmod`` run as dkms runs it) and through the executor;
never a change, a failure names the kernel, what is on disk and why."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from deployer.lab.gpusim.standins import dkms
from deployer.modules import boot_loader, driver_module
from deployer.modules.base import ArgError
from deployer.modules.driver_module import DriverModuleBuilt
from deployer.results import Status
from tests.unit import rooted

RUNNING, NEWEST, OLDER = "6.1.0-28-amd64", "6.1.0-31-amd64", "6.1.0-25-amd64"
WANT, OLD = "595.45.04", "580.126.20"
GRUB_CFG = Path(__file__).parents[1] / "fixtures/grub/debian12-grub.cfg"
DEPMOD = shutil.which("depmod", path="/usr/sbin:/sbin:/usr/bin")
pytestmark = pytest.mark.skipif(
    DEPMOD is None or shutil.which("modinfo", path="/usr/sbin:/sbin:/usr/bin") is None,
    reason="kmod (modinfo, depmod) is not installed: scripts/setup installs it",
)


def kernel(root: Path, release: str, headers: bool = True, module: str | None = None) -> None:
    """``/lib/modules/<release>``: its headers, and the NVIDIA module of driver ``module`` as
    DKMS installs it (``updates/dkms``, then depmod)."""
    base = root / f"lib/modules/{release}"
    base.mkdir(parents=True, exist_ok=True)
    if headers:
        (base / "build/include").mkdir(parents=True, exist_ok=True)
    if module is not None:
        (base / "updates/dkms").mkdir(parents=True, exist_ok=True)
        (base / "updates/dkms/nvidia.ko").write_bytes(
            dkms.module_bytes(
                [("version", module), ("license", "Dual MIT/GPL"), ("name", "nvidia")]
            )
        )
        subprocess.run([DEPMOD, "-b", str(root), "-a", release], capture_output=True, check=True)


def grub(root: Path, default: str) -> None:
    """Debian 12's generated grub.cfg (tests/fixtures/grub) booting ``default``, and the three
    kernels' images."""
    text = GRUB_CFG.read_text().replace(
        '   set default="${saved_entry}"\n', f'   set default="{default}"\n'
    )
    (root / "boot/grub").mkdir(parents=True, exist_ok=True)
    (root / "boot/grub/grub.cfg").write_text(text)
    for release in (OLDER, RUNNING, NEWEST):
        (root / f"boot/vmlinuz-{release}").write_text("")


def problem(root: Path, running: str = RUNNING, newest: str = NEWEST) -> str | None:
    """The check's verdict, its read run under ``root`` and parsed as the module parses it."""
    args = {"version": WANT, "running": running, "newest": newest}
    scripts = (boot_loader.script, driver_module.script)
    result = rooted.UnderRoot(str(root), *scripts).run(DriverModuleBuilt().read_script(args))
    assert result.rc == 0, result.stderr
    return DriverModuleBuilt().parse(args, result)["problem"] or None


def converge(root: Path, check: bool = False):
    args = {"version": WANT, "running": RUNNING, "newest": NEWEST}
    scripts = (boot_loader.script, driver_module.script)
    return rooted.converge(DriverModuleBuilt(), args, rooted.UnderRoot(str(root), *scripts), check)


def test_the_module_on_disk_for_the_newest_kernel_is_what_the_next_boot_needs(tmp_path):
    kernel(tmp_path, RUNNING, module=WANT)
    kernel(tmp_path, NEWEST, module=WANT)
    assert problem(tmp_path) is None


def test_without_grub_the_newest_kernel_is_judged_else_the_running_one(tmp_path):
    kernel(tmp_path, RUNNING, module=WANT)
    kernel(tmp_path, NEWEST, headers=False)
    assert problem(tmp_path) == (
        f"kernel {NEWEST} (the newest installed kernel, which a boot loader's default starts), "
        "which has no NVIDIA module on disk: its headers (linux-headers-6.1.0-31-amd64) are not "
        "installed, so DKMS built nothing for it: install them (nvidia_driver_kernel_headers) "
        "and DKMS builds it"
    )
    assert problem(tmp_path, newest="") is None  # the running kernel has it


def test_the_old_drivers_module_left_on_disk_is_named(tmp_path):
    kernel(tmp_path, RUNNING, module=OLD)
    said = problem(tmp_path, newest="")
    assert said.startswith(f"kernel {RUNNING} (the running kernel; no other is installed), "
                           f"which has the NVIDIA module of driver {OLD} on disk: DKMS did not "
                           "build it: see `dkms status nvidia`")  # fmt: skip
    assert f"/var/lib/dkms/nvidia/{WANT}/" in said


def test_dkms_autoinstall_disabled_is_named_with_the_command_that_builds_it(tmp_path):
    kernel(tmp_path, RUNNING)
    (tmp_path / "etc/dkms").mkdir(parents=True)
    (tmp_path / "etc/dkms/no-autoinstall").write_text("")
    said = problem(tmp_path, newest="")
    assert "/etc/dkms/no-autoinstall is present" in said
    assert f"dkms autoinstall -k {RUNNING}" in said


def test_the_kernel_grub_starts_is_judged_not_the_newest(tmp_path):
    for release in (OLDER, RUNNING, NEWEST):
        kernel(tmp_path, release, module=WANT if release != OLDER else None)
    grub(tmp_path, "1>4")  # the submenu's older kernel (test_modules_boot_loader)
    said = problem(tmp_path)
    assert said.startswith(f"kernel {OLDER} (default '1>4' in /boot/grub/grub.cfg: ")
    grub(tmp_path, "0")
    assert problem(tmp_path) is None


def test_a_grub_entry_whose_kernel_has_no_image_is_not_what_boots(tmp_path):
    kernel(tmp_path, NEWEST, module=WANT)
    grub(tmp_path, "1>4")
    (tmp_path / f"boot/vmlinuz-{OLDER}").unlink()
    assert problem(tmp_path) is None


def test_no_modinfo_is_a_failure_since_dkms_needs_kmod(tmp_path):
    said = driver_module.verdict(
        boot_loader.BootLoader(),
        driver_module.ModulesRead({}, modinfo=False),
        WANT,
        RUNNING,
        None,
    ).problem
    assert said is not None and said.startswith(f"kernel {RUNNING} (the running kernel; no other is installed), and "
                           "modinfo (kmod) is not installed")  # fmt: skip


def test_the_role_task_is_ok_where_built_and_never_a_change(tmp_path):
    kernel(tmp_path, RUNNING, module=WANT)
    kernel(tmp_path, NEWEST, module=WANT)
    for check in (False, True):
        result = converge(tmp_path, check=check)
        assert result.status == Status.OK, result.error


def test_the_role_task_fails_naming_the_kernel_and_that_the_host_is_not_rebooted(tmp_path):
    kernel(tmp_path, RUNNING, module=WANT)
    kernel(tmp_path, NEWEST, headers=False)
    result = converge(tmp_path)
    assert result.status == Status.FAILED
    assert result.error.startswith(
        f"driver {WANT}'s packages are installed, but the host's next boot starts kernel {NEWEST} "
    )
    assert result.error.endswith(
        "it would come back from a reboot without its driver, so it is not rebooted (its loaded "
        "driver keeps running until then)"
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [("version", "595.45.04; reboot"), ("version", ""), ("running", "6.1 0"), ("running", "")],
)
def test_arguments_that_are_no_version_or_kernel_are_refused(key, value):
    args = {"version": WANT, "running": RUNNING, "newest": NEWEST, key: value}
    with pytest.raises(ArgError) as exc:
        DriverModuleBuilt().validate(args)
    assert exc.value.key == key
