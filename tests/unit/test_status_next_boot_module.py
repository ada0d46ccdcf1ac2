"""``status``' row ``next boot has the driver's module``, per GPU host: the installed driver's
NVIDIA module must be on disk for the kernel the host's next boot starts, or a reboot brings the
host back without its driver. Judged on every status run (the driver role asks it only around a
driver change): a kernel installed later without its headers, or with DKMS's autoinstall off, is
found before any reboot. The host's facts are canned; the module read is the driver role's own
script run by this machine's shell and the real ``modinfo`` under a temporary root, modules
written as the lab's simulated DKMS writes them (tests/unit/test_modules_driver_module.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deployer.connection import CommandResult
from deployer.errors import HostUnreachable
from deployer.facts import FACTS_SCRIPT
from deployer.modules import boot_loader, driver_module
from deployer.monitoring import status
from deployer.monitoring.check import FAILED, OK, PENDING, Check
from deployer.monitoring.checks_driver import MODULE_CHECK
from deployer.monitoring.rollouts import HostStep, RunInfo
from tests.unit import rooted
from tests.unit import test_modules_driver_module as modules_on_disk
from tests.unit.test_modules_driver_module import NEWEST, RUNNING, kernel
from tests.unit.test_monitoring_status import NOW, SMI_OK, CannedHosts, CannedStack, expectation

pytestmark = modules_on_disk.pytestmark  # kmod
INSTALLED = "580.65.06"  # SMI_OK's driver, the package facts find installed


def facts(family: str = "debian", installed: str | None = INSTALLED, kernels: str = "") -> str:
    """The facts script's answer: ``kernels`` its ``installed_kernel=`` lines."""
    os_id = {"debian": "debian", "rhel": "rocky"}[family]
    pkgs = f"nvidia-open\t{installed}-1\tii\n" if installed else ""
    smi = SMI_OK if installed else "@@smi_rc\nrc=127\n"
    return (
        f"@@os\nid={os_id}\nversion_id=12\narch=x86_64\nkernel={RUNNING}\nkernel_headers=yes\n"
        f"{kernels}@@pci\n{smi}"
        f"@@proc\nNVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {INSTALLED}  Release "
        f"Build\n@@pkgs\n{pkgs}@@nvswitch\n0\n"
    )


class GpuHost(rooted.UnderRoot):
    """gpu01: canned facts; the module read run under ``root``."""

    def __init__(self, root: Path, answer: str, fail: bool | str = False) -> None:
        super().__init__(str(root), boot_loader.script, driver_module.script)
        self.answer, self.fail, self.asked = answer, fail, []

    def run(self, command: str, **kwargs: Any) -> CommandResult:
        if command == FACTS_SCRIPT or "@@nvswitch" in command:
            return CommandResult(command, 0, self.answer, "")
        self.asked.append(command)
        if self.fail == "drop":
            raise HostUnreachable("gpu01: the SSH session dropped")
        if self.fail:
            return CommandResult(command, 1, "", "sh: 1: /lib/modules: Permission denied\n")
        return super().run(command, **kwargs)


def rows(
    root: Path, answer: str, fail: bool | str = False, **kw: Any
) -> tuple[list[Check], GpuHost]:
    canned = CannedHosts()
    gpu01 = GpuHost(root, answer, fail)

    def opener(host: str) -> Any:
        return gpu01 if host == "gpu01" else canned(host)

    checks = status.collect(expectation(**kw), CannedStack(), opener, now=lambda: NOW)
    return checks, gpu01


def module_row(checks: list[Check]) -> Check:
    (row,) = [c for c in checks if c.check == MODULE_CHECK]
    return row


def test_the_installed_drivers_module_on_disk_for_the_only_kernel_is_ok(tmp_path):
    kernel(tmp_path, RUNNING, module=INSTALLED)
    checks, _ = rows(tmp_path, facts(kernels=f"installed_kernel={RUNNING} yes\n"))
    row = module_row(checks)
    assert (row.component, row.host, row.state) == ("driver", "gpu01", OK)
    assert row.detail == (
        f"kernel {RUNNING} (the running kernel; no other is installed) has driver {INSTALLED}'s "
        "module on disk"
    )
    assert not [c for c in checks if c.state == FAILED]


