"""Simulated GPU hardware: the model catalog and the deterministic per-host GPU description.

SIMULATED -- lab only. Every constant of a model comes from a real capture where one exists (the
``source`` of each model names it; paths are under ``../shared/gpu_reality_fixtures/``) and the
constants no capture shows are listed in ``unverified`` (``docs/unverified.md#gpusim-models``).
UUIDs, serials and bus ids are derived from the host name so a host looks the same on every
``lab up``.

MIG: the GPU instance (GI) profiles of a model are the ones a capture shows with their memory,
BAR1, SM and engine counts; a layout the captures cannot back (another profile, a GI that would
not fit) is refused. GPU instance ids follow NVML's placement ids as the captures show them
(``nvidia_gpu_exporter/linux-x86_64__nvidia-h100-mig__590.48.01.txt``: 3g.40gb, 2g.20gb, 1g.10gb,
1g.10gb created in that order get GI 2, 3, 9, 10; ``telegraf/a100-sxm4-v12.xml``: four 2g.20gb get
GI 3, 4, 5, 6).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from typing import Any

from deployer.errors import InputError

#: Namespace for the UUIDs of simulated GPUs (uuid5 of "gpumon-lab-gpusim").
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "gpusim.gpumon-lab.invalid")

#: PCI bus numbers of the eight GPU slots of an HGX baseboard, in nvidia-smi index order.
_HGX_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
#: PCI bus numbers of the NVSwitches of an HGX baseboard.
_NVSWITCH_BUSES = ("05", "06", "07", "08")

FIX = "gpu_reality_fixtures/"
H100_590 = FIX + "nvidia_gpu_exporter/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
H100_MIG_590 = FIX + "nvidia_gpu_exporter/linux-x86_64__nvidia-h100-mig__590.48.01.txt"
H200_590 = FIX + "nvidia_gpu_exporter/linux-x86_64__nvidia-h200__590.48.01.txt"
H200_MIG_590 = FIX + "nvidia_gpu_exporter/linux-x86_64__nvidia-h200-mig__590.48.01.txt"
L40S_595 = FIX + "nvidia_gpu_exporter/linux-x86_64__nvidia-l40s__595.80.txt"
A100_535 = FIX + "telegraf/a100-sxm4-v12.xml"
A10G_515 = FIX + "telegraf/a10g.xml"
T4_515 = FIX + "telegraf/tesla-t4.xml"
P100_510 = FIX + "netdata_go.d.plugin/tesla-p100.xml"
A800_SCRAPE = FIX + "dcgm-exporter-metrics/a800_mig_535.129.03_excerpt.metrics"
L40S_SCRAPE = FIX + "dcgm-exporter-metrics/l40s_595.58.03_default-counters.metrics"


@dataclass(frozen=True)
class MigProfile:
    """A GPU instance profile as nvidia-smi -q / -L show it (``MIG Device`` blocks)."""

    name: str  # "3g.40gb"
    slices: int  # memory slices of the 8 the GPU has (7g uses all 8)
    memory_mib: int  # "Shared FB Memory Usage / Total"
    bar1_mib: int  # "Shared BAR1 Memory / Total"
    ce: int
    enc: int
    dec: int
    ofa: int
    jpg: int
    #: SM count of a compute instance of ``c`` compute slices; the key ``slices``-ish "whole"
    #: entry is the GI as one compute instance. Only sizes a capture shows are present.
    ci_sm: dict[int, int] = field(default_factory=dict)
    source: str = ""

    @property
    def g(self) -> int:
        return int(self.name.split("g.", 1)[0])


@dataclass(frozen=True)
class GpuModel:
    """One GPU product as nvidia-smi and DCGM describe it."""

    short: str  # inventory gpu_model
    name: str  # nvidia-smi "name", exactly
    memory_mib: int  # memory.total on the simulated driver releases (R535 and newer)
    reserved_mib: int  # memory.reserved
    architecture: str  # -q "Product Architecture"
    compute_cap: str
    device_id: str  # PCI device id, 4 hex digits (pci.device_id 0x<id>10DE)
    subsystem_id: str | None  # PCI sub system id, 4 hex digits, None: N/A
    brand: str  # -q "Product Brand" / DCGM_FI_DEV_BRAND
    power_limit_w: int  # default = enforced power limit
    power_min_w: int
    pcie_gen: int
    bar1_mib: int
    row_remap: bool  # Ampere+ row remapping (else page retirement)
    memory_sensor: bool  # False: nvidia-smi memory temperature N/A, DCGM MEMORY_TEMP 0
    gpu_max_op_temp: int | None  # "GPU Max Operating Temp" (the T.Limit of R590), None: N/A
    slowdown_temp: int
    shutdown_temp: int
    mem_max_op_temp: int | None  # None: N/A
    max_sm_clock: int
    max_mem_clock: int
    max_video_clock: int
    idle_sm_clock: int
    idle_mem_clock: int
    idle_video_clock: int
    vbios: str
    board_part: str  # "N/A" where no capture shows it
    gpu_part: str
    inforom_img: str
    inforom_oem: str
    inforom_ecc: str
    nvlink: bool
    fan: bool  # False: fan.speed [N/A]
    mig_profiles: tuple[MigProfile, ...] = ()
    source: str = ""
    unverified: tuple[str, ...] = ()

    @property
    def mig_capable(self) -> bool:
        return self.short in MIG_CAPABLE

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)


#: Models that have MIG (nvidia-smi prints mig.mode Enabled/Disabled, not [N/A]).
MIG_CAPABLE = frozenset({"A100", "A800", "A30", "H100", "H800", "H200", "H20", "GH200", "B200"})

_H100_MIG = (
    MigProfile("3g.40gb", 4, 40448, 24739, 3, 0, 3, 0, 3, {3: 60}, H100_MIG_590),
    MigProfile("2g.20gb", 2, 20096, 12369, 2, 0, 2, 0, 2, {2: 32}, H100_MIG_590),
    MigProfile("1g.10gb", 1, 9984, 6184, 1, 0, 1, 0, 1, {1: 16}, H100_MIG_590),
)
_H200_MIG = (
    # the capture splits 3g.71gb into a 1c (16 SMs) and a 2c (32 SMs) compute instance; as one
    # compute instance it has 60 SMs (the R580 and R610 MIG captures, proposed for ../shared:
    # tests/reality.py PROPOSED)
    MigProfile("3g.71gb", 4, 71424, 59237, 3, 0, 3, 0, 3, {1: 16, 2: 32, 3: 60}, H200_MIG_590),
    MigProfile("2g.35gb", 2, 33280, 29618, 2, 0, 2, 0, 2, {2: 32}, H200_MIG_590),
    MigProfile("1g.18gb", 1, 16384, 14809, 1, 0, 1, 0, 1, {1: 16}, H200_MIG_590),
)
_A100_MIG = (MigProfile("2g.20gb", 2, 19968, 32767, 1, 0, 1, 0, 0, {2: 14}, A100_535),)

# fmt: off
MODELS: dict[str, GpuModel] = {m.short: m for m in (
    GpuModel("H100", "NVIDIA H100 80GB HBM3", 81559, 479, "Hopper", "9.0", "2330", "16C1", "NVIDIA",
             700, 200, 5, 131072, True, True, 87, 89, 95, 95, 1980, 2619, 1545, 345, 2619, 765,
             "96.00.A5.00.01", "692-2G520-0200-000", "2330-885-A1", "G520.0200.00.05", "2.1", "7.16",
             nvlink=True, fan=False, mig_profiles=_H100_MIG,
             source=f"{H100_590} (-q T.Limit: max op 41+46, slowdown -2, shutdown -8); {H100_MIG_590}",
             unverified=("mem_max_op_temp",)),
    GpuModel("H200", "NVIDIA H200", 143771, 614, "Hopper", "9.0", "2335", "18BE", "NVIDIA",
             700, 200, 5, 262144, True, True, 87, 89, 95, 95, 1980, 3201, 1545, 345, 3201, 765,
             "96.00.A5.00.03", "695-2G520-0280-001", "2335-895-A1", "G520.0280.02.02", "2.1", "7.16",
             nvlink=True, fan=False, mig_profiles=_H200_MIG,
             source=f"{H200_590} (-q T.Limit: max op 28+59); {H200_MIG_590}",
             unverified=("mem_max_op_temp",)),
    GpuModel("H800", "NVIDIA H800", 81559, 479, "Hopper", "9.0", "2324", None, "NVIDIA",
             700, 200, 5, 131072, True, True, 87, 89, 95, 95, 1980, 2619, 1545, 345, 2619, 765,
             "N/A", "N/A", "N/A", "N/A", "N/A", "N/A", nvlink=True, fan=False, mig_profiles=_H100_MIG,
             source="name: dcgmi discovery -l of 8x H800 (SOURCES.md, index id 19450127953); "
                    "everything else as the H100 SXM it derives from",
             unverified=("memory_mib", "reserved_mib", "device_id", "power_limit_w", "temperatures",
                         "clocks", "mig_profiles")),
    GpuModel("A100", "NVIDIA A100-SXM4-80GB", 81920, 869, "Ampere", "8.0", "20B2", "147F", "NVIDIA",
             500, 100, 4, 131072, True, True, 85, 89, 92, 95, 1410, 1593, 1290, 210, 1593, 585,
             "92.00.36.00.02", "692-2G506-0212-002", "20B2-895-A1", "G506.0212.00.01", "2.0", "6.16",
             nvlink=True, fan=False, mig_profiles=_A100_MIG, source=A100_535,
             unverified=("idle_sm_clock", "idle_video_clock")),
    GpuModel("A800", "NVIDIA A800-SXM4-80GB", 81920, 869, "Ampere", "8.0", "20F3", None, "NVIDIA",
             400, 100, 4, 131072, True, True, 85, 89, 92, 95, 1410, 1593, 1290, 210, 1593, 585,
             "N/A", "N/A", "N/A", "N/A", "N/A", "N/A", nvlink=True, fan=False, mig_profiles=_A100_MIG,
             source=f"name, MIG 2g.20gb per GI (FB_FREE+USED 19967 MiB): {A800_SCRAPE}; the rest "
                    "as the A100-SXM4-80GB it derives from",
             unverified=("reserved_mib", "device_id", "power_limit_w", "temperatures", "clocks")),
    GpuModel("L40S", "NVIDIA L40S", 46068, 609, "Ada Lovelace", "8.9", "26B9", "1851", "NVIDIA",
             350, 100, 4, 65536, True, False, 88, 90, 93, None, 2520, 9001, 1965, 210, 405, 1965,
             "95.02.66.00.02", "900-2G133-0080-000", "26B9-896-A1", "G133.0242.00.03", "2.1", "6.16",
             nvlink=False, fan=False,
             source=f"{L40S_595} (memory temperature N/A, T.Limit 64+24, slowdown -2, shutdown -5); "
                    f"idle clocks 210/405 MHz and MEMORY_TEMP 0: {L40S_SCRAPE}",
             unverified=("idle_video_clock",)),
    # key "A10": the product's compat matrix treats the A10G (AWS's A10) as an A10
    GpuModel("A10", "NVIDIA A10G", 23028, 435, "Ampere", "8.6", "2237", None, "NVIDIA",
             300, 100, 4, 32768, True, False, 88, 95, 98, None, 1710, 6251, 1500, 210, 405, 555,
             "94.02.75.00.01", "N/A", "N/A", "G133.0210.00.04", "2.0", "6.16", nvlink=False, fan=True,
             source=f"{A10G_515} (R515; its PCI ids read 000000DE there)",
             unverified=("device_id", "memory_mib on R535+")),
    GpuModel("T4", "Tesla T4", 15109, 388, "Turing", "7.5", "1EB8", "12A2", "NVIDIA",
             70, 60, 3, 256, False, False, 85, 93, 96, None, 1590, 5001, 1470, 300, 405, 540,
             "90.04.84.00.06", "N/A", "900-2G183-0000-001", "G183.0200.00.02", "1.1", "5.0",
             nvlink=False, fan=False,
             source=f"{T4_515}; memory.total 15109 MiB on R535: NVIDIA/cloud-native-docs "
                    "container-toolkit/output/nvidia-smi.txt @8db0030 (SOURCES.md)",
             unverified=("reserved_mib on R535+", "idle clocks")),
    GpuModel("P100", "Tesla P100-PCIE-16GB", 16384, 103, "Pascal", "6.0", "15F8", "118F", "Tesla",
             250, 125, 3, 16384, False, False, None, 82, 85, None, 1328, 715, 1328, 405, 715, 835,
             "86.00.52.00.02", "N/A", "900-2H400-6300-031", "H400.0201.00.08", "1.1", "4.1",
             nvlink=False, fan=False, source=P100_510),
    GpuModel("V100", "Tesla V100-SXM2-32GB", 32768, 255, "Volta", "7.0", "1DB5", "1249", "NVIDIA",
             300, 150, 3, 32768, False, True, 83, 87, 90, 95, 1530, 877, 1372, 135, 877, 555,
             "88.00.80.00.01", "N/A", "N/A", "G503.0203.00.05", "1.1", "5.0", nvlink=True, fan=False,
             source="name, 32768MiB on R525/R530 tables (SOURCES.md, index ids 26177832817, "
                    "10876193011)",
             unverified=("reserved_mib", "temperatures", "power", "clocks", "vbios")),
    GpuModel("B200", "NVIDIA B200", 183359, 1000, "Blackwell", "10.0", "2901", None, "NVIDIA",
             1000, 200, 5, 262144, True, True, 87, 89, 95, 95, 1965, 3996, 1800, 345, 3996, 765,
             "97.00.4B.00.01", "N/A", "N/A", "N/A", "N/A", "N/A", nvlink=True, fan=False,
             source="no capture", unverified=("everything but the name",)),
    GpuModel("GH200", "NVIDIA GH200 480GB", 97871, 600, "Hopper", "9.0", "2342", None, "NVIDIA",
             900, 200, 5, 131072, True, True, 87, 89, 95, 95, 1980, 2619, 1545, 345, 2619, 765,
             "96.00.74.00.01", "N/A", "N/A", "N/A", "N/A", "N/A", nvlink=True, fan=False,
             source="no capture", unverified=("everything but the name",)),
)}
# fmt: on

MAX_GPUS = 16
#: Memory slices of the A100/H100/H200 family (a 7g profile uses all eight).
MIG_SLICES = 8


def _bus_id(index: int) -> str:
    bus = _HGX_BUSES[index] if index < len(_HGX_BUSES) else f"{0xC0 + index:02X}"
    return f"00000000:{bus}:00.0"


def _gpu_uuid(hostname: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{hostname}/gpu/{index}"))


def _mig_uuid(hostname: str, index: int, gi: int, ci: int) -> str:
    return "MIG-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{hostname}/gpu/{index}/gi/{gi}/ci/{ci}"))


def _serial(hostname: str, index: int) -> str:
    digest = hashlib.sha256(f"{hostname}/serial/{index}".encode()).hexdigest()
    return "1" + str(int(digest[:12], 16))[:12].rjust(12, "0")


def _placements(profile: MigProfile) -> list[tuple[int, int]]:
    """(first memory slice, GPU instance id) of each placement, in the order NVML tries them.

    Ids: 7g -> 0, 4g -> 1, 3g -> 1 (slices 0-3) / 2 (slices 4-7), 2g -> 3..6, 1g -> 7..14. NVML
    puts a 3g instance on slices 4-7 first (GI 2 in both Hopper captures) and the smaller ones
    from slice 0 up (2g.20gb at GI 3, then 1g at GI 9 and 10; four 2g.20gb at GI 3-6 on A100).
    """
    g = profile.g
    if g >= 7:
        return [(0, 0)]
    if g == 4:
        return [(0, 1)]
    if g == 3:
        return [(4, 2), (0, 1)]
    if g == 2:
        return [(s, 3 + s // 2) for s in (0, 2, 4, 6)]
    return [(s, 7 + s) for s in range(MIG_SLICES)]


def _mig_entry(raw: Any, where: str) -> tuple[str, list[int] | None]:
    if isinstance(raw, str):
        return raw, None
    if isinstance(raw, dict) and set(raw) <= {"profile", "compute_instances"} and "profile" in raw:
        cis = raw.get("compute_instances")
        if cis is None:
            return str(raw["profile"]), None
        if not isinstance(cis, list) or not cis:
            raise InputError(f"{where}: compute_instances is a list like [1c, 2c]", key="mig")
        sizes = []
        for ci in cis:
            text = str(ci)
            if not (text.endswith("c") and text[:-1].isdigit()):
                raise InputError(f"{where}: compute instance {ci!r} is not like '1c'", key="mig")
            sizes.append(int(text[:-1]))
        return str(raw["profile"]), sizes
    raise InputError(
        f"{where}: a GPU instance is a profile name (e.g. 3g.40gb) or "
        "{profile: 3g.71gb, compute_instances: [1c, 2c]}",
        key="mig",
    )


def mig_layout(
    model: GpuModel, entries: list[Any], hostname: str, index: int
) -> list[dict[str, Any]]:
    """The GPU instances of one MIG GPU, placed as NVML places them; InputError (key ``mig``)
    for a profile the model's captures do not show or a layout that does not fit."""
    where = f"GPU {index} ({model.name})"
    if not model.mig_profiles:
        raise InputError(f"{where}: this simulated model has no MIG profile", key="mig")
    used: set[int] = set()
    taken_ids: set[int] = set()
    instances = []
    for raw in entries:
        name, ci_sizes = _mig_entry(raw, where)
        profile = model.profile(name)
        if profile is None:
            known = ", ".join(p.name for p in model.mig_profiles)
            raise InputError(
                f"{where}: MIG profile {name!r} is not simulated (the captures show: {known})",
                key="mig",
            )
        sizes = ci_sizes or [profile.g]
        for size in sizes:
            if size not in profile.ci_sm:
                shown = ", ".join(f"{c}c" for c in sorted(profile.ci_sm))
                raise InputError(
                    f"{where}: {name} as a {size}c compute instance is not in any capture "
                    f"(shown: {shown})",
                    key="mig",
                )
        if sum(sizes) > profile.g:
            raise InputError(f"{where}: compute instances exceed {name}", key="mig")
        spot = None
        for start, gi in _placements(profile):
            span = set(range(start, start + min(profile.slices, MIG_SLICES - start)))
            if not span & used and gi not in taken_ids:
                spot = (span, gi)
                break
        if spot is None:
            raise InputError(f"{where}: no room left for a {name} GPU instance", key="mig")
        used |= spot[0]
        taken_ids.add(spot[1])
        cis = []
        for ci_id, size in enumerate(sizes):
            cis.append(
                {
                    "ci_id": ci_id,
                    "profile": name if size == profile.g else f"{size}c.{name}",
                    "sm": profile.ci_sm[size],
                    "uuid": _mig_uuid(hostname, index, spot[1], ci_id),
                }
            )
        instances.append(
            {
                "gi_id": spot[1],
                "profile": name,
                "memory_mib": profile.memory_mib,
                "bar1_mib": profile.bar1_mib,
                "ce": profile.ce,
                "enc": profile.enc,
                "dec": profile.dec,
                "ofa": profile.ofa,
                "jpg": profile.jpg,
                "compute_instances": cis,
            }
        )
    instances.sort(key=lambda gi: gi["gi_id"])
    device = 0
    for gi in instances:
        for ci in gi["compute_instances"]:
            ci["device"] = device
            device += 1
    return instances


