"""``boot_loader``: a read-only check that a GPU host's next boot starts a kernel the driver's
module is built for; it reads and never reports a change.

Debian's dkms builds the driver's module for two kernels only, the running one and the newest
installed one (dkms 3.0.10 ``/usr/lib/dkms/common.postinst``: ``KERNELS="$CURRENT_KERNEL
$NEWEST_KERNEL"``; the driver role installs both kernels' headers, ``gpu_plan``), and the new
driver's packages take the old driver's module away from every kernel. A host whose boot loader
is set to start another installed kernel -- an administrator's pin (``GRUB_DEFAULT`` to an
entry, or ``saved`` with ``grub-set-default``), a one-time ``grub-reboot`` -- comes back from
its next reboot with no NVIDIA module. So the nvidia_driver role asks this before it installs a
driver (a failure there installs nothing), and ``upgrade-driver``'s preflight asks the same
reading, in the round trip that asks the host's package sources, before it drains a host
(deployer/rollout/boot_kernel.py).

What is read is GRUB's default as ``grub-mkconfig`` and GRUB read it: ``GRUB_DEFAULT`` from
``/etc/default/grub`` and ``/etc/default/grub.d/*.cfg`` (sourced in a subshell, as
``grub-mkconfig`` sources them: the default its last run wrote into ``grub.cfg``, assuming
``update-grub`` ran since the file changed), and ``/boot/grub/grubenv``'s ``next_entry``
(``grub-reboot``'s one boot, which wins over any default) and, with ``saved``, its
``saved_entry`` (grub-common 2.06 ``/etc/grub.d/00_header``); and the installed kernel images.
An entry that names a kernel (Debian's ids ``gnulinux-<release>-advanced-<device>``, or a title
``..., with Linux <release>``, after the submenu's ``...>``) that is installed and is neither the
running nor the newest kernel is the problem. The first entry (``0``, ``gnulinux-simple-...``:
the newest kernel GRUB lists) needs nothing; an entry by number inside a submenu (``1>2``) or
one of another shape cannot be told without ``grub.cfg`` (a note where the caller can say one,
else no failure). No GRUB configuration (another boot loader, a container): nothing is judged.
The entry formats are Debian's ``/etc/grub.d/10_linux`` (grub-common 2.06-13+deb12u2:
``menuentry ... $menuentry_id_option 'gnulinux-$version-$type-$boot_device_id'``, titles
``"%s, with Linux %s"``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from deployer.connection import CommandResult
from deployer.modules.base import ArgError, HostSession, Module, Observation, Param, register

MARK = "@@ boot loader"
# gnulinux-<release>-<type>-<boot device id>; the id is empty where grub-probe found none
_ID = re.compile(r"^gnulinux-(?P<release>.+?)-(?:advanced|recovery|init-[A-Za-z0-9_]+)(?:-.*)?$")
_TITLE = re.compile(r", with Linux (?P<release>\S+?)(?: \(.*\))?$")
# A kernel release as uname -r prints it (checked: the module's arguments come from facts)
_RELEASE = re.compile(r"^[A-Za-z0-9._+~-]*$")
# How to mend it, said by the role's check and the rollout's refusal alike
FIX = (
    "set the boot loader's default to the running or newest kernel (grub-set-default, or "
    "GRUB_DEFAULT and update-grub), or boot the host into that kernel first"
)


@dataclass(frozen=True)
class BootLoader:
    """What the script read: ``None`` fields when the host has no GRUB configuration."""

    default: str | None = None  # GRUB_DEFAULT ("" when the file leaves it unset)
    saved_entry: str | None = None
    next_entry: str | None = None
    images: tuple[str, ...] = field(default_factory=tuple)  # releases of /boot/vmlinuz-*

    @property
    def entry(self) -> str | None:
        """The entry the next boot starts, as GRUB picks it (None: no GRUB here)."""
        if self.default is None:
            return None
        if self.next_entry:  # grub-reboot's one boot, whatever GRUB_DEFAULT says
            return self.next_entry
        if self.default.strip() == "saved":
            return self.saved_entry or "0"
        return self.default.strip() or "0"


def script(root: str = "") -> str:
    """Read-only shell (after :data:`MARK`): ``default=`` when the host has a GRUB
    configuration, ``saved_entry=`` / ``next_entry=`` of its environment block, ``image=`` per
    installed kernel image. ``root`` prefixes every path (tests)."""
    r = shlex.quote(root) if root else ""
    return (
        f"echo '{MARK}'\n"
        f"if [ -e {r}/etc/default/grub ] || [ -e {r}/boot/grub/grubenv ]; then "
        f"( GRUB_DEFAULT=; [ -r {r}/etc/default/grub ] && . {r}/etc/default/grub; "
        f'for f in {r}/etc/default/grub.d/*.cfg; do [ -r "$f" ] && . "$f"; done; '
        "printf 'default=%s\\n' \"$GRUB_DEFAULT\" ) </dev/null 2>/dev/null; "
        f"[ -r {r}/boot/grub/grubenv ] && "
        f"grep -E '^(saved_entry|next_entry)=' {r}/boot/grub/grubenv; fi; "
        f'for v in {r}/boot/vmlinuz-*; do [ -e "$v" ] && echo "image=${{v##*/vmlinuz-}}"; done; '
        "true\n"
    )


def parse(lines: Iterable[str]) -> BootLoader:
    default = saved = following = None
    images = []
    for line in lines:
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "default":
            default = value
        elif key == "saved_entry":
            saved = value
        elif key == "next_entry":
            following = value
        elif key == "image" and value:
            images.append(value)
    return BootLoader(default, saved, following, tuple(images))


def release_of(entry: str) -> str | None:
    """The kernel release an entry names (its last ``>`` part: Debian's id or title), else
    None."""
    last = entry.replace(">>", "\0").split(">")[-1].replace("\0", ">")
    for pattern in (_ID, _TITLE):
        m = pattern.search(last)
        if m:
            return m.group("release")
    return None


def first_entry(entry: str) -> bool:
    """The first menu entry: the newest kernel GRUB lists (10_linux's version-sorted list)."""
    return entry == "0" or entry.startswith("gnulinux-simple-")


def judge(
    boot: BootLoader, running: str | None, newest: str | None
) -> tuple[str | None, str | None]:
    """(the problem, a note) of a boot loader that starts a kernel DKMS builds no module for:
    the problem as ``boots kernel R (how it is set), which DKMS builds no NVIDIA module for (it
    builds for ...)``, for the caller to put after its subject."""
    entry = boot.entry
    if entry is None or first_entry(entry):
        return None, None
    if boot.next_entry:
        how = f"next_entry {entry!r}, set by grub-reboot for one boot"
    elif (boot.default or "").strip() == "saved":
        how = f"GRUB_DEFAULT=saved, saved_entry {entry!r}"
    else:
        how = f"GRUB_DEFAULT={entry!r}"
    release = release_of(entry)
    if release is None:
        return None, (
            f"which kernel its reboot boots cannot be told ({how}): DKMS builds the driver's "
            f"module for the running kernel {running or '?'} and the newest installed one"
            f"{f' ({newest})' if newest else ''} only"
        )
    if release in (running, newest) or release not in boot.images:
        return None, None
    built = " and ".join(dict.fromkeys(k for k in (running, newest) if k))
    return (
        f"boots kernel {release} ({how}), which DKMS builds no NVIDIA module for "
        f"(it builds for {built})",
        None,
    )


@register
class BootLoaderCheck(Module):
    """The host's next boot starts ``running`` or ``newest`` (the kernels DKMS builds the
    driver's module for) or the first entry; the task fails, saying which kernel and where it is
    set, when the boot loader starts another installed kernel."""

    name = "boot_loader"
    params = {
        "running": Param(str, required=True),
        "newest": Param(str, default=""),
        "purpose": Param(str, default="the driver's install"),
    }
    reports_change = False
    judged_by_read = True

    def check(self, args: dict[str, Any]) -> None:
        for key in ("running", "newest"):
            if not _RELEASE.match(args[key]):
                raise ArgError(key, f"{args[key]!r} is not a kernel release")
        if not args["running"]:
            raise ArgError("running", "the running kernel's release is needed")

    def read_script(self, args: dict[str, Any]) -> str:
        return script()

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        lines = result.stdout.splitlines()
        problem, _ = judge(parse(lines), args["running"], args["newest"] or None)
        return {"problem": problem or ""}

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"problem": ""}  # (None would be a key not asked)

    def explain(self, args: dict[str, Any], session: HostSession, obs: Observation) -> str:
        return (
            f"the host's reboot {obs.actual['problem']}: after {args['purpose']} it would come "
            f"back without its driver; {FIX}; nothing was installed"
        )

    def write(self, session: HostSession, args: dict[str, Any], obs: Observation) -> None:
        raise RuntimeError("a boot loader check has no write side")