def test_a_kernel_installed_later_without_its_headers_fails_before_any_reboot(tmp_path):
    """The driver runs (NVML's row ok); an unattended upgrade put in a newer kernel, no headers:
    DKMS built nothing for it, and it is what the next boot starts."""
    kernel(tmp_path, RUNNING, module=INSTALLED)
    kernel(tmp_path, NEWEST, headers=False)
    lines = f"installed_kernel={RUNNING} yes\ninstalled_kernel={NEWEST} no\n"
    checks, _ = rows(tmp_path, facts(kernels=lines))
    assert [(c.component, c.host, c.check) for c in checks if c.state == FAILED] == [
        ("driver", "gpu01", MODULE_CHECK)
    ]
    assert module_row(checks).detail == (
        f"driver {INSTALLED} is installed, but the host's next boot starts kernel {NEWEST} (the "
        "newest installed kernel, which a boot loader's default starts), which has no NVIDIA "
        f"module on disk: its headers (linux-headers-{NEWEST}) are not installed, so DKMS built "
        "nothing for it: install them (nvidia_driver_kernel_headers) and DKMS builds it; until "
        "then a reboot (an operator's, a power cut, a rollout's) brings it back without its "
        "driver"
    )
    # its headers installed and the module built for it (DKMS' header hook): ok, naming it
    kernel(tmp_path, NEWEST, module=INSTALLED)
    lines = lines.replace(f"{NEWEST} no", f"{NEWEST} yes")
    row = module_row(rows(tmp_path, facts(kernels=lines))[0])
    assert (row.state, row.detail) == (OK, (
        f"kernel {NEWEST} (the newest installed kernel, which a boot loader's default starts) "
        f"has driver {INSTALLED}'s module on disk"
    ))  # fmt: skip


def test_a_boot_loader_whose_pick_cannot_be_told_is_said_beside_an_ok(tmp_path):
    """GRUB_DEFAULT by number and no grub.cfg to count in: the newest kernel is judged (what a
    default boots), and the row says the boot loader's pick could not be told."""
    kernel(tmp_path, RUNNING, module=INSTALLED)
    (tmp_path / "etc/default").mkdir(parents=True)
    (tmp_path / "etc/default/grub").write_text("GRUB_DEFAULT=2\n")
    row = module_row(rows(tmp_path, facts(kernels=f"installed_kernel={RUNNING} yes\n"))[0])
    assert row.state == OK
    assert row.detail.startswith(
        f"kernel {RUNNING} (the running kernel; no other is installed) has driver {INSTALLED}'s "
        "module on disk; but which kernel its reboot boots cannot be told (GRUB_DEFAULT="
    ), row.detail


def test_dkms_autoinstall_off_after_a_kernel_update_is_named_with_the_command(tmp_path):
    kernel(tmp_path, RUNNING, module=INSTALLED)
    kernel(tmp_path, NEWEST)
    (tmp_path / "etc/dkms").mkdir(parents=True)
    (tmp_path / "etc/dkms/no-autoinstall").write_text("")
    lines = f"installed_kernel={RUNNING} yes\ninstalled_kernel={NEWEST} yes\n"
    row = module_row(rows(tmp_path, facts(kernels=lines))[0])
    assert row.state == FAILED
    assert f"/etc/dkms/no-autoinstall is present, so the packages' DKMS step built nothing: " \
           f"run `dkms autoinstall -k {NEWEST}`" in row.detail  # fmt: skip


def test_a_read_that_fails_fails_the_row_with_the_hosts_words(tmp_path):
    row = module_row(rows(tmp_path, facts(), fail=True)[0])
    assert (row.state, row.detail) == (FAILED, "cannot read: exit 1: sh: 1: /lib/modules: "
                                       "Permission denied")  # fmt: skip


def test_a_session_dropped_after_the_facts_fails_the_row_naming_why(tmp_path):
    checks, _ = rows(tmp_path, facts(), fail="drop")
    row = module_row(checks)
    assert (row.state, row.detail) == (FAILED, "cannot read: gpu01: the SSH session dropped")


def test_no_driver_installed_gives_no_row_and_nothing_is_read(tmp_path):
    """NVML's row fails for it; the module of no driver is not asked."""
    checks, host = rows(tmp_path, facts(installed=None))
    assert not [c for c in checks if c.check == MODULE_CHECK]
    assert host.asked == []


def test_an_rpm_family_host_is_not_judged_and_says_so(tmp_path):
    checks, host = rows(tmp_path, facts(family="rhel"))
    row = module_row(checks)
    assert row.state == OK and row.detail == (
        "not judged: rocky is not of the Debian family, whose dkms and GRUB layout are what is read"
    )
    assert host.asked == []


def test_a_host_a_driven_rollout_has_out_of_service_is_pending_not_failed(tmp_path):
    """Mid-rollout the packages change before the module is built: the rollout's own install
    step asks the same before its reboot."""
    kernel(tmp_path, RUNNING)  # no module on disk yet
    exp = expectation()
    canned, gpu01 = CannedHosts(), GpuHost(tmp_path, facts())
    obs = status._observe(exp, CannedStack(), lambda h: gpu01 if h == "gpu01" else canned(h), 4, 4)
    assert module_row(status.judge(exp, obs, now=NOW, with_hosts=True)).state == FAILED
    obs.runs = [RunInfo("r1", True, "/state/r1", driven=True, status="running",
                        hosts={"gpu01": HostStep("installing")})]  # fmt: skip
    row = module_row(status.judge(exp, obs, now=NOW, with_hosts=True))
    assert row.state == PENDING
    assert row.detail.endswith("(out of service in upgrade-driver run r1 (installing))")


def test_api_only_reads_no_host():
    checks = status.collect(expectation(), CannedStack(), None, now=lambda: NOW)
    assert not [c for c in checks if c.check == MODULE_CHECK]
