"""deployer/rollout/boot_kernel.py: a host whose boot loader starts a kernel DKMS builds no
NVIDIA module for (neither the running nor the newest installed one) is refused before the
rollout drains it; the entry formats are Debian's /etc/grub.d/10_linux (grub-common 2.06). The
hosts here have no grub.cfg, so /etc/default/grub's GRUB_DEFAULT stands in (the reading of a
grub.cfg: test_modules_boot_loader.py)."""

from __future__ import annotations

import pytest

from deployer.connection import CommandResult, LocalConnection
from deployer.gpu.rules import PackagePin
from deployer.modules import boot_loader
from deployer.modules.boot_loader import BootLoader
from deployer.rollout import availability, boot_kernel

RUNNING, NEWEST, OLDER = "6.1.0-28-amd64", "6.1.0-31-amd64", "6.1.0-25-amd64"
IMAGES = (OLDER, RUNNING, NEWEST)
DEVICE = "8c2f3a1e-5b4d-4c3e-9f1a-2b3c4d5e6f70"
SUBMENU = f"gnulinux-advanced-{DEVICE}"


def older_id(kind: str = "advanced") -> str:
    return f"gnulinux-{OLDER}-{kind}-{DEVICE}"


def write_root(root, default_file: str | None, grubenv: str | None, cfgs=()) -> None:
    (root / "etc/default/grub.d").mkdir(parents=True)
    (root / "boot/grub").mkdir(parents=True)
    if default_file is not None:
        (root / "etc/default/grub").write_text(default_file)
    for name, text in cfgs:
        (root / "etc/default/grub.d" / name).write_text(text)
    if grubenv is not None:
        block = f"# GRUB Environment Block\n{grubenv}"
        (root / "boot/grub/grubenv").write_text(block + "#" * (1024 - len(block)))
    for release in IMAGES:
        (root / f"boot/vmlinuz-{release}").write_text("")


def read(root) -> BootLoader:
    result = LocalConnection().run(boot_loader.script(str(root)), timeout=30)
    assert result.rc == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == boot_loader.MARK
    return boot_loader.parse(lines[1:])


def test_the_script_reads_grub_default_as_grub_mkconfig_sources_it_and_the_environment_block(
    tmp_path,
):
    default = 'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'
    # a drop-in sourced after the file wins, as grub-mkconfig sources them
    write_root(tmp_path, default, f"saved_entry={SUBMENU}>{older_id()}\n",
               [("99-pin.cfg", "GRUB_DEFAULT=saved\n")])  # fmt: skip
    boot = read(tmp_path)
    assert boot == BootLoader("saved", f"{SUBMENU}>{older_id()}", None, IMAGES)
    assert boot.entry == f"{SUBMENU}>{older_id()}"


def test_a_host_without_grub_configuration_is_not_judged(tmp_path):
    write_root(tmp_path, None, None)
    boot = read(tmp_path)
    assert boot.default is None and boot.entry is None and boot.images == IMAGES
    assert boot_kernel.judge("g1", boot, RUNNING, NEWEST) == (None, None)


def booting(default: str, saved: str | None = None, following: str | None = None) -> BootLoader:
    return BootLoader(default, saved, following, IMAGES)


@pytest.mark.parametrize(
    "boot",
    [
        booting(""),  # unset: the first entry
        booting("0"),
        booting("saved"),  # nothing saved yet: the first entry
        booting("saved", f"gnulinux-simple-{DEVICE}"),  # the first entry by its id
        booting("saved", f"{SUBMENU}>gnulinux-{RUNNING}-advanced-{DEVICE}"),  # the running one
        booting(f"{SUBMENU}>gnulinux-{NEWEST}-advanced-{DEVICE}"),  # the newest one
        booting("saved", f"{SUBMENU}>gnulinux-6.1.0-9-amd64-advanced-{DEVICE}"),  # not installed
        booting("saved", older_id(), f"gnulinux-{RUNNING}-advanced-{DEVICE}"),  # next boot: ok
    ],
)
def test_a_boot_into_a_kernel_dkms_builds_for_is_no_refusal(boot):
    assert boot_kernel.judge("g1", boot, RUNNING, NEWEST) == (None, None)


