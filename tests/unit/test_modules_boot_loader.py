"""``boot_loader``: the driver role's check that a host's next boot starts a kernel the driver's
module is built for, read through the executor by this machine's shell from a GRUB configuration
written under a temporary root; never a change, a failure names the kernel and the setting."""

from __future__ import annotations

from typing import Any

import pytest

from deployer.connection import CommandResult, LocalConnection
from deployer.executor import Executor
from deployer.modules import boot_loader
from deployer.modules.boot_loader import BootLoaderCheck
from deployer.plan import HostPlan, HostPlay, PlannedTask
from deployer.results import Status
from deployer.roles import Play

PLAY = Play(name="p", hosts="all", roles=("r",))
RUNNING, NEWEST, OLDER = "6.1.0-28-amd64", "6.1.0-31-amd64", "6.1.0-25-amd64"
DEVICE = "8c2f3a1e-5b4d-4c3e-9f1a-2b3c4d5e6f70"
PINNED = f"gnulinux-advanced-{DEVICE}>gnulinux-{OLDER}-advanced-{DEVICE}"


class UnderRoot(LocalConnection):
    """This machine's shell, the boot loader's paths read under ``root`` (the script as the
    module sends it, each path prefixed: ``boot_loader.script(root)``)."""

    def __init__(self, root: str) -> None:
        super().__init__("h1")
        self.root = root

    def run(self, command: str, **kwargs: Any) -> CommandResult:
        assert boot_loader.script() in command  # the module asks the real paths
        command = command.replace(boot_loader.script(), boot_loader.script(self.root))
        return super().run(command, **kwargs)


def write_grub(root, default: str | None, saved: str | None = None) -> None:
    (root / "etc/default").mkdir(parents=True)
    (root / "boot/grub").mkdir(parents=True)
    if default is not None:
        (root / "etc/default/grub").write_text(f"GRUB_DEFAULT={default}\nGRUB_TIMEOUT=5\n")
    if saved is not None:
        (root / "boot/grub/grubenv").write_text(f"# GRUB Environment Block\nsaved_entry={saved}\n")
    for release in (OLDER, RUNNING, NEWEST):
        (root / f"boot/vmlinuz-{release}").write_text("")


def converge(root, check: bool = False):
    args = {"running": RUNNING, "newest": NEWEST, "purpose": "driver 595.45.04's install"}
    module = BootLoaderCheck()
    task = PlannedTask("r", "boot", module, module.validate(args), "tasks.yml", 1)
    plan = HostPlan("h1", [HostPlay(PLAY, [task], {}, [])])
    report = Executor(lambda h: UnderRoot(str(root)), check=check).run([plan], (PLAY,))
    (result,) = report.hosts["h1"].tasks
    return result


@pytest.mark.parametrize(
    ("default", "saved"),
    [
        (None, None),  # no GRUB configuration here: nothing to judge
        ("0", None),  # the first entry: the newest kernel GRUB lists
        ("saved", f"gnulinux-advanced-{DEVICE}>gnulinux-{NEWEST}-advanced-{DEVICE}"),
        ("'1>2'", None),  # by number inside the submenu: cannot be told without grub.cfg
    ],
)
def test_a_boot_into_a_kernel_dkms_builds_for_or_one_not_told_is_ok_and_never_a_change(
    tmp_path, default, saved
):
    write_grub(tmp_path, default, saved)
    result = converge(tmp_path)
    assert (result.status, result.wrote) == (Status.OK, False), result.error


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
def test_a_boot_into_another_installed_kernel_fails_naming_it_the_setting_and_the_fix(
    tmp_path, check
):
    write_grub(tmp_path, "saved", PINNED)
    result = converge(tmp_path, check=check)
    assert result.status == Status.FAILED and not result.wrote
    assert result.error == (
        f"the host's reboot boots kernel {OLDER} (GRUB_DEFAULT=saved, saved_entry {PINNED!r}), "
        f"which DKMS builds no NVIDIA module for (it builds for {RUNNING} and {NEWEST}): after "
        "driver 595.45.04's install it would come back without its driver; set the boot "
        "loader's default to the running or newest kernel (grub-set-default, or GRUB_DEFAULT "
        "and update-grub), or boot the host into that kernel first; nothing was installed"
    )
