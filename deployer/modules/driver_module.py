"""``driver_module``: a read-only check, after the driver's packages are installed and before any
reboot, that the NVIDIA module of the planned driver is on disk for the kernel the host's next
boot starts; it reads and never reports a change.

NVIDIA's Debian packages build their kernel module with DKMS at install time; the install can
succeed with no module built for a kernel: its headers missing (dkms 3.0.10-8+deb12u1
``/usr/lib/dkms/common.postinst``: ``Module build for kernel ... was skipped since the kernel
headers for this kernel do not seem to be installed``), ``/etc/dkms/no-autoinstall`` present
(``autoinstall for dkms modules has been disabled.``), or a build its package's scripts do not
fail on (docs/unverified.md#dkms-build-failure-and-the-package-install). The old driver's module
is gone from every kernel by then (``dkms remove --all`` in the old package's prerm), so a
reboot into such a kernel comes back with no driver. The role asks this after the packages and
before its reboot task, so the host is not rebooted; ``upgrade-driver``'s install step runs the
role, so a rollout stops on that host before its reboot too.

Read, in one round trip: the boot loader as :mod:`deployer.modules.boot_loader` reads it (which
kernel GRUB starts next), and for each ``/lib/modules/<kernel>``, whether its headers are there
(``build/include``, what dkms tests) and the ``version`` of the ``nvidia`` module ``modinfo -k
<kernel> -F version nvidia`` finds (kmod; NVIDIA's module declares
``MODULE_VERSION(NV_VERSION_STRING)``, NVIDIA/open-gpu-kernel-modules ``kernel-open/nvidia/
nv.c`` @30e15d79; dkms installs it under ``updates/dkms`` and runs ``depmod``, so ``modinfo``
finds it as ``modprobe`` will). The kernel judged: the one GRUB starts (a GRUB entry whose
kernel has no image installed, or no GRUB configuration: the newest installed kernel, else the
running one, the kernels Debian's dkms builds for).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from deployer.connection import CommandResult
from deployer.modules import boot_loader
from deployer.modules.base import (
    ArgError,
    HostSession,
    Observation,
    Param,
    ReadOnlyCheck,
    register,
)

MARK = "@@ driver module"
# A driver version as the matrix writes one (checked: it is put in a message)
_VERSION_CHARS = frozenset("0123456789.")


@dataclass(frozen=True)
class KernelModules:
    """One ``/lib/modules/<kernel>``: its headers are there; ``version``: the NVIDIA module's
    (``""``: none found)."""

    headers: bool
    version: str = ""


@dataclass(frozen=True)
class ModulesRead:
    """What the script read besides the boot loader."""

    kernels: dict[str, KernelModules] = field(default_factory=dict)
    modinfo: bool = True
    no_autoinstall: bool = False


def script(root: str = "") -> str:
    """Read-only shell (after :data:`MARK`): ``modinfo=none`` without kmod's modinfo,
    ``no_autoinstall=yes`` when DKMS's autoinstall is disabled, then ``kernel=<release> <yes|no>
    <version>`` per ``/lib/modules`` directory. ``root`` prefixes every path (tests; modinfo's
    ``-b``)."""
    r = shlex.quote(root) if root else ""
    base = f"-b {r} " if root else ""
    return (
        f"echo '{MARK}'\n"
        'PATH="$PATH:/usr/sbin:/sbin"; '
        "command -v modinfo >/dev/null 2>&1 || echo 'modinfo=none'; "
        f"[ -e {r}/etc/dkms/no-autoinstall ] && echo 'no_autoinstall=yes'; "
        f'for d in {r}/lib/modules/*/; do [ -d "$d" ] || continue; '
        'k=${d%/}; k=${k##*/}; h=no; [ -e "${d}build/include" ] && h=yes; '
        f'v=$(modinfo {base}-k "$k" -F version nvidia 2>/dev/null | head -n 1); '
        'printf \'kernel=%s %s %s\\n\' "$k" "$h" "$v"; done; '
        "true\n"
    )


def parse(lines: Iterable[str]) -> ModulesRead:
    kernels: dict[str, KernelModules] = {}
    modinfo, no_autoinstall = True, False
    for line in lines:
        key, _, value = line.partition("=")
        if key == "modinfo":
            modinfo = False
        elif key == "no_autoinstall":
            no_autoinstall = True
        elif key == "kernel":
            words = value.split()
            if len(words) >= 2:
                kernels[words[0]] = KernelModules(words[1] == "yes", " ".join(words[2:]))
    return ModulesRead(kernels, modinfo, no_autoinstall)


@dataclass(frozen=True)
class HostRead:
    """One reading of a host (:func:`host_script`): its boot loader and its modules on disk."""

    boot: boot_loader.BootLoader
    modules: ModulesRead


def host_script(root: str = "") -> str:
    """The one round trip: the boot loader as ``boot_loader`` reads it, then :func:`script`."""
    return boot_loader.script(root) + script(root)


def read_host(stdout: str) -> HostRead:
    """:func:`host_script`'s output, read."""
    lines = stdout.splitlines()
    cut = lines.index(MARK) if MARK in lines else len(lines)
    return HostRead(boot_loader.parse(lines[:cut]), parse(lines[cut + 1 :]))


