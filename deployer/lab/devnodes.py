"""The SIMULATED NVIDIA device nodes of a lab GPU host (``/dev/nvidia0`` ... and
``/dev/nvidiactl``), made at every boot by a oneshot unit the lab writes into the host's root.

systemd-nspawn gives each host a fresh ``/dev`` (a tmpfs), so files put in the root filesystem's
``/dev`` are hidden; the nodes are made inside the host instead, from a tmpfiles.d-format list
the unit hands to ``systemd-tmpfiles``. Numbers are the NVIDIA driver's: character major 195,
minor N for GPU N, 255 for the control device. No kernel driver answers them (opening one fails
with ENXIO, as on a host whose module is not loaded); what needs them is what only looks at them:
Slurm's ``gres.conf`` ``File=`` entries (with ``Count`` only, slurmd reports 0 GPUs and the node
goes INVAL). Lab only; the GPU simulation itself (``deployer.lab.gpusim``) is not involved.
"""

from __future__ import annotations

from pathlib import Path

from deployer.lab import boot_units

NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
UNIT = "gpumon-lab-nvidia-devices.service"
LIST = "usr/lib/gpumon-lab/nvidia-devices.conf"


def gpu_device(index: int) -> str:
    return f"/dev/nvidia{index}"


def tmpfiles_lines(gpu_count: int) -> str:
    """tmpfiles.d lines for ``gpu_count`` GPUs and the control device (mode 0666, as
    nvidia-modprobe makes them)."""
    lines = ["# SIMULATED NVIDIA device nodes (gpumon-deploy lab): no driver behind them"]
    lines += [f"c {gpu_device(i)} 0666 root root - {NVIDIA_MAJOR}:{i}" for i in range(gpu_count)]
    lines.append(f"c /dev/nvidiactl 0666 root root - {NVIDIA_MAJOR}:{NVIDIACTL_MINOR}")
    return "\n".join(lines) + "\n"


def unit_text() -> str:
    return (
        "[Unit]\n"
        "Description=SIMULATED NVIDIA device nodes (gpumon-deploy lab)\n"
        "DefaultDependencies=no\n"
        "Before=sysinit.target slurmd.service\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        f"ExecStart=/usr/bin/systemd-tmpfiles --create /{LIST}\n"
        "\n"
        "[Install]\n"
        "WantedBy=sysinit.target\n"
    )


def prepare_root(root: Path, gpu_count: int) -> None:
    """Write the node list and the unit (enabled) into a GPU host's root before it boots."""
    root = Path(root)
    listing = root / LIST
    listing.parent.mkdir(parents=True, exist_ok=True)
    listing.write_text(tmpfiles_lines(gpu_count))
    boot_units.install(root, UNIT, unit_text())
