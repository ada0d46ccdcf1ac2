"""dcgm-exporter's metrics CSV, generated from named field groups chosen in the inventory.

Owns the field catalogue (every field: DCGM name, Prometheus type, help text, DCGM field id, cited
to the technical reference ``shared/reference/dcgm-exporter.md``), the named groups, and the CSV
rendering (format of dcgm-exporter.md §4: ``field, type, help``, ``#`` comments, exactly two
commas per line, types ``gauge``/``counter``/``label``).

Inventory variables read (through :func:`csv_from_vars`):

``dcgm_exporter_field_groups``
    Names of groups (default :data:`DEFAULT_GROUPS`). ``profiling`` is opt-in: the DCP metrics
    make nv-hostengine run the GPUs' performance counters continuously, which costs overhead on
    busy GPUs and cannot run at the same time as other profilers (Nsight, CUPTI); upstream enables
    five of them by default (dcgm-exporter.md §4.1), gpumon-deploy does not.
``dcgm_exporter_extra_fields``
    More fields: a list of ``{field: DCGM_FI_..., type: gauge|counter|label, help: "..."}``.

Public API: ``FIELDS``, ``GROUPS``, ``DEFAULT_GROUPS``, ``render_csv(groups, extra=())``,
``csv_from_vars(variables)`` (``InputError`` naming the key on a bad value).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deployer.errors import InputError

TYPES = ("gauge", "counter", "label")
_NAME = re.compile(r"^DCGM_(FI|EXP)_[A-Z0-9_]+$")


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    help: str
    field_id: int | None  # None for metrics dcgm-exporter computes itself (DCGM_EXP_*)
    source: str


_S41 = "dcgm-exporter.md §4.1 default-counters.csv [X3][F1]"
_S42 = "dcgm-exporter.md §4.2 commented-out counters [X3]"
_SOTHER = "dcgm-exporter.md §4.2 'Other useful DCGM fields' [F1]"

_CATALOGUE: tuple[Field, ...] = (
    # §4.1: enabled by default upstream (4.5.3-4.8.2), profiling fields excepted
    Field("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", 100, _S41),
    Field("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", 101, _S41),
    Field("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", 140, _S41),
    Field("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", 150, _S41),
    Field("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", 155, _S41),
    Field(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        156,
        _S41,
    ),
    Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", 202, _S41),
    Field("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", 203, _S41),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", 204, _S41),
    Field("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", 206, _S41),
    Field("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", 207, _S41),
    Field("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", 230, _S41),
    Field("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", 251, _S41),
    Field("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", 252, _S41),
    Field("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", 253, _S41),
    Field(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
        449,
        _S41,
    ),
    Field("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", 526, _S41),
    Field(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        393,
        _S41,
    ),
    Field(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        394,
        _S41,
    ),
    Field(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", 395, _S41
    ),
    Field("DCGM_FI_DRIVER_VERSION", "label", "Driver Version", 1, _S41),
    # memory temperature limit the HBM alert compares against
    Field(
        "DCGM_FI_DEV_MEM_MAX_OP_TEMP",
        "gauge",
        "Maximum operating temperature for the memory of this GPU (in C).",
        151,
        _SOTHER,
    ),
    Field("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether a row remap is pending", 396, _SOTHER),
    # exporter-computed XID count (window -x, default 300000 ms)
    Field(
        "DCGM_EXP_XID_ERRORS_COUNT",
        "counter",
        "Count of XID Errors within user-specified time window (see xid-count-window-size flag).",
        None,
        _S42,
    ),
    # ECC and page retirement (pre-Ampere)
    Field(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "counter",
        "Total number of single-bit volatile ECC errors.",
        310,
        _S42,
    ),
    Field(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "counter",
        "Total number of double-bit volatile ECC errors.",
        311,
        _S42,
    ),
    Field(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "counter",
        "Total number of single-bit persistent ECC errors.",
        312,
        _S42,
    ),
    Field(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "counter",
        "Total number of double-bit persistent ECC errors.",
        313,
        _S42,
    ),
    Field(
        "DCGM_FI_DEV_RETIRED_SBE",
        "counter",
        "Total number of retired pages due to single-bit errors.",
        390,
        _S42,
    ),
    Field(
        "DCGM_FI_DEV_RETIRED_DBE",
        "counter",
        "Total number of retired pages due to double-bit errors.",
        391,
        _S42,
    ),
    Field(
        "DCGM_FI_DEV_RETIRED_PENDING",
        "counter",
        "Total number of pages pending retirement.",
        392,
        _S42,
    ),
    # NVLink errors
    Field(
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink flow-control CRC errors.",
        409,
        _S42,
    ),
    Field(
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink data CRC errors.",
        419,
        _S42,
    ),
    Field(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink retries.",
        429,
        _S42,
    ),
    Field(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink recovery errors.",
        439,
        _S42,
    ),
    # clock events (throttling) and violation times
    Field(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "gauge",
        "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).",
        112,
        _SOTHER,
    ),
    Field(
        "DCGM_FI_DEV_POWER_VIOLATION",
        "counter",
        "Throttling duration due to power constraints (in ns).",
        240,
        _S42,
    ),
    Field(
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "counter",
        "Throttling duration due to thermal constraints (in ns).",
        241,
        _S42,
    ),
    Field(
        "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
        "counter",
        "Throttling duration due to board limit constraints (in ns).",
        243,
        _S42,
    ),
    Field(
        "DCGM_FI_DEV_RELIABILITY_VIOLATION",
        "counter",
        "Throttling duration due to reliability constraints (in ns).",
        245,
        _S42,
    ),
    # profiling (DCP): opt-in
    Field(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        1001,
        _S41,
    ),
    Field(
        "DCGM_FI_PROF_SM_ACTIVE",
        "gauge",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        1002,
        _S42,
    ),
    Field(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "gauge",
        "The ratio of number of warps resident on an SM.",
        1003,
        _S42,
    ),
    Field(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        1004,
        _S41,
    ),
    Field(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        1005,
        _S41,
    ),
    Field(
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "gauge",
        "Ratio of cycles the fp64 pipes are active.",
        1006,
        _S42,
    ),
    Field(
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "gauge",
        "Ratio of cycles the fp32 pipes are active.",
        1007,
        _S42,
    ),
    Field(
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "gauge",
        "Ratio of cycles the fp16 pipes are active.",
        1008,
        _S42,
    ),
    Field(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
        1009,
        _S41,
    ),
    Field(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
        1010,
        _S41,
    ),
    Field(
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "gauge",
        "The rate of data transmitted over NVLink (in bytes per second).",
        1011,
        _SOTHER,
    ),
    Field(
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "gauge",
        "The rate of data received over NVLink (in bytes per second).",
        1012,
        _SOTHER,
    ),
    # static information as labels: opt-in
    Field("DCGM_FI_NVML_VERSION", "label", "NVML Version", None, _S42),
    Field("DCGM_FI_DEV_BRAND", "label", "Device Brand", None, _S42),
    Field("DCGM_FI_DEV_SERIAL", "label", "Device Serial Number", None, _S42),
    Field("DCGM_FI_DEV_VBIOS_VERSION", "label", "VBIOS version of the device", None, _S42),
    Field("DCGM_FI_DEV_INFOROM_IMAGE_VER", "label", "InfoROM image version", None, _S42),
)

FIELDS: dict[str, Field] = {f.name: f for f in _CATALOGUE}

GROUPS: dict[str, tuple[str, ...]] = {
    # upstream default-counters.csv without its five DCGM_FI_PROF_* gauges (dcgm-exporter.md §4.1)
    "upstream": tuple(
        f.name for f in _CATALOGUE if f.source == _S41 and not f.name.startswith("DCGM_FI_PROF_")
    ),
    "memory_temp": ("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_MEM_MAX_OP_TEMP"),
    "xid": ("DCGM_FI_DEV_XID_ERRORS", "DCGM_EXP_XID_ERRORS_COUNT"),
    "row_remap": (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
    ),
    "ecc": (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_RETIRED_SBE",
        "DCGM_FI_DEV_RETIRED_DBE",
        "DCGM_FI_DEV_RETIRED_PENDING",
    ),
    "nvlink_errors": (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    ),
    "clock_events": (
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_POWER_VIOLATION",
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
        "DCGM_FI_DEV_RELIABILITY_VIOLATION",
    ),
    "profiling": tuple(f.name for f in _CATALOGUE if f.name.startswith("DCGM_FI_PROF_")),
    "info_labels": (
        "DCGM_FI_NVML_VERSION",
        "DCGM_FI_DEV_BRAND",
        "DCGM_FI_DEV_SERIAL",
        "DCGM_FI_DEV_VBIOS_VERSION",
        "DCGM_FI_DEV_INFOROM_IMAGE_VER",
    ),
}

# The upstream counters plus memory temperature, XID count and row remapping (the default),
# plus the ECC, NVLink-error and clock-event fields the gpumon alert rules read.
DEFAULT_GROUPS: tuple[str, ...] = (
    "upstream",
    "memory_temp",
    "xid",
    "row_remap",
    "ecc",
    "nvlink_errors",
    "clock_events",
)

HEADER = (
    "# dcgm-exporter collectors, generated by gpumon-deploy (role dcgm_exporter).\n"
    "# Local changes are overwritten. Format: DCGM field, Prometheus metric type, help message.\n"
)


def render_csv(groups: Sequence[str], extra: Iterable[Field] = ()) -> str:
    """The CSV for ``groups`` (in the order given, each field once) plus ``extra`` fields."""
    lines = [HEADER]
    seen: set[str] = set()
    for group in groups:
        lines.append(f"\n# {group}\n")
        for name in GROUPS[group]:
            if name in seen:
                continue
            seen.add(name)
            f = FIELDS[name]
            lines.append(f"{f.name}, {f.type}, {f.help}\n")
    extra = [f for f in extra if f.name not in seen]
    if extra:
        lines.append("\n# dcgm_exporter_extra_fields\n")
        for f in extra:
            lines.append(f"{f.name}, {f.type}, {f.help}\n")
    return "".join(lines)


def _groups(value: Any) -> list[str]:
    key = "dcgm_exporter_field_groups"
    if value is None:
        return list(DEFAULT_GROUPS)
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise InputError(f"expected a list of field group names, got {value!r}", key=key)
    if not value:
        raise InputError("give at least one field group", key=key)
    for g in value:
        if g not in GROUPS:
            raise InputError(f"unknown field group {g!r}; known: {', '.join(GROUPS)}", key=key)
    return list(dict.fromkeys(value))


def _extra(value: Any) -> list[Field]:
    key = "dcgm_exporter_extra_fields"
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise InputError(f"expected a list of {{field, type, help}}, got {value!r}", key=key)
    out = []
    for i, item in enumerate(value):
        where = f"{key}[{i}]"
        if not isinstance(item, Mapping) or set(item) - {"field", "type", "help"}:
            raise InputError("expected a mapping with field, type and help", key=where)
        name, typ, text = item.get("field"), item.get("type"), item.get("help", "")
        if not isinstance(name, str) or not _NAME.match(name):
            raise InputError(
                f"field must be a DCGM field name like DCGM_FI_DEV_GPU_TEMP, got {name!r}",
                key=where,
            )
        if typ not in TYPES:
            raise InputError(f"type must be one of {', '.join(TYPES)}, got {typ!r}", key=where)
        if not isinstance(text, str) or "\n" in text or "," in text:
            raise InputError("help must be one line without commas", key=where)
        out.append(Field(name, typ, text or name, None, "inventory"))
    return out


def csv_from_vars(variables: Mapping[str, Any]) -> str:
    """The CSV a host's variables ask for; ``InputError`` naming the variable on bad values."""
    return render_csv(
        _groups(variables.get("dcgm_exporter_field_groups")),
        _extra(variables.get("dcgm_exporter_extra_fields")),
    )