@dataclass(frozen=True)
class Verdict:
    """The next boot judged: the kernel it starts and how that is known; ``problem`` (None: the
    module of the driver is on disk for that kernel), worded to follow ``the host's next boot
    starts``; ``note``: what of the boot loader's pick could not be told, where it could not."""

    kernel: str
    how: str
    problem: str | None = None
    note: str | None = None


def verdict(
    boot: boot_loader.BootLoader,
    modules: ModulesRead,
    version: str,
    running: str,
    newest: str | None,
) -> Verdict:
    """Is the module of driver ``version`` on disk for the kernel the next boot starts? That
    kernel: GRUB's pick (one whose image is installed), else the newest installed kernel, else
    the running one (see the module docstring)."""
    nxt = boot_loader.next_boot(boot, running, newest)
    if nxt.release is not None and (nxt.release in boot.images or not boot.images):
        kernel, how = nxt.release, nxt.how
    elif newest:
        kernel, how = newest, "the newest installed kernel, which a boot loader's default starts"
    else:
        kernel, how = running, "the running kernel; no other is installed"
    judged = Verdict(kernel, how, note=nxt.note)
    if not modules.modinfo:
        return replace(judged, problem=(
            f"kernel {kernel} ({how}), and modinfo (kmod) is not installed, so the module built "
            "for it cannot be read; dkms depends on kmod, so no module was built either"
        ))  # fmt: skip
    found = modules.kernels.get(kernel)
    if found is not None and found.version == version:
        return judged
    have = "no NVIDIA module" if found is None or not found.version else (
        f"the NVIDIA module of driver {found.version}"
    )  # fmt: skip
    if found is None or not found.headers:
        why = (
            f"its headers (linux-headers-{kernel}) are not installed, so DKMS built nothing for "
            "it: install them (nvidia_driver_kernel_headers) and DKMS builds it"
        )
    elif modules.no_autoinstall:
        why = (
            "/etc/dkms/no-autoinstall is present, so the packages' DKMS step built nothing: "
            f"run `dkms autoinstall -k {kernel}` or remove that file and reinstall the driver"
        )
    else:
        why = (
            f"DKMS did not build it: see `dkms status nvidia` and the build's make.log under "
            f"/var/lib/dkms/nvidia/{version}/"
        )
    return replace(judged, problem=f"kernel {kernel} ({how}), which has {have} on disk: {why}")


@register
class DriverModuleBuilt(ReadOnlyCheck):
    """The NVIDIA module of driver ``version`` is on disk for the kernel the next boot starts;
    the task fails, naming the kernel, what is on disk and why, before any reboot."""

    name = "driver_module"
    params = {
        "version": Param(str, required=True),
        "running": Param(str, required=True),
        "newest": Param(str, default=""),
    }

    def check(self, args: dict[str, Any]) -> None:
        if not args["version"] or not set(args["version"]) <= _VERSION_CHARS:
            raise ArgError("version", f"{args['version']!r} is not a driver version")
        for key in ("running", "newest"):
            if not boot_loader.RELEASE.match(args[key]):
                raise ArgError(key, f"{args[key]!r} is not a kernel release")
        if not args["running"]:
            raise ArgError("running", "the running kernel's release is needed")

    def read_script(self, args: dict[str, Any]) -> str:
        return host_script()

    def parse(self, args: dict[str, Any], result: CommandResult) -> dict[str, Any]:
        read = read_host(result.stdout)
        judged = verdict(
            read.boot, read.modules, args["version"], args["running"], args["newest"] or None
        )
        return {"problem": judged.problem or ""}

    def desired(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"problem": ""}

    def explain(self, args: dict[str, Any], session: HostSession, obs: Observation) -> str:
        return (
            f"driver {args['version']}'s packages are installed, but the host's next boot "
            f"starts {obs.actual['problem']}; it would come back from a reboot without its "
            "driver, so it is not rebooted (its loaded driver keeps running until then)"
        )