def _mig_for(mig: Any, index: int) -> list[Any] | None:
    if mig is None:
        return None
    if isinstance(mig, list):
        return mig
    if isinstance(mig, dict):
        value = mig.get(index, mig.get(str(index)))
        return None if value is None else list(value)
    raise InputError("mig is a list of GPU instance profiles or a mapping GPU index -> list",
                     key="mig")  # fmt: skip


def hardware_for(
    model: str, count: int, hostname: str, nvswitch: bool, mig: Any = None
) -> dict[str, Any]:
    """The simulated GPUs of one host: same inputs, same description (UUIDs from hostname+index).

    ``model`` is the inventory's canonical short name (``H100``, ``V100``, ...). ``mig`` puts
    GPUs in MIG mode: a list of GPU instance profiles for every GPU, or a mapping from GPU index
    to such a list (GPUs not named keep MIG off). Raises :class:`InputError` naming the key
    (``gpu_model``, ``gpu_count``, ``mig``) on bad input.
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
    if isinstance(mig, dict):
        for key in mig:
            if str(key) not in {str(i) for i in range(count)}:
                raise InputError(f"no GPU {key} on this host (0-{count - 1})", key="mig")
    if mig is not None and not m.mig_capable:
        raise InputError(f"{m.name} has no MIG", key="mig")
    gpus = []
    for index in range(count):
        layout = _mig_for(mig, index)
        gpus.append(
            {
                "index": index,
                "uuid": _gpu_uuid(hostname, index),
                "name": m.name,
                "model": m.short,
                "memory_total_mib": m.memory_mib,
                "memory_reserved_mib": m.reserved_mib,
                "pci_bus_id": _bus_id(index),
                "pci_device_id": m.device_id,
                "pci_subsystem_id": m.subsystem_id,
                "architecture": m.architecture,
                "compute_cap": m.compute_cap,
                "brand": m.brand,
                "serial": _serial(hostname, index),
                "vbios_version": m.vbios,
                "board_part": m.board_part,
                "gpu_part": m.gpu_part,
                "inforom": {"img": m.inforom_img, "oem": m.inforom_oem, "ecc": m.inforom_ecc},
                "power_limit_w": m.power_limit_w,
                "power_min_w": m.power_min_w,
                "pcie_gen": m.pcie_gen,
                "pcie_width": 16,
                "bar1_mib": m.bar1_mib,
                "mig_capable": m.mig_capable,
                "mig": None if layout is None else mig_layout(m, layout, hostname, index),
                "row_remap": m.row_remap,
                "memory_sensor": m.memory_sensor,
                "nvlink": m.nvlink,
                "fan": m.fan,
                "slowdown_temp": m.slowdown_temp,
                "shutdown_temp": m.shutdown_temp,
                "mem_max_op_temp": m.mem_max_op_temp,
                "gpu_max_op_temp": m.gpu_max_op_temp,
                "max_sm_clock": m.max_sm_clock,
                "mem_clock": m.max_mem_clock,
                "max_video_clock": m.max_video_clock,
                "idle_sm_clock": m.idle_sm_clock,
                "idle_mem_clock": m.idle_mem_clock,
                "idle_video_clock": m.idle_video_clock,
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
