"""The one registry of DCGM field names: what each field is called, per dcgm-exporter version.

Owns the field catalogue (every field gpumon-deploy enables or reads: its stable key, the metric
name Prometheus stores, Prometheus type, help text, DCGM field id, MIG scope and the names each
exporter version accepts), the named field groups, the exporter's collectors CSV, and the
Prometheus relabelling that maps an older exporter's field name onto the stored metric name.

A DCGM rename is one edit here. The metric name Prometheus stores for a field is the name its CSV
line carries (dcgm-exporter renders ``{{ $counter.FieldName }}``, NVIDIA/dcgm-exporter
``internal/pkg/rendermetrics/render_metrics.go:47`` @ 691c927), so every consumer takes it from
``metric(key)``: the CSV this module writes, the rule templates (template global ``dcgm_metric``),
``status`` and dashboards. Changing ``Field.metric`` of one entry moves all of them; exporter
versions that do not accept the new name get a name they do accept in their CSV and the scrape
relabels it to the metric name (``metric_relabel_configs()``), so a mixed fleet stores one name.

Which names an exporter accepts: ``counters.ExtractCounters`` looks every CSV name up in go-dcgm's
current and legacy name maps and fails the start on an unknown one ("could not find DCGM field";
NVIDIA/dcgm-exporter ``internal/pkg/counters/counter_config.go:110-117`` @ 691c927); the four
``DCGM_EXP_*`` names are the exporter's own (``internal/pkg/counters/const.go:25-28``). The go-dcgm
each exporter tag builds with is in its ``go.mod`` (``EXPORTER_GO_DCGM``); the spans in ``Name``
were read from go-dcgm ``pkg/dcgm/const_fields.go`` (``dcgmFields``, ``legacyDCGMFields``) or, before
4.2, ``pkg/dcgm/const.go`` (``DCGM_FI``, ``OLD_DCGM_FI``) at those commits, and are checked against
``../shared/gpu_reality_fixtures/dcgm-exporter/go-dcgm-field-names.json`` and the shipped CSVs by
``tests/unit/test_dcgm_fields.py``.

Public API
----------
``metric(key) -> str``
    The metric (or, for ``label`` fields, label) name Prometheus stores for a field, e.g.
    ``metric("gpu_temp") == "DCGM_FI_DEV_GPU_TEMP"``. ``METRICS`` is the same as a mapping.
``FIELDS_BY_KEY``, ``FIELDS`` (by metric name), ``GROUPS`` (group -> field keys),
``DEFAULT_GROUPS``, ``EXPORTER_TAGS``
``accepts(name, exporter_tag) -> bool``
    Whether that exporter version starts with ``name`` in its CSV.
``csv_name(field, exporter_tag) -> str | None``
    The name to write in that version's CSV: the metric name when accepted, else an accepted
    alias, else None (the field cannot be collected by that version).
``render_csv(groups, extra=(), exporter_tag=None, mig_enabled=False) -> str``
``csv_from_vars(variables, exporter_tag=None, mig_enabled=False) -> str``
    ``InputError`` naming the key on a bad value.
``metric_relabel_configs(exporter_tags=EXPORTER_TAGS) -> list[dict]``
    Prometheus ``metric_relabel_configs`` entries renaming aliases to metric names.
``MIG_LABELS``, ``EXPORTER_HOST_LABELS``
    Labels the exporter adds per GPU instance, and its host-name label (``Hostname``, renamed
    ``hostname`` at HEAD d5e5f51 "#655"): nothing gpumon ships may key on the latter.

Inventory variables read (through :func:`csv_from_vars`):

``dcgm_exporter_field_groups``
    Names of groups (default :data:`DEFAULT_GROUPS`). ``profiling`` is opt-in: the DCP metrics
    make nv-hostengine run the GPUs' performance counters continuously, which costs overhead on
    busy GPUs and cannot run at the same time as other profilers (Nsight, CUPTI); upstream enables
    five of them by default (dcgm-exporter.md §4.1), gpumon-deploy does not.
``dcgm_exporter_extra_fields``
    More fields: a list of ``{field: DCGM_FI_..., type: gauge|counter|label, help: "..."}``.
``dcgm_exporter_mig_utilization`` (default true)
    On a host with a GPU in MIG mode, also collect ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``: a GPU in MIG
    mode has no ``DCGM_FI_DEV_GPU_UTIL`` (NVML does not report utilization in MIG mode; the A800
    capture has none for its MIG GPU), and the graphics-engine activity per GPU instance is the
    utilization signal DCGM has for instances (field entity level GPU_CI, NVIDIA/DCGM
    ``dcgmlib/src/dcgm_fields.cpp:4282`` @ v4.5.3; shown per ``GPU_I_ID`` in NVIDIA's own MIG
    example, NVIDIA/cloud-native-docs ``gpu-telemetry/dcgm-exporter.rst:245-266`` @ 8db0030).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deployer.errors import InputError

TYPES = ("gauge", "counter", "label")
_NAME = re.compile(r"^DCGM_(FI|EXP)_[A-Z0-9_]+$")

# dcgm-exporter tags gpumon-deploy plans (deployer/data/compat.yml), oldest exporter first, with
# the go-dcgm commit of each tag's go.mod (NVIDIA/dcgm-exporter at the tag). 4.6.0-4.8.3 is not in
# the exporter snapshot read: its go-dcgm (v1.4601.1 = 38235a0) is from the release notes,
# docs/unverified.md#exporter-4-8-3-go-dcgm.
EXPORTER_GO_DCGM: dict[str, str] = {
    "3.3.5-3.4.0": "3385e277e49f",
    "3.3.5-3.4.1": "3385e277e49f",
    "3.3.6-3.4.2": "3385e277e49f",
    "3.3.7-3.5.0": "3385e277e49f",
    "3.3.8-3.6.0": "3385e277e49f",
    "3.3.9-3.6.1": "3385e277e49f",
    "4.0.0-4.0.1": "850266c9c8a5",
    "4.1.1-4.0.3": "2b08cf88dcdc",
    "4.1.1-4.0.4": "2b08cf88dcdc",
    "4.2.0-4.1.0": "7c92211ba301",
    "4.2.3-4.1.1": "7c92211ba301",
    "4.2.3-4.1.3": "7c92211ba301",
    "4.2.3-4.2.0": "7c92211ba301",
    "4.3.1-4.4.0": "984cbc9b6270",
    "4.4.0-4.5.0": "a9c939c020ec",
    "4.4.1-4.5.2": "a9c939c020ec",
    "4.4.1-4.6.0": "0b1e78b1ccea",
    "4.4.2-4.7.0": "0b1e78b1ccea",
    "4.4.2-4.7.1": "7ac2f778d507",
    "4.5.1-4.8.0": "6cbb0463ce9f",
    "4.5.2-4.8.1": "6cbb0463ce9f",
    "4.5.3-4.8.2": "ec245c09fe3e",
    "4.6.0-4.8.3": "38235a0",
}
EXPORTER_TAGS: tuple[str, ...] = tuple(EXPORTER_GO_DCGM)
_ORDER = {tag: i for i, tag in enumerate(EXPORTER_TAGS)}
_FIRST = EXPORTER_TAGS[0]
_DCGM46 = "4.6.0-4.8.3"  # first exporter on go-dcgm with DCGM 4.6's names (v1.4601.x)

# Labels dcgm-exporter puts on GPU series (render_metrics.go:47 @ 691c927): one series per GPU
# instance under the default "-d f" (pkg/cmd/app.go:42,161; device_monitoring.go:97-120).
MIG_LABELS: tuple[str, ...] = ("GPU_I_PROFILE", "GPU_I_ID")
# "Hostname" (4.x, the machine's name; "localhost" outside Kubernetes with -r localhost:5555),
# "hostname" from HEAD d5e5f51 (#655) / 4.6.0-4.8.3.
EXPORTER_HOST_LABELS: tuple[str, ...] = ("Hostname", "hostname")


@dataclass(frozen=True)
class Name:
    """One DCGM name of a field and the exporter tags that accept it: ``since`` .. ``until``
    inclusive (``until`` None: every later tag)."""

    name: str
    since: str = _FIRST
    until: str | None = None

    def accepted_by(self, tag: str) -> bool:
        i = _order(tag)
        return _ORDER[self.since] <= i and (self.until is None or i <= _ORDER[self.until])


@dataclass(frozen=True)
class Field:
    key: str  # stable id the rules, status and dashboards use
    metric: str  # the metric (label, for type "label") name Prometheus stores
    type: str
    help: str
    field_id: int | None  # None for metrics dcgm-exporter computes itself (DCGM_EXP_*)
    source: str
    # DCGM entity level (NVIDIA/DCGM dcgmlib/src/dcgm_fields.cpp @ v4.5.3): "gpu" fields are the
    # physical GPU's and DCGM answers them for a GPU instance from its parent GPU
    # (DcgmCacheManager.cpp:2330 "translate it to the corresponding GPU id"), so under MIG every
    # instance series repeats the GPU's value (the A800 capture: 3 x 78 W of one GPU); "instance"
    # fields (levels GPU_I/GPU_CI: framebuffer, XID, profiling) are the instance's own.
    scope: str
    names: tuple[Name, ...] = ()

    @property
    def name(self) -> str:  # the name callers of the earlier catalogue read: the metric name
        return self.metric

    def all_names(self) -> tuple[Name, ...]:
        return self.names or (Name(self.metric),)


_S41 = "dcgm-exporter.md §4.1 default-counters.csv [X3][F1]"
_S42 = "dcgm-exporter.md §4.2 commented-out counters [X3]"
_SOTHER = "dcgm-exporter.md §4.2 'Other useful DCGM fields' [F1]"


def _f(
    key: str,
    metric: str,
    typ: str,
    text: str,
    field_id: int | None,
    source: str,
    scope: str,
    renamed: str | None = None,
    renamed_since: str = _DCGM46,
    since: str = _FIRST,
    aliases: tuple[Name, ...] = (),
) -> Field:
    """A catalogue entry: ``metric`` accepted from ``since`` on; ``renamed`` is DCGM 4.6's new name
    (go-dcgm 38235a0 ``dcgmFields``; the old one moved to ``legacyDCGMFields``)."""
    names = (Name(metric, since), *aliases)
    if renamed:
        names += (Name(renamed, renamed_since),)
    return Field(key, metric, typ, text, field_id, source, scope, names)


_CATALOGUE: tuple[Field, ...] = (
    # §4.1: enabled by default upstream (4.5.3-4.8.2), profiling fields excepted
    _f("sm_clock", "DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", 100, _S41, "gpu"),
    _f("mem_clock", "DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", 101, _S41, "gpu"),
    _f("memory_temp", "DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", 140, _S41, "gpu",
       renamed="DCGM_FI_DEV_MEMORY_TEMP_CELSIUS"),
    _f("gpu_temp", "DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", 150, _S41, "gpu",
       renamed="DCGM_FI_DEV_GPU_TEMP_CELSIUS"),
    _f("power_usage", "DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", 155, _S41, "gpu",
       renamed="DCGM_FI_DEV_BOARD_POWER_WATTS"),
    _f("total_energy", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
       "Total energy consumption since boot (in mJ).", 156, _S41, "gpu"),
    _f("pcie_replay", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.",
       202, _S41, "gpu", renamed="DCGM_FI_DEV_PCIE_REPLAY_TOTAL"),
    _f("gpu_util", "DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", 203, _S41, "gpu",
       renamed="DCGM_FI_DEV_GPU_UTIL_RATIO"),
    _f("mem_copy_util", "DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", 204, _S41, "gpu"),
    _f("enc_util", "DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", 206, _S41, "gpu"),
    _f("dec_util", "DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", 207, _S41, "gpu"),
    _f("xid_last", "DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", 230,
       _S41, "instance", renamed="DCGM_FI_DEV_XID_ERROR"),
    _f("fb_free", "DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", 251, _S41, "instance"),
    _f("fb_used", "DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", 252, _S41, "instance"),
    _f("fb_reserved", "DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).",
       253, _S41, "instance"),
    _f("nvlink_bandwidth_total", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
       "Total number of NVLink bandwidth counters for all lanes.", 449, _S41, "gpu",
       renamed="DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL", renamed_since="4.5.3-4.8.2"),
    _f("vgpu_license_status", "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", 526,
       _S41, "vgpu"),
    _f("uncorrectable_remapped_rows", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
       "Number of remapped rows for uncorrectable errors", 393, _S41, "gpu",
       renamed="DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL"),
    _f("correctable_remapped_rows", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
       "Number of remapped rows for correctable errors", 394, _S41, "gpu",
       renamed="DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL"),
    _f("row_remap_failure", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge",
       "Whether remapping of rows has failed", 395, _S41, "gpu", renamed="DCGM_FI_DEV_ROW_REMAP_FAILED"),
    _f("driver_version", "DCGM_FI_DRIVER_VERSION", "label", "Driver Version", 1, _S41, "system",
       renamed="DCGM_FI_SYSTEM_DRIVER_VERSION"),
    # the board's power limit, for the dashboards' power-vs-limit panel (also in go-dcgm's
    # dcgmFields at 7ac2f778d507 and ec245c09fe3e: gpu_reality_fixtures go-dcgm-field-names.json)
    _f("power_limit", "DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge",
       "Current power management limit of the device (in W).", 160, _SOTHER, "gpu"),
    # memory temperature limit the HBM alert compares against
    _f("memory_max_op_temp", "DCGM_FI_DEV_MEM_MAX_OP_TEMP", "gauge",
       "Maximum operating temperature for the memory of this GPU (in C).", 151, _SOTHER, "gpu",
       renamed="DCGM_FI_DEV_MEMORY_MAX_OP_TEMP_CELSIUS"),
    _f("row_remap_pending", "DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether a row remap is pending",
       396, _SOTHER, "gpu"),
    # exporter-computed XID count (window -x, default 300000 ms); xid_collector.go: one series per
    # monitored entity, from the parent GPU's XIDs (expcollector.go:90 keys by DeviceInfo.GPU)
    _f("xid_count", "DCGM_EXP_XID_ERRORS_COUNT", "counter",
       "Count of XID Errors within user-specified time window (see xid-count-window-size flag).",
       None, _S42, "gpu"),
    # ECC and page retirement (pre-Ampere)
    _f("ecc_sbe_volatile", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter",
       "Total number of single-bit volatile ECC errors.", 310, _S42, "gpu"),
    _f("ecc_dbe_volatile", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter",
       "Total number of double-bit volatile ECC errors.", 311, _S42, "gpu"),
    _f("ecc_sbe_aggregate", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter",
       "Total number of single-bit persistent ECC errors.", 312, _S42, "gpu"),
    _f("ecc_dbe_aggregate", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter",
       "Total number of double-bit persistent ECC errors.", 313, _S42, "gpu"),
    _f("retired_sbe", "DCGM_FI_DEV_RETIRED_SBE", "counter",
       "Total number of retired pages due to single-bit errors.", 390, _S42, "gpu",
       renamed="DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL"),
    _f("retired_dbe", "DCGM_FI_DEV_RETIRED_DBE", "counter",
       "Total number of retired pages due to double-bit errors.", 391, _S42, "gpu",
       renamed="DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL"),
    _f("retired_pending", "DCGM_FI_DEV_RETIRED_PENDING", "counter",
       "Total number of pages pending retirement.", 392, _S42, "gpu",
       renamed="DCGM_FI_DEV_PAGE_RETIRED_PENDING"),
    # NVLink errors
    _f("nvlink_crc_flit_errors", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter",
       "Total number of NVLink flow-control CRC errors.", 409, _S42, "gpu",
       renamed="DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL"),
    _f("nvlink_crc_data_errors", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter",
       "Total number of NVLink data CRC errors.", 419, _S42, "gpu",
       renamed="DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL"),
    _f("nvlink_replay_errors", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter",
       "Total number of NVLink retries.", 429, _S42, "gpu", renamed="DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL"),
    _f("nvlink_recovery_errors", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter",
       "Total number of NVLink recovery errors.", 439, _S42, "gpu",
       renamed="DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL"),
    # clock events (throttling) and violation times. Field 112 is DCGM_FI_DEV_CLOCK_THROTTLE_REASONS
    # in the go-dcgm of exporter 3.x (3385e27 const.go DCGM_FI) and not accepted by 4.4.2-4.7.1 ..
    # 4.5.2-4.8.1 (7ac2f77, 6cbb046: neither map); DCGM_FI_DEV_CLOCKS_EVENT_REASONS from 4.0.0-4.0.1.
    _f("clocks_event_reasons", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge",
       "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).", 112, _SOTHER, "gpu",
       since="4.0.0-4.0.1",
       aliases=(Name("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", _FIRST, "4.4.2-4.7.0"),
                Name("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "4.5.3-4.8.2"))),
    _f("power_violation", "DCGM_FI_DEV_POWER_VIOLATION", "counter",
       "Throttling duration due to power constraints (in ns).", 240, _S42, "gpu"),
    _f("thermal_violation", "DCGM_FI_DEV_THERMAL_VIOLATION", "counter",
       "Throttling duration due to thermal constraints (in ns).", 241, _S42, "gpu"),
    _f("board_limit_violation", "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "counter",
       "Throttling duration due to board limit constraints (in ns).", 243, _S42, "gpu"),
    _f("reliability_violation", "DCGM_FI_DEV_RELIABILITY_VIOLATION", "counter",
       "Throttling duration due to reliability constraints (in ns).", 245, _S42, "gpu"),
    # profiling (DCP): opt-in
    _f("gr_engine_active", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge",
       "Ratio of time the graphics engine is active.", 1001, _S41, "instance",
       renamed="DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO"),
    _f("sm_active", "DCGM_FI_PROF_SM_ACTIVE", "gauge",
       "The ratio of cycles an SM has at least 1 warp assigned.", 1002, _S42, "instance",
       renamed="DCGM_FI_PROF_SM_UTIL_RATIO"),
    _f("sm_occupancy", "DCGM_FI_PROF_SM_OCCUPANCY", "gauge",
       "The ratio of number of warps resident on an SM.", 1003, _S42, "instance",
       renamed="DCGM_FI_PROF_SM_OCCUPANCY_RATIO"),
    _f("tensor_active", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge",
       "Ratio of cycles the tensor (HMMA) pipe is active.", 1004, _S41, "instance",
       renamed="DCGM_FI_PROF_TENSOR_UTIL_RATIO"),
    _f("dram_active", "DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
       "Ratio of cycles the device memory interface is active sending or receiving data.", 1005,
       _S41, "instance", renamed="DCGM_FI_PROF_DRAM_UTIL_RATIO"),
    _f("fp64_active", "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge",
       "Ratio of cycles the fp64 pipes are active.", 1006, _S42, "instance",
       renamed="DCGM_FI_PROF_FP64_UTIL_RATIO"),
    _f("fp32_active", "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge",
       "Ratio of cycles the fp32 pipes are active.", 1007, _S42, "instance",
       renamed="DCGM_FI_PROF_FP32_UTIL_RATIO"),
    _f("fp16_active", "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge",
       "Ratio of cycles the fp16 pipes are active.", 1008, _S42, "instance",
       renamed="DCGM_FI_PROF_FP16_UTIL_RATIO"),
    _f("pcie_tx_bytes", "DCGM_FI_PROF_PCIE_TX_BYTES", "gauge",
       "The rate of data transmitted over the PCIe bus - including both protocol headers and "
       "data payloads - in bytes per second.", 1009, _S41, "gpu"),
    _f("pcie_rx_bytes", "DCGM_FI_PROF_PCIE_RX_BYTES", "gauge",
       "The rate of data received over the PCIe bus - including both protocol headers and "
       "data payloads - in bytes per second.", 1010, _S41, "gpu"),
    _f("nvlink_tx_bytes", "DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge",
       "The rate of data transmitted over NVLink (in bytes per second).", 1011, _SOTHER, "gpu"),
    _f("nvlink_rx_bytes", "DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge",
       "The rate of data received over NVLink (in bytes per second).", 1012, _SOTHER, "gpu"),
    # static information as labels: opt-in
    _f("nvml_version", "DCGM_FI_NVML_VERSION", "label", "NVML Version", 2, _S42, "system",
       renamed="DCGM_FI_SYSTEM_NVML_VERSION"),
    _f("brand", "DCGM_FI_DEV_BRAND", "label", "Device Brand", 51, _S42, "gpu",
       renamed="DCGM_FI_DEV_GPU_BRAND"),
    _f("serial", "DCGM_FI_DEV_SERIAL", "label", "Device Serial Number", 53, _S42, "gpu",
       renamed="DCGM_FI_DEV_BOARD_SERIAL"),
    _f("vbios_version", "DCGM_FI_DEV_VBIOS_VERSION", "label", "VBIOS version of the device", 85, _S42, "gpu"),
    _f("inforom_image_version", "DCGM_FI_DEV_INFOROM_IMAGE_VER", "label", "InfoROM image version", 82,
       _S42, "gpu", renamed="DCGM_FI_DEV_INFOROM_IMAGE_VERSION"),
)  # fmt: skip

FIELDS_BY_KEY: dict[str, Field] = {f.key: f for f in _CATALOGUE}
FIELDS: dict[str, Field] = {f.metric: f for f in _CATALOGUE}
METRICS: dict[str, str] = {f.key: f.metric for f in _CATALOGUE}

# The exporter's own metrics and the first tag that knows each (NVIDIA/dcgm-exporter
# internal/pkg/counters/const.go:25-28 @ 691c927; pkg/dcgmexporter/exporter_metrics.go:22-23 @
# 3.3.5-3.4.0; DCGM_EXP_GPU_HEALTH_STATUS from 4.0.0-4.0.1, DCGM_EXP_P2P_STATUS from 4.3.1-4.4.0).
EXPORTER_METRICS: dict[str, Name] = {
    "DCGM_EXP_XID_ERRORS_COUNT": Name("DCGM_EXP_XID_ERRORS_COUNT", _FIRST),
    "DCGM_EXP_CLOCK_EVENTS_COUNT": Name("DCGM_EXP_CLOCK_EVENTS_COUNT", _FIRST),
    "DCGM_EXP_GPU_HEALTH_STATUS": Name("DCGM_EXP_GPU_HEALTH_STATUS", "4.0.0-4.0.1"),
    "DCGM_EXP_P2P_STATUS": Name("DCGM_EXP_P2P_STATUS", "4.3.1-4.4.0"),
}


def metric(key: str) -> str:
    """The name Prometheus stores for the field ``key`` (``KeyError`` on an unknown key)."""
    return FIELDS_BY_KEY[key].metric


def _order(tag: str) -> int:
    try:
        return _ORDER[tag]
    except KeyError:
        raise InputError(
            f"dcgm-exporter {tag!r} is not one gpumon-deploy knows the field names of; "
            f"known: {', '.join(EXPORTER_TAGS)}",
            key="dcgm_exporter_version",
        ) from None


def accepts(name: str, exporter_tag: str) -> bool:
    """Whether dcgm-exporter ``exporter_tag`` starts with ``name`` in its CSV (names outside this
    catalogue are not known here: False)."""
    if name.startswith("DCGM_EXP_"):
        known = EXPORTER_METRICS.get(name)
        return known is not None and known.accepted_by(exporter_tag)
    return any(
        n.name == name and n.accepted_by(exporter_tag) for f in _CATALOGUE for n in f.all_names()
    )


def csv_name(f: Field, exporter_tag: str | None) -> str | None:
    """The name of ``f`` for that exporter's CSV: the metric name when accepted, else an accepted
    alias (relabelled at scrape time), else None. ``exporter_tag`` None: the metric name."""
    if exporter_tag is None:
        return f.metric
    if f.metric.startswith("DCGM_EXP_"):
        return f.metric if accepts(f.metric, exporter_tag) else None
    accepted = [n.name for n in f.all_names() if n.accepted_by(exporter_tag)]
    if f.metric in accepted:
        return f.metric
    return accepted[0] if accepted else None


def metric_relabel_configs(exporter_tags: Iterable[str] = EXPORTER_TAGS) -> list[dict[str, Any]]:
    """``metric_relabel_configs`` of the dcgm scrape job: every alias some of ``exporter_tags``
    writes in its CSV instead of the metric name is renamed to the metric name (a label field's
    alias is copied to the label name and dropped)."""
    pairs: dict[tuple[str, str], str] = {}
    for tag in exporter_tags:
        for f in _CATALOGUE:
            name = csv_name(f, tag)
            if name is not None and name != f.metric:
                pairs[(name, f.metric)] = f.type
    configs: list[dict[str, Any]] = []
    for (alias, target), typ in sorted(pairs.items()):
        if typ == "label":
            configs.append({"action": "labelmap", "regex": alias, "replacement": target})
            configs.append({"action": "labeldrop", "regex": alias})
        else:
            configs.append(
                {
                    "source_labels": ["__name__"],
                    "regex": alias,
                    "target_label": "__name__",
                    "replacement": target,
                }
            )
    return configs


# Field groups, by field key (so that a rename is one edit of the catalogue).
GROUPS: dict[str, tuple[str, ...]] = {
    # upstream default-counters.csv without its five DCGM_FI_PROF_* gauges (dcgm-exporter.md §4.1)
    "upstream": tuple(
        f.key
        for f in _CATALOGUE
        if f.source == _S41 and not f.metric.startswith(("DCGM_FI_PROF_", "DCGM_EXP_"))
    ),
    "memory_temp": ("memory_temp", "memory_max_op_temp"),
    "xid": ("xid_last", "xid_count"),
    "row_remap": (
        "uncorrectable_remapped_rows",
        "correctable_remapped_rows",
        "row_remap_failure",
        "row_remap_pending",
    ),
    "ecc": (
        "ecc_sbe_volatile",
        "ecc_dbe_volatile",
        "ecc_sbe_aggregate",
        "ecc_dbe_aggregate",
        "retired_sbe",
        "retired_dbe",
        "retired_pending",
    ),
    "nvlink_errors": (
        "nvlink_crc_flit_errors",
        "nvlink_crc_data_errors",
        "nvlink_replay_errors",
        "nvlink_recovery_errors",
    ),
    "clock_events": (
        "clocks_event_reasons",
        "power_violation",
        "thermal_violation",
        "board_limit_violation",
        "reliability_violation",
    ),
    "profiling": tuple(f.key for f in _CATALOGUE if f.metric.startswith("DCGM_FI_PROF_")),
    # the utilization signal of GPU instances (module docstring, dcgm_exporter_mig_utilization)
    "mig_utilization": ("gr_engine_active",),
    # the power limit beside the power draw (the node dashboard's power-vs-limit panel)
    "power_limit": ("power_limit",),
    "info_labels": ("nvml_version", "brand", "serial", "vbios_version", "inforom_image_version"),
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
    "power_limit",
)

HEADER = (
    "# dcgm-exporter collectors, generated by gpumon-deploy (role dcgm_exporter).\n"
    "# Local changes are overwritten. Format: DCGM field, Prometheus metric type, help message.\n"
)


def render_csv(
    groups: Sequence[str],
    extra: Iterable[Field] = (),
    exporter_tag: str | None = None,
    mig_enabled: bool = False,
) -> str:
    """The CSV for ``groups`` (in the order given, each field once) plus ``extra`` fields, with
    only names ``exporter_tag`` accepts (a field it cannot collect is left out, saying so);
    ``mig_enabled`` adds the ``mig_utilization`` group."""
    if exporter_tag is not None:
        _order(exporter_tag)
    if mig_enabled and "mig_utilization" not in groups:
        groups = (*groups, "mig_utilization")
    lines = [HEADER]
    seen: set[str] = set()
    for group in groups:
        lines.append(f"\n# {group}\n")
        for key in GROUPS[group]:
            if key in seen:
                continue
            seen.add(key)
            f = FIELDS_BY_KEY[key]
            name = csv_name(f, exporter_tag)
            if name is None:
                lines.append(f"# {f.metric}: not known to dcgm-exporter {exporter_tag}\n")
                continue
            lines.append(f"{name}, {f.type}, {f.help}\n")
    names = {FIELDS_BY_KEY[k].metric for k in seen}
    extra = [f for f in extra if f.metric not in names]
    if extra:
        lines.append("\n# dcgm_exporter_extra_fields\n")
        for f in extra:
            lines.append(f"{f.metric}, {f.type}, {f.help}\n")
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


def _extra(value: Any, exporter_tag: str | None) -> list[Field]:
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
        # The exporter exits on a name it does not know; refuse the ones known to be unknown.
        if exporter_tag is not None and name.startswith("DCGM_EXP_"):
            if not accepts(name, exporter_tag):
                raise InputError(
                    f"dcgm-exporter {exporter_tag} has no exporter metric {name} (it knows "
                    f"{', '.join(n for n in EXPORTER_METRICS if accepts(n, exporter_tag))})",
                    key=where,
                )
        elif exporter_tag is not None and _known_name(name) and not accepts(name, exporter_tag):
            raise InputError(
                f"dcgm-exporter {exporter_tag} does not accept {name}: it would exit at start",
                key=where,
            )
        out.append(Field(name, name, typ, text or name, None, "inventory", "gpu"))
    return out


def _known_name(name: str) -> bool:
    return any(n.name == name for f in _CATALOGUE for n in f.all_names())


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"yes", "true", "on", "1"}
    return bool(value)


# Every variable csv_from_vars reads.
VARS = ("dcgm_exporter_field_groups", "dcgm_exporter_extra_fields", "dcgm_exporter_mig_utilization")


def csv_from_vars(
    variables: Mapping[str, Any], exporter_tag: str | None = None, mig_enabled: bool = False
) -> str:
    """The CSV a host's variables ask for, for dcgm-exporter ``exporter_tag`` on a host with
    (``mig_enabled``) or without a GPU in MIG mode; ``InputError`` naming the variable on bad
    values."""
    return render_csv(
        _groups(variables.get("dcgm_exporter_field_groups")),
        _extra(variables.get("dcgm_exporter_extra_fields"), exporter_tag),
        exporter_tag,
        mig_enabled and _truthy(variables.get("dcgm_exporter_mig_utilization", True)),
    )
