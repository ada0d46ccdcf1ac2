"""``boot_loader``: the driver role's check that a host's next boot starts a kernel the driver's
module is built for, read by this machine's shell from a GRUB configuration written under a
temporary root -- a grub.cfg as Debian 12's grub-mkconfig writes it (tests/fixtures/grub), its
entry picked as GRUB 2.06 picks it -- and through the executor; never a change, a failure names
the kernel and the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.connection import LocalConnection
from deployer.modules import boot_loader
from deployer.modules.boot_loader import BootLoader, BootLoaderCheck, MenuEntry
from deployer.results import Status
from tests.unit import rooted

RUNNING, NEWEST, OLDER = "6.1.0-28-amd64", "6.1.0-31-amd64", "6.1.0-25-amd64"
DEVICE = "8c2f3a1e-5b4d-4c3e-9f1a-2b3c4d5e6f70"
SUBMENU = f"gnulinux-advanced-{DEVICE}"
PINNED = f"{SUBMENU}>gnulinux-{OLDER}-advanced-{DEVICE}"
GRUB_CFG = Path(__file__).parents[1] / "fixtures/grub/debian12-grub.cfg"
SAVED_LINE = '   set default="${saved_entry}"\n'


def write_grub(root, default: str | None, saved: str | None = None) -> None:
    (root / "etc/default").mkdir(parents=True)
    (root / "boot/grub").mkdir(parents=True)
    if default is not None:
        (root / "etc/default/grub").write_text(f"GRUB_DEFAULT={default}\nGRUB_TIMEOUT=5\n")
    if saved is not None:
        (root / "boot/grub/grubenv").write_text(f"# GRUB Environment Block\nsaved_entry={saved}\n")
    for release in (OLDER, RUNNING, NEWEST):
        (root / f"boot/vmlinuz-{release}").write_text("")


def write_cfg(root, default: str | None = None) -> None:
    """The generated grub.cfg as /boot/grub/grub.cfg, its ``set default`` line as another
    GRUB_DEFAULT writes it (the one line GRUB_DEFAULT changes: tests/fixtures/grub)."""
    text = GRUB_CFG.read_text()
    assert text.count(SAVED_LINE) == 1
    if default is not None:
        text = text.replace(SAVED_LINE, f'   set default="{default}"\n')
    (root / "boot/grub").mkdir(parents=True, exist_ok=True)
    (root / "boot/grub/grub.cfg").write_text(text)


def read(root) -> BootLoader:
    result = LocalConnection().run(boot_loader.script(str(root)), timeout=30)
    assert result.rc == 0, result.stderr
    return boot_loader.parse(result.stdout.splitlines())


def converge(root, check: bool = False):
    args = {"running": RUNNING, "newest": NEWEST, "purpose": "driver 595.45.04's install"}
    return rooted.converge(
        BootLoaderCheck(), args, rooted.UnderRoot(str(root), boot_loader.script), check
    )


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


# ---- grub.cfg: what GRUB itself reads at boot -------------------------------------------------


def title(release: str, recovery: bool = False) -> str:
    return f"Debian GNU/Linux, with Linux {release}{' (recovery mode)' if recovery else ''}"


def test_grub_cfgs_menu_is_read_as_10_linux_wrote_it_each_entry_with_the_kernel_it_loads(
    tmp_path,
):
    write_grub(tmp_path, None)
    write_cfg(tmp_path)
    boot = read(tmp_path)
    assert boot.cfg_default == "${saved_entry}" and boot.default is None
    simple, advanced = boot.menu
    assert simple == MenuEntry("Debian GNU/Linux", f"gnulinux-simple-{DEVICE}", NEWEST)
    assert (advanced.title, advanced.id) == ("Advanced options for Debian GNU/Linux", SUBMENU)
    assert [(e.title, e.release) for e in advanced.children] == [
        (title(r, recovery), r) for r in (NEWEST, RUNNING, OLDER) for recovery in (False, True)
    ]
    assert advanced.children[4].id == f"gnulinux-{OLDER}-advanced-{DEVICE}"


def judged(tmp_path, cfg_default: str | None, saved=None, following=None, etc_default=None):
    write_grub(tmp_path, etc_default, saved)
    if following is not None:
        with (tmp_path / "boot/grub/grubenv").open("a") as env:
            env.write(f"next_entry={following}\n")
    write_cfg(tmp_path, cfg_default)
    return boot_loader.judge(read(tmp_path), RUNNING, NEWEST)


@pytest.mark.parametrize(
    ("cfg_default", "saved"),
    [
        ("0", None),  # the first entry: the newest kernel
        ("${saved_entry}", None),  # nothing saved: entry 0
        ("${saved_entry}", f"{SUBMENU}>gnulinux-{RUNNING}-advanced-{DEVICE}"),
        ("${saved_entry}", f"{SUBMENU}>gnulinux-6.1.0-9-amd64-advanced-{DEVICE}"),  # gone: 0
        ("1>2", None),  # by number in the submenu: the running kernel
        ("1", None),  # the submenu alone: its entry 1 (GRUB keeps "1"), the newest's recovery
        ("1>9", None),  # past the submenu's end: its entry 0
        ("7", None),  # past the menu's end: entry 0
    ],
)
def test_a_grub_cfg_entry_that_boots_a_kernel_dkms_builds_for_is_no_problem(
    tmp_path, cfg_default, saved
):
    assert judged(tmp_path, cfg_default, saved) == (None, None)


@pytest.mark.parametrize(
    ("cfg_default", "saved", "following", "how"),
    [
        ("${saved_entry}", PINNED, None, f"GRUB_DEFAULT=saved, saved_entry {PINNED!r}"),
        ("1>4", None, None, f"default '1>4' in /boot/grub/grub.cfg: {title(OLDER)!r}"),
        ("1>5", None, None, f"default '1>5' in /boot/grub/grub.cfg: {title(OLDER, True)!r}"),
        (f"Advanced options for Debian GNU/Linux>{title(OLDER)}", None, None, "default 'Adv"),
        ("0", None, "1>4", f"next_entry '1>4', set by grub-reboot for one boot: {title(OLDER)!r}"),
    ],
)
def test_a_grub_cfg_entry_that_boots_another_installed_kernel_is_the_problem(
    tmp_path, cfg_default, saved, following, how
):
    problem, note = judged(tmp_path, cfg_default, saved, following)
    assert note is None
    assert problem.startswith(f"boots kernel {OLDER} ({how}")
    assert problem.endswith(f"which DKMS builds no NVIDIA module for (it builds for {RUNNING} "
                            f"and {NEWEST})")  # fmt: skip


def test_grub_cfg_wins_over_an_etc_default_grub_update_grub_has_not_written_and_says_so(
    tmp_path,
):
    # the pin removed from /etc/default/grub, update-grub not run: GRUB still boots 1>4
    problem, _ = judged(tmp_path, "1>4", etc_default="0")
    assert problem.startswith(
        f"boots kernel {OLDER} (default '1>4' in /boot/grub/grub.cfg; /etc/default/grub's "
        f"GRUB_DEFAULT='0' is not in /boot/grub/grub.cfg until update-grub runs: {title(OLDER)!r})"
    )
    # the other way round: pinned in the file only, GRUB boots what grub.cfg says, the newest
    assert judged(tmp_path / "b", "0", etc_default="'1>4'") == (None, None)


def test_an_entry_that_loads_no_linux_kernel_cannot_be_told_and_is_a_note(tmp_path):
    write_grub(tmp_path, None)
    write_cfg(tmp_path, "2")
    with (tmp_path / "boot/grub/grub.cfg").open("a") as cfg:  # 30_uefi-firmware's entry
        cfg.write("menuentry 'UEFI Firmware Settings' $menuentry_id_option 'uefi-firmware' {\n"
                  "\tfwsetup\n}\n")  # fmt: skip
    problem, note = boot_loader.judge(read(tmp_path), RUNNING, NEWEST)
    assert problem is None
    assert note.startswith("its reboot starts 'UEFI Firmware Settings' (default '2' in ")


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
def test_the_role_passes_a_pick_it_cannot_tell_with_a_note_as_the_rollout_does(tmp_path, check):
    """GRUB_DEFAULT by number and no grub.cfg to count in: ok, and the task says what it could
    not judge (upgrade-driver's preflight prints the same as a NOTE)."""
    write_grub(tmp_path, "2")
    result = converge(tmp_path, check=check)
    assert result.status == Status.OK and not result.wrote
    assert result.note == (
        "which kernel its reboot boots cannot be told (GRUB_DEFAULT='2'; no /boot/grub/grub.cfg "
        f"read): DKMS builds the driver's module for the running kernel {RUNNING} and the newest "
        f"installed one ({NEWEST}) only"
    )
    assert result.to_json()["note"] == result.note
    (tmp_path / "etc/default/grub").write_text("GRUB_DEFAULT=0\n")  # what it can tell: no note
    assert converge(tmp_path, check=check).note is None


def test_the_role_fails_a_host_whose_grub_cfg_boots_another_kernel_by_number(tmp_path):
    write_grub(tmp_path, None)
    write_cfg(tmp_path, "1>4")
    result = converge(tmp_path)
    assert result.status == Status.FAILED and not result.wrote
    assert result.error.startswith(
        f"the host's reboot boots kernel {OLDER} (default '1>4' in /boot/grub/grub.cfg: "
        f"{title(OLDER)!r}), which DKMS builds no NVIDIA module for"
    )
