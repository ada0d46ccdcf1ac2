"""Simulated GPU hardware: the model table and the deterministic per-host GPU description.

SIMULATED -- lab only. The names, memory sizes and architectures are what ``nvidia-smi`` prints on
the real products; everything else (UUIDs, serials, bus ids) is derived from the host name so a
host looks the same on every ``lab up``.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

from deployer.errors import InputError

#: Namespace for the UUIDs of simulated GPUs (uuid5 of "gpumon-lab-gpusim").
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "gpusim.gpumon-lab.invalid")

#: PCI bus numbers of the eight GPU slots of an HGX baseboard, in nvidia-smi index order.
_HGX_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
#: PCI bus numbers of the NVSwitches of an HGX baseboard.
_NVSWITCH_BUSES = ("05", "06", "07", "08")


@dataclass(frozen=True)
class GpuModel:
    """One GPU product as nvidia-smi and DCGM describe it."""

    short: str  # inventory gpu_model
    name: str  # nvidia-smi "name"
    memory_mib: int  # nvidia-smi memory.total
    architecture: str
    compute_cap: str
    device_id: str  # PCI device id (DCGM "GPU Device IDs Detected")
    power_limit_w: int
    pcie_gen: int
    mig_capable: bool
    row_remap: bool  # Ampere+ row remapping (else page retirement)
    slowdown_temp: int
    shutdown_temp: int
    mem_max_op_temp: int
    gpu_max_op_temp: int
    max_sm_clock: int
    mem_clock: int
    vbios: str


MODELS: dict[str, GpuModel] = {
    m.short: m
    for m in (
        GpuModel("H100", "NVIDIA H100 80GB HBM3", 81559, "Hopper", "9.0", "2330", 700, 5,
                 True, True, 87, 92, 95, 87, 1980, 2619, "96.00.99.00.01"),
        GpuModel("H200", "NVIDIA H200", 143771, "Hopper", "9.0", "2335", 700, 5,
                 True, True, 87, 92, 95, 87, 1980, 3201, "96.00.A5.00.01"),
        GpuModel("A100", "NVIDIA A100-SXM4-80GB", 81920, "Ampere", "8.0", "20B2", 400, 4,
                 True, True, 89, 92, 95, 87, 1410, 1593, "92.00.45.00.03"),
        GpuModel("V100", "Tesla V100-SXM2-32GB", 32768, "Volta", "7.0", "1DB5", 300, 3,
                 False, False, 87, 90, 95, 83, 1530, 877, "88.00.80.00.01"),
        GpuModel("B200", "NVIDIA B200", 183359, "Blackwell", "10.0", "2901", 1000, 5,
                 True, True, 88, 93, 95, 87, 1965, 3996, "97.00.4B.00.01"),
        GpuModel("GH200", "NVIDIA GH200 480GB", 97871, "Hopper", "9.0", "2342", 900, 5,
                 True, True, 87, 92, 95, 87, 1980, 2619, "96.00.74.00.01"),
        GpuModel("L40S", "NVIDIA L40S", 46068, "Ada Lovelace", "8.9", "26B9", 350, 4,
                 False, True, 88, 93, 95, 87, 2520, 9001, "95.02.66.00.02"),
        GpuModel("T4", "Tesla T4", 15360, "Turing", "7.5", "1EB8", 70, 3,
                 False, False, 85, 96, 95, 85, 1590, 5001, "90.04.96.00.02"),
    )
}  # fmt: skip

MAX_GPUS = 16


def _bus_id(index: int) -> str:
    bus = _HGX_BUSES[index] if index < len(_HGX_BUSES) else f"{0xC0 + index:02X}"
    return f"00000000:{bus}:00.0"


def _gpu_uuid(hostname: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{hostname}/gpu/{index}"))


def _serial(hostname: str, index: int) -> str:
    digest = hashlib.sha256(f"{hostname}/serial/{index}".encode()).hexdigest()
    return "1" + str(int(digest[:12], 16))[:12].rjust(12, "0")


def hardware_for(model: str, count: int, hostname: str, nvswitch: bool) -> dict:
    """The simulated GPUs of one host: same inputs, same description (UUIDs from hostname+index).

    ``model`` is the inventory's canonical short name (``H100``, ``V100``, ...). Raises
    :class:`InputError` naming the key (``gpu_model``, ``gpu_count``) on bad input.
    """
    if model not in MODELS:
        known = ", ".join(sorted(MODELS))
        raise InputError(
            f"unknown GPU model {model!r} (simulated models: {known})", key="gpu_model"
        )
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_GPUS:
        raise InputError(f"must be an integer from 1 to {MAX_GPUS}, got {count!r}", key="gpu_count")
    if not hostname or not isinstance(hostname, str):
        raise InputError("a host name is required", key="hostname")
    m = MODELS[model]
    gpus = []
    for index in range(count):
        gpus.append(
            {
                "index": index,
                "uuid": _gpu_uuid(hostname, index),
                "name": m.name,
                "memory_total_mib": m.memory_mib,
                "pci_bus_id": _bus_id(index),
                "pci_device_id": m.device_id,
                "architecture": m.architecture,
                "compute_cap": m.compute_cap,
                "serial": _serial(hostname, index),
                "vbios_version": m.vbios,
                "power_limit_w": m.power_limit_w,
                "pcie_gen": m.pcie_gen,
                "pcie_width": 16,
                "mig_capable": m.mig_capable,
                "row_remap": m.row_remap,
                "slowdown_temp": m.slowdown_temp,
                "shutdown_temp": m.shutdown_temp,
                "mem_max_op_temp": m.mem_max_op_temp,
                "gpu_max_op_temp": m.gpu_max_op_temp,
                "max_sm_clock": m.max_sm_clock,
                "mem_clock": m.mem_clock,
            }
        )
    switches = []
    if nvswitch:
        for i, bus in enumerate(_NVSWITCH_BUSES):
            switches.append({"index": i, "pci_bus_id": f"00000000:{bus}:00.0"})
    return {
        "simulated": True,
        "hostname": hostname,
        "model": model,
        "count": count,
        "nvswitch": bool(nvswitch),
        "gpus": gpus,
        "nvswitches": switches,
    }
