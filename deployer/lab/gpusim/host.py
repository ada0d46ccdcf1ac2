"""A SIMULATED GPU host's side of the lab: the hardware description written into its root
filesystem before boot, and the systemd-nspawn arguments it needs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from deployer.lab.gpusim.faults import empty_state, hardware_path, state_path

README = """SIMULATED GPU host (gpumon-deploy lab).
This machine has no GPU. hardware.json describes the GPUs the simulated NVIDIA packages
(nvidia-smi, nv-hostengine/dcgmi, dcgm-exporter) report; /var/lib/gpusim/state.json holds the
faults the lab injects ("gpumon-deploy lab fault/heal"). Lab only, never a product default.
"""


def _check(hardware: dict) -> None:
    if not isinstance(hardware, dict) or not isinstance(hardware.get("gpus"), list):
        raise ValueError("hardware must be a dict from hardware_for() with a 'gpus' list")
    for g in hardware["gpus"]:
        missing = {"index", "uuid", "name", "pci_bus_id", "memory_total_mib"} - set(g)
        if missing:
            raise ValueError(f"GPU entry lacks {sorted(missing)}: {g!r}")


def prepare_root(root: Path, hardware: dict) -> None:
    """Write the host's simulated GPUs into ``root`` (its root filesystem, before boot).

    Writes ``/etc/gpusim/hardware.json`` (replaced every time) and creates an empty fault state
    ``/var/lib/gpusim/state.json`` if there is none (an existing one, with its faults, is kept).
    """
    _check(hardware)
    root = Path(root)
    hw = hardware_path(root)
    hw.parent.mkdir(parents=True, exist_ok=True)
    tmp = hw.with_name(f".{hw.name}.tmp")
    tmp.write_text(json.dumps(hardware, indent=1, sort_keys=True) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, hw)
    (hw.parent / "README").write_text(README)
    st = state_path(root)
    if not st.exists():
        st.parent.mkdir(parents=True, exist_ok=True)
        st.write_text(json.dumps(empty_state(), indent=1, sort_keys=True) + "\n")


def nspawn_args(host_dir: Path) -> list[str]:
    """Extra ``systemd-nspawn`` arguments a simulated GPU host needs: none.

    ``/proc/driver/nvidia`` is made inside the host: the simulated module's boot unit
    (``gpusim-nvidia-module.service``) bind-mounts ``/run/gpusim/proc-driver`` over
    ``/proc/driver``, which nspawn's default capabilities allow. Since /run is a tmpfs, the loaded
    module is forgotten on reboot, as a real one is. The same unit works on a Vagrant VM.
    """
    del host_dir
    return []
