"""SIMULATED DKMS for the NVIDIA kernel module: what Debian's dkms 3.0.10-8+deb12u1 does for a
package built with dh_dkms, so that a lab host has a module on disk per kernel exactly where the
real one does, and a kernel without one boots without a driver.

``nvidia-dkms autoinstall [UPGRADE]``: the package's postinst (``/usr/lib/dkms/common.postinst``:
``/etc/dkms/no-autoinstall`` disables it; the kernels are the running one, when
``/lib/modules/<it>`` exists, and the newest of ``/boot/config-*``, by ``dpkg
--compare-versions``; each with headers -- ``/lib/modules/<k>/build/include`` -- gets the
module, each without is skipped with dkms' words). ``nvidia-dkms kernel KERNEL``: a kernel's
headers just installed (``/etc/kernel/header_postinst.d/dkms`` -> ``dkms_autoinstaller start``).
``nvidia-dkms remove``: the package's prerm (``dkms remove --all``).

The module "built" is an ELF file holding only a ``.modinfo`` section (version, license,
vermagic ...), which ``modinfo`` and ``depmod`` read as they read a real module's; no code is
compiled and nothing can load it. Stand-in for the lab only; not NVIDIA's nor Debian's software.
"""

import contextlib
import glob
import os
import shutil
import struct
import subprocess
import sys

if __package__:  # imported from the source tree (the tests, the package builder)
    from deployer.lab.gpusim.standins import common as c
else:  # installed on a simulated host: the package ships gpusim_common.py
    import gpusim_common as c  # type: ignore[no-redef]

# The modules NVIDIA's DKMS package builds (dkms.conf BUILT_MODULE_NAME); nvidia.ko carries the
# version the product reads
MODULES = ("nvidia", "nvidia-modeset", "nvidia-drm", "nvidia-uvm")
ELF_MACHINE = {"x86_64": 62, "aarch64": 183}


def module_bytes(fields: list) -> bytes:
    """A 64-bit little-endian ELF relocatable object whose only content is a ``.modinfo``
    section of ``key=value`` strings (the sections: null, .modinfo, .shstrtab)."""
    modinfo = b"".join(f"{k}={v}".encode() + b"\0" for k, v in fields)
    names = b"\0.modinfo\0.shstrtab\0"
    at_modinfo = 64
    at_names = at_modinfo + len(modinfo)
    at_sections = (at_names + len(names) + 7) & ~7
    machine = ELF_MACHINE.get(os.uname().machine, 62)
    head = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    head += struct.pack("<HHIQQQIHHHHHH", 1, machine, 1, 0, 0, at_sections, 0, 64, 0, 0, 64, 3, 2)
    body = head + modinfo + names
    body += bytes(at_sections - len(body))
    body += bytes(64)  # section 0
    body += struct.pack("<IIQQQQIIQQ", 1, 1, 2, 0, at_modinfo, len(modinfo), 0, 0, 1, 0)
    body += struct.pack("<IIQQQQIIQQ", 10, 3, 0, 0, at_names, len(names), 0, 0, 1, 0)
    return body


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")


def _headers(kernel: str) -> bool:
    return os.path.exists(c.path(f"/lib/modules/{kernel}/build/include"))


def _depmod(kernel: str) -> None:
    depmod = shutil.which("depmod") or shutil.which("depmod", path="/usr/sbin:/sbin")
    if depmod is None:
        return
    base = [] if c.in_real_root() else ["-b", c.sim_root()]
    subprocess.run([depmod, *base, "-a", kernel], capture_output=True, check=False)


def _newer(a: str, b: str) -> bool:
    return subprocess.run(["dpkg", "--compare-versions", a, "ge", b], check=False).returncode == 0


def _version_abi(kernel: str) -> str:
    """``${K%%-*}-<ABI>`` as common.postinst cuts a release (``6.1.0-18-amd64`` -> ``6.1.0-18``;
    one without a ``-`` is its own ABI)."""
    version, _, rest = kernel.partition("-")
    return f"{version}-{(rest or kernel).split('-')[0]}"