@pytest.mark.parametrize(
    ("boot", "how"),
    [
        (booting("saved", f"{SUBMENU}>{older_id()}"),
         f"GRUB_DEFAULT=saved, saved_entry '{SUBMENU}>{older_id()}'"),
        (booting("saved", older_id("recovery")), f"saved_entry '{older_id('recovery')}'"),
        (booting("saved", f"gnulinux-{OLDER}-init-sysvinit-{DEVICE}"), "saved_entry"),
        (booting("saved", f"gnulinux-{OLDER}-advanced-"), "saved_entry"),  # no device id
        # grub-reboot: the next boot only, whatever the default (00_header tests it first)
        (booting("saved", None, older_id()), f"next_entry '{older_id()}', set by grub-reboot"),
        (booting("0", None, older_id()), f"next_entry '{older_id()}', set by grub-reboot"),
        # by title, inside the submenu, as 10_linux's warning writes it
        (booting(f"Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux {OLDER}"),
         f"GRUB_DEFAULT='Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux {OLDER}'"),
        (booting("saved", f"Debian GNU/Linux, with Linux {OLDER} (recovery mode)"), "saved_entry"),
    ],
)  # fmt: skip
def test_a_boot_into_another_installed_kernel_is_refused_naming_it_and_the_setting(boot, how):
    refusal, note = boot_kernel.judge("g1", boot, RUNNING, NEWEST)
    assert note is None and refusal is not None
    assert (refusal.host, refusal.rule) == ("g1", "boot-kernel")
    assert refusal.message.startswith(f"its reboot boots kernel {OLDER} (")
    assert how in refusal.message
    assert refusal.message.endswith(
        f"which DKMS builds no NVIDIA module for (it builds for {RUNNING} and {NEWEST}): the host "
        "would come back without its driver"
    )
    assert "grub-set-default" in refusal.fix and "nothing was drained" in refusal.fix


def test_an_entry_by_number_inside_the_submenu_cannot_be_told_and_is_a_note():
    refusal, note = boot_kernel.judge("g1", booting("1>2"), RUNNING, "")
    assert refusal is None
    assert note == (
        "which kernel its reboot boots cannot be told (GRUB_DEFAULT='1>2'; no /boot/grub/grub.cfg "
        f"read): DKMS builds the driver's module for the running kernel {RUNNING} and the newest "
        "installed one only"
    )


OPEN = PackagePin("nvidia-open", "580.126.20", "580.126.20-1", "driver")


class Host:
    """A host answering the availability script, its boot loader set to ``boot``'s lines."""

    def __init__(self, boot: list[str]) -> None:
        self.boot = boot
        self.commands: list[str] = []

    def run(self, host: str, command: str, timeout: float) -> CommandResult:
        self.commands.append(command)
        out = [f"{availability.SOURCE_MARK} yes"]
        if boot_loader.MARK in command:
            out += [boot_loader.MARK, *self.boot]
        out += [availability.AUDIT_MARK, availability.POLICY_MARK, "nvidia-open:",
                "  Installed: (none)", "  Candidate: 580.126.20-1", "  Version table:",
                "     580.126.20-1 500",
                "        500 http://repo.example/cuda/debian12/x86_64  Packages"]  # fmt: skip
        return CommandResult(command, 0, "\n".join(out) + "\n", "")


PINNED = ["default=saved", f"saved_entry={SUBMENU}>{older_id()}",
          *(f"image={r}" for r in IMAGES)]  # fmt: skip


@pytest.mark.parametrize("refresh", [True, False], ids=["run", "check"])
def test_the_rollout_preflight_refuses_a_host_booting_another_kernel_in_one_round_trip(refresh):
    host = Host(PINNED)
    verdict = availability.check(
        {"g1": (OPEN,)}, host.run, refresh=refresh, kernels={"g1": (RUNNING, NEWEST)}
    )
    (refusal,) = verdict.refusals
    assert refusal.rule == "boot-kernel" and f"boots kernel {OLDER}" in refusal.message
    (command,) = host.commands
    assert "grubenv" in command and "apt-cache policy" in command


def test_a_note_rides_with_the_verdict_and_a_host_not_asked_gets_no_boot_question():
    host = Host(["default=1>2", *(f"image={r}" for r in IMAGES)])
    verdict = availability.check(
        {"g1": (OPEN,)}, host.run, refresh=True, kernels={"g1": (RUNNING, NEWEST)}
    )
    assert verdict.refusals == [] and "cannot be told" in verdict.notes["g1"]
    unasked = Host(PINNED)
    assert availability.check({"g1": (OPEN,)}, unasked.run, refresh=True).refusals == []
    assert boot_loader.MARK not in unasked.commands[0]
