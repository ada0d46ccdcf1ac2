"""A SIMULATED GPU host's PCI bus: its GPUs and NVSwitches as ``/sys/bus/pci/devices`` shows
them, before any NVIDIA package is installed, as on bare metal.

The product's facts read every function's ``vendor``, ``class`` and ``device`` there
(deployer/facts.py): a host without a working driver is identified by its GPUs' PCI device ids
(the matrix's ``pci_ids``). A nspawn host shows the machine's own sysfs, so a boot unit of the
host (``gpusim-pci-bus.service``, written into its root with the hardware, not by a package)
makes ``/run/gpusim/pci-devices`` with one directory per function and bind-mounts it over
``/sys/bus/pci/devices``, as ``gpusim-nvidia-module.service`` does for ``/proc/driver``. Each
function is a directory of the three files (sysfs has links to ``/sys/devices/pci*`` there; the
facts read through either). A host bridge that is not NVIDIA's is listed too, as every real bus
has one, so that the facts' vendor filter is exercised.

Values as the kernel prints them (``0x`` and lowercase hex, one line): vendor ``0x10de``; a GPU's
class ``0x030200`` (3D controller), its device id the model's (``models.py``, from the captures'
``Device Id``); an NVSwitch's class ``0x068000``. The NVSwitch's device id and the host bridge's
ids are not in any capture: ``docs/unverified.md#gpusim-pci-bus`` (the product reads neither).
Lab only, never a product default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deployer.lab import boot_units

UNIT = "gpusim-pci-bus.service"
SCRIPT = "usr/lib/gpusim/pci-bus"
BUS_DIR = "/run/gpusim/pci-devices"
SYSFS_DEVICES = "/sys/bus/pci/devices"
NVIDIA = "0x10de"
GPU_CLASS = "0x030200"  # 3D controller
NVSWITCH_CLASS = "0x068000"  # bridge, other
NVSWITCH_DEVICE = "0x22a3"  # unverified: docs/unverified.md#gpusim-pci-bus
HOST_BRIDGE = ("0000:00:00.0", "0x8086", "0x060000", "0x09a2")  # unverified, not NVIDIA's


def sysfs_address(bus_id: str) -> str:
    """nvidia-smi's ``00000000:18:00.0`` as sysfs names it: ``0000:18:00.0`` (16-bit domain,
    lowercase)."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def functions(hardware: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """``(address, vendor, class, device)`` of every PCI function of the host, by address."""
    out = [HOST_BRIDGE]
    for g in hardware["gpus"]:
        device = f"0x{str(g['pci_device_id']).lower()}"
        out.append((sysfs_address(g["pci_bus_id"]), NVIDIA, GPU_CLASS, device))
    for s in hardware.get("nvswitches") or []:
        out.append((sysfs_address(s["pci_bus_id"]), NVIDIA, NVSWITCH_CLASS, NVSWITCH_DEVICE))
    return sorted(out)


def bus_script(hardware: dict[str, Any]) -> str:
    """The boot script: the functions made under ``BUS_DIR``, mounted over ``SYSFS_DEVICES``."""
    lines = [
        "#!/bin/sh",
        "# SIMULATED PCI bus of a gpumon-deploy lab host (deployer/lab/gpusim/pci.py): no GPU here",
        "set -eu",
        f"d={BUS_DIR}",
        f"bus={SYSFS_DEVICES}",
        'if mountpoint -q "$bus"; then umount "$bus"; fi',
        'rm -rf "$d"',
        'mkdir -p "$d"',
        "fn() {",
        '  mkdir "$d/$1"',
        '  echo "$2" > "$d/$1/vendor"; echo "$3" > "$d/$1/class"; echo "$4" > "$d/$1/device"',
        "}",
    ]
    lines += [f"fn {a} {v} {c} {dev}" for a, v, c, dev in functions(hardware)]
    lines.append('mount --bind "$d" "$bus"')
    return "\n".join(lines) + "\n"


def unit_text() -> str:
    return (
        "# SIMULATED unit of the gpumon-deploy lab: the host's PCI bus (deployer/lab/gpusim/pci.py)\n"
        "[Unit]\n"
        "Description=SIMULATED PCI functions of the host's GPUs (gpumon-deploy lab)\n"
        "DefaultDependencies=no\n"
        "After=local-fs.target\n"
        "Before=sysinit.target\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        f"ExecStart=/bin/sh /{SCRIPT}\n"
        "\n"
        "[Install]\n"
        "WantedBy=sysinit.target\n"
    )


def prepare_root(root: Path, hardware: dict[str, Any]) -> None:
    """Write the bus script and its unit (enabled) into a GPU host's root before it boots."""
    root = Path(root)
    script = root / SCRIPT
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(bus_script(hardware))
    script.chmod(0o755)
    boot_units.install(root, UNIT, unit_text())