def newest_kernel(current: str) -> str:
    """common.postinst's ``get_newest_kernel`` (Debian): the greatest ``<version>-<abi>`` of
    ``/boot/config-*`` not below the running kernel's, "" where none is, or it has no
    ``/lib/modules`` directory."""
    newest, compare_to = "", _version_abi(current)
    for config in sorted(glob.glob(c.path("/boot/config-*"))):
        kernel = os.path.basename(config)[len("config-") :]
        if _newer(_version_abi(kernel), compare_to):
            newest, compare_to = kernel, _version_abi(kernel)
    if newest and not os.path.exists(c.path(f"/lib/modules/{newest}")):
        return ""
    return newest


def build(kernel: str, source: dict) -> None:
    """``dkms build`` and ``dkms install`` for one kernel: the modules written, depmod run."""
    _say(f"Building initial module for {kernel}")
    license_ = c.OPEN_LICENSE if source.get("flavour") == "open" else "NVIDIA"
    where = c.path(c.DKMS_MODULE_DIR.format(kernel=kernel))
    os.makedirs(where, exist_ok=True)
    for name in MODULES:
        fields = [
            ("version", source["version"]),
            ("license", license_),
            ("description", f"SIMULATED {name} module stand-in (gpumon-deploy lab): no code"),
            ("name", name.replace("-", "_")),
            ("vermagic", f"{kernel} SMP preempt mod_unload modversions "),
        ]
        tmp = os.path.join(where, f".{name}.ko.tmp")
        with open(tmp, "wb") as f:
            f.write(module_bytes(fields))
        os.replace(tmp, os.path.join(where, f"{name}.ko"))
    _say("Done.")
    _say(f"{c.SIM_NOTE}: nvidia.ko {source['version']} installed to "
         f"{c.DKMS_MODULE_DIR.format(kernel=kernel)}/")  # fmt: skip
    _depmod(kernel)


def _skipped(kernel: str) -> None:
    _say(f"Module build for kernel {kernel} was skipped since the")
    _say("kernel headers for this kernel do not seem to be installed.")


def autoinstall(upgrade: str) -> int:
    """The postinst's builds (see the module docstring)."""
    source = c.installed_module()
    if source is None:
        return 0
    if os.path.exists(c.path("/etc/dkms/no-autoinstall")):
        _say("autoinstall for dkms modules has been disabled.")
        return 0
    current = c.running_kernel()
    newest = newest_kernel(current)
    if os.path.exists(c.path(f"/lib/modules/{current}")):
        kernels = [current] + ([newest] if newest and newest != current else [])
    else:
        _say(f"It is likely that {current} belongs to a chroot's host")
        kernels = sorted(os.listdir(c.path("/lib/modules"))) if os.path.isdir(
            c.path("/lib/modules")) else []  # fmt: skip
        if newest and upgrade:
            kernels = [newest]
    _say("Building for " + " and ".join(kernels))
    for kernel in kernels:
        if _headers(kernel):
            build(kernel, source)
        else:
            _skipped(kernel)
    return 0


def for_kernel(kernel: str) -> int:
    """``dkms_autoinstaller start KERNEL`` after that kernel's headers are installed."""
    source = c.installed_module()
    if source is None or os.path.exists(c.path("/etc/dkms/no-autoinstall")):
        return 0
    if _headers(kernel):
        build(kernel, source)
    else:
        sys.stderr.write("dkms: WARNING: Linux headers are missing, which may explain the above "
                         f"failures.\n      please install the linux-headers-{kernel} package "
                         "to fix this.\n")  # fmt: skip
    return 0


def remove() -> int:
    """``dkms remove -m nvidia -v <version> --all``: this version's modules off every kernel."""
    source = c.installed_module()
    if source is None:
        return 0
    for module in glob.glob(c.path("/lib/modules/*/updates/dkms/nvidia.ko")):
        with open(module, "rb") as f:
            if c.module_info(f.read()).get("version") != source["version"]:
                continue
        where = os.path.dirname(module)
        for name in MODULES:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(where, f"{name}.ko"))
        _depmod(where.split("/lib/modules/", 1)[1].split("/", 1)[0])
    return 0


def main(argv: list) -> int:
    if argv[:1] == ["autoinstall"]:
        return autoinstall(argv[1] if len(argv) > 1 else "")
    if argv[:1] == ["kernel"] and len(argv) == 2:
        return for_kernel(argv[1])
    if argv[:1] == ["remove"]:
        return remove()
    sys.stderr.write(f"usage: nvidia-dkms autoinstall [OLD-VERSION] | kernel KERNEL | remove\n"
                     f"({c.SIM_NOTE})\n")  # fmt: skip
    return 2
