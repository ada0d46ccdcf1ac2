"""SIMULATED ``nvidia-smi``: the table, ``-L``, ``-q``, ``--query-gpu``, ``--query-compute-apps``
and ``-pm``, answered from the host's described GPUs, its fault state and the loaded module.

Every layout is the one real nvidia-smi prints (``../shared/gpu_reality_fixtures``:
``nvidia_gpu_exporter/*__590.48.01.txt``, ``*l40s__595.80.txt``, with MIG in ``*-mig__*``): the
column widths of the table and its MIG devices block, ``-L`` with ``MIG <profile> Device N``
lines, ``-q``'s sections and 55-column key width, the CSV's units, ``[N/A]`` (not supported) and
``N/A`` (no sensor) forms. Driver releases 590 and later print ``-q`` thresholds as T.Limit margins
(``GPU T.Limit Temp``); earlier ones print absolute thresholds. Fails like the real tool when the
driver is missing (exit 9) or when the user-space library was upgraded but the old module is still
loaded (exit 18, "Driver/library version mismatch" on stdout).
"""

import os
import sys
import time

try:
    from deployer.lab.gpusim.standins import common as c
except ImportError:  # installed on a simulated host: the package ships gpusim_common.py
    import gpusim_common as c  # type: ignore[no-redef]

EXIT_INVALID_ARG = 2
EXIT_NOT_FOUND = 6
NA = "[N/A]"  # --query-gpu: the value is not supported on this GPU
NO_SENSOR = "N/A"  # --query-gpu temperature.memory on a board without a memory sensor (L40S)
DEPRECATED = "[Requested functionality has been deprecated]"
KEY_WIDTH = 55  # -q: "    Product Name" padded to 55 columns, then ": value"


def branch(driver: str) -> int:
    try:
        return int(driver.split(".")[0])
    except ValueError:
        return 0


def ctime(t: float | None = None) -> str:
    """``Tue Jul 14 09:00:27 2026`` / ``Fri Jul  3 08:33:38 2026`` (day padded with a space)."""
    lt = time.localtime(t)
    return f"{time.strftime('%a %b', lt)} {lt.tm_mday:>2} {time.strftime('%H:%M:%S %Y', lt)}"


def csv_timestamp(t: float | None = None) -> str:
    t = time.time() if t is None else t
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


# --- --query-gpu ------------------------------------------------------------------------------


def _field_table() -> dict:
    """canonical field -> (aliases, header unit or None, fn(gpu, sample, ctx) -> (with, without)).

    Names and aliases as ``nvidia-smi --help-query-gpu`` of R590 lists them; the header always
    names the canonical field, with its unit even under ``nounits`` (netdata's tesla-p100.csv).
    """

    def plain(fn):
        return lambda g, s, x: (str(fn(g, s, x)),) * 2

    def unit(fmt: str, u: str, fn):
        def f(g, s, x):
            v = fn(g, s, x)
            if v is None:
                return (NA, NA)
            text = fmt.format(v)
            return (f"{text} {u}", text)

        return f

    def na_unless(cond, fn):
        return lambda g, s, x: fn(g, s, x) if cond(g, s, x) else (NA, NA)

    def mig(g, s, x):
        if not g.get("mig_capable"):
            return (NA, NA)
        v = "Enabled" if c.mig_enabled(g) else "Disabled"
        return (v, v)

    def mem_temp(g, s, x):
        v = s["memory_temp"]
        return (NO_SENSOR, NO_SENSOR) if v is None else (str(v), str(v))

    def tlimit(g, s, x):
        top = g.get("gpu_max_op_temp")
        return (NA, NA) if top is None else (str(top - s["gpu_temp"]),) * 2

    def reason(bit):
        return plain(lambda g, s, x: "Active" if s["clocks_event_reasons"] & bit else "Not Active")

    remap = lambda g, s, x: g.get("row_remap") and not c.mig_enabled(g)  # noqa: E731
    retire = lambda g, s, x: not g.get("row_remap")  # noqa: E731
    watts = lambda key: unit("{:.2f}", "W", key)  # noqa: E731
    mib = lambda key: unit("{}", "MiB", key)  # noqa: E731
    mhz = lambda key: unit("{}", "MHz", key)  # noqa: E731
    pct = lambda key: unit("{}", "%", key)  # noqa: E731

    return {
        "timestamp": ((), None, plain(lambda g, s, x: csv_timestamp(x["now"]))),
        "driver_version": ((), None, plain(lambda g, s, x: x["driver"])),
        "count": ((), None, plain(lambda g, s, x: x["count"])),
        "name": (("gpu_name",), None, plain(lambda g, s, x: g["name"])),
        "serial": (("gpu_serial",), None, plain(lambda g, s, x: g["serial"])),
        "uuid": (("gpu_uuid",), None, plain(lambda g, s, x: g["uuid"])),
        "pci.bus_id": (("gpu_bus_id",), None, plain(lambda g, s, x: g["pci_bus_id"])),
        "pci.domain": ((), None, plain(lambda g, s, x: "0x" + g["pci_bus_id"][4:8])),
        "pci.bus": ((), None, plain(lambda g, s, x: "0x" + g["pci_bus_id"][9:11])),
        "pci.device": ((), None, plain(lambda g, s, x: "0x" + g["pci_bus_id"][12:14])),
        "pci.device_id": ((), None, plain(lambda g, s, x: f"0x{g['pci_device_id']}10DE")),
        "pci.sub_device_id": ((), None, lambda g, s, x: (
            (f"0x{g['pci_subsystem_id']}10DE",) * 2 if g.get("pci_subsystem_id") else (NA, NA))),
        "pcie.link.gen.current": ((), None, plain(lambda g, s, x: g["pcie_gen"])),
        "pcie.link.gen.gpucurrent": ((), None, plain(lambda g, s, x: g["pcie_gen"])),
        "pcie.link.gen.max": ((), None, plain(lambda g, s, x: g["pcie_gen"])),
        "pcie.link.gen.gpumax": ((), None, plain(lambda g, s, x: g["pcie_gen"])),
        "pcie.link.gen.hostmax": ((), None, lambda g, s, x: (NA, NA)),
        "pcie.link.width.current": ((), None, plain(lambda g, s, x: g["pcie_width"])),
        "pcie.link.width.max": ((), None, plain(lambda g, s, x: g["pcie_width"])),
        "index": ((), None, plain(lambda g, s, x: g["index"])),
        "persistence_mode": ((), None, plain(
            lambda g, s, x: "Enabled" if x["persistence"] else "Disabled")),
        "accounting.mode": ((), None, plain(lambda g, s, x: "Disabled")),
        "accounting.buffer_size": ((), None, plain(lambda g, s, x: 4000)),
        "vbios_version": ((), None, plain(lambda g, s, x: g["vbios_version"])),
        "inforom.img": (("inforom.image",), None, plain(lambda g, s, x: g["inforom"]["img"])),
        "inforom.oem": ((), None, plain(lambda g, s, x: g["inforom"]["oem"])),
        "inforom.ecc": ((), None, plain(lambda g, s, x: g["inforom"]["ecc"])),
        "fan.speed": ((), "%", lambda g, s, x: ("0 %", "0") if g.get("fan") else (NA, NA)),
        "pstate": ((), None, plain(lambda g, s, x: s["pstate"])),
        "clocks_event_reasons.active": (("clocks_throttle_reasons.active",), None,
                                        plain(lambda g, s, x: f"0x{s['clocks_event_reasons']:016X}")),
        "clocks_event_reasons.gpu_idle": (("clocks_throttle_reasons.gpu_idle",), None, reason(0x1)),
        "clocks_event_reasons.hw_thermal_slowdown": (
            ("clocks_throttle_reasons.hw_thermal_slowdown",), None, reason(0x40)),
        "clocks_event_reasons.sw_thermal_slowdown": (
            ("clocks_throttle_reasons.sw_thermal_slowdown",), None, reason(0x20)),
        "memory.total": ((), "MiB", mib(lambda g, s, x: s["fb_total"])),
        "memory.reserved": ((), "MiB", mib(lambda g, s, x: s["fb_reserved"])),
        "memory.used": ((), "MiB", mib(lambda g, s, x: s["fb_used"])),
        "memory.free": ((), "MiB", mib(lambda g, s, x: s["fb_free"])),
        "compute_mode": ((), None, plain(lambda g, s, x: "Default")),
        "compute_cap": ((), None, plain(lambda g, s, x: g["compute_cap"])),
        "utilization.gpu": ((), "%", pct(lambda g, s, x: s["util"])),
        "utilization.memory": ((), "%", pct(lambda g, s, x: s["mem_util"])),
        "ecc.mode.current": ((), None, plain(lambda g, s, x: "Enabled")),
        "ecc.mode.pending": ((), None, plain(lambda g, s, x: "Enabled")),
        "ecc.errors.corrected.volatile.total": ((), None, plain(lambda g, s, x: s["ecc_sbe_vol"])),
        "ecc.errors.corrected.aggregate.total": ((), None, plain(lambda g, s, x: s["ecc_sbe_agg"])),
        "ecc.errors.uncorrected.volatile.total": ((), None, plain(lambda g, s, x: s["ecc_dbe_vol"])),
        "ecc.errors.uncorrected.aggregate.total": ((), None,
                                                   plain(lambda g, s, x: s["ecc_dbe_agg"])),
        "retired_pages.single_bit_ecc.count": (("retired_pages.sbe",), None, na_unless(
            retire, plain(lambda g, s, x: s["retired_sbe"]))),
        "retired_pages.double_bit.count": (("retired_pages.dbe",), None, na_unless(
            retire, plain(lambda g, s, x: s["retired_dbe"]))),
        "retired_pages.pending": ((), None, na_unless(
            retire, plain(lambda g, s, x: "Yes" if s["retired_pending"] else "No"))),
        "remapped_rows.correctable": (("remapped_rows.sbe",), None, na_unless(
            remap, plain(lambda g, s, x: s["correctable_remapped_rows"]))),
        "remapped_rows.uncorrectable": (("remapped_rows.dbe",), None, na_unless(
            remap, plain(lambda g, s, x: s["uncorrectable_remapped_rows"]))),
        "remapped_rows.pending": ((), None, na_unless(
            remap, plain(lambda g, s, x: "Yes" if s["row_remap_pending"] else "No"))),
        "remapped_rows.failure": ((), None, na_unless(
            remap, plain(lambda g, s, x: "Yes" if s["row_remap_failure"] else "No"))),
        "temperature.gpu": ((), None, plain(lambda g, s, x: s["gpu_temp"])),
        "temperature.gpu.tlimit": ((), None, tlimit),
        "temperature.memory": ((), None, mem_temp),
        "power.draw": ((), "W", watts(lambda g, s, x: s["power_w"])),
        "power.draw.average": (("gpu.power.draw.average",), "W", watts(lambda g, s, x: s["power_w"])),
        "power.draw.instant": (("gpu.power.draw.instant",), "W", watts(lambda g, s, x: s["power_w"])),
        "power.limit": (("gpu.power.requested_limit",), "W",
                        watts(lambda g, s, x: float(g["power_limit_w"]))),
        "enforced.power.limit": (("gpu.power.current_limit",), "W",
                                 watts(lambda g, s, x: float(g["power_limit_w"]))),
        "power.default_limit": (("gpu.power.default_limit",), "W",
                                watts(lambda g, s, x: float(g["power_limit_w"]))),
        "power.min_limit": (("gpu.power.min_limit",), "W",
                            watts(lambda g, s, x: float(g["power_min_w"]))),
        "power.max_limit": (("gpu.power.max_limit",), "W",
                            watts(lambda g, s, x: float(g["power_limit_w"]))),
        "clocks.current.graphics": (("clocks.gr",), "MHz", mhz(lambda g, s, x: s["sm_clock"])),
        "clocks.current.sm": (("clocks.sm",), "MHz", mhz(lambda g, s, x: s["sm_clock"])),
        "clocks.current.memory": (("clocks.mem",), "MHz", mhz(lambda g, s, x: s["mem_clock"])),
        "clocks.current.video": (("clocks.video",), "MHz", mhz(lambda g, s, x: s["video_clock"])),
        "clocks.max.graphics": (("clocks.max.gr",), "MHz", mhz(lambda g, s, x: g["max_sm_clock"])),
        "clocks.max.sm": ((), "MHz", mhz(lambda g, s, x: g["max_sm_clock"])),
        "clocks.max.memory": (("clocks.max.mem",), "MHz", mhz(lambda g, s, x: g["mem_clock"])),
        # constant on every capture (H100, H200 with and without MIG at R590, L40S at R595)
        "pci.baseClass": ((), None, plain(lambda g, s, x: "0x3")),
        "pci.subClass": ((), None, plain(lambda g, s, x: "0x2")),
        "display_mode": ((), None, lambda g, s, x: (DEPRECATED, DEPRECATED)),
        "display_attached": ((), None, plain(lambda g, s, x: "Yes")),
        "display_active": ((), None, plain(lambda g, s, x: "Disabled")),
        "addressing_mode": ((), None, plain(
            lambda g, s, x: "HMM" if g["architecture"] == "Ada Lovelace" else "None")),
        "driver_model.current": ((), None, lambda g, s, x: (NA, NA)),
        "driver_model.pending": ((), None, lambda g, s, x: (NA, NA)),
        "inforom.pwr": (("inforom.power",), None, lambda g, s, x: (NA, NA)),
        "inforom.checksum_validation": ((), None, plain(lambda g, s, x: "valid")),
        "gpu_recovery_action": ((), None, plain(lambda g, s, x: "None")),
        "gom.current": (("gpu_operation_mode.current",), None, lambda g, s, x: (NA, NA)),
        "gom.pending": (("gpu_operation_mode.pending",), None, lambda g, s, x: (NA, NA)),
        "clocks_event_reasons.supported": (("clocks_throttle_reasons.supported",), None,
                                           plain(lambda g, s, x: "0x00000000000001FF")),
        "clocks_event_reasons.applications_clocks_setting": (
            ("clocks_throttle_reasons.applications_clocks_setting",), None, reason(0x2)),
        "clocks_event_reasons.sw_power_cap": (("clocks_throttle_reasons.sw_power_cap",), None,
                                              reason(0x4)),
        "clocks_event_reasons.hw_slowdown": (("clocks_throttle_reasons.hw_slowdown",), None,
                                             reason(0x8)),
        "clocks_event_reasons.hw_power_brake_slowdown": (
            ("clocks_throttle_reasons.hw_power_brake_slowdown",), None, reason(0x80)),
        "clocks_event_reasons.sync_boost": (("clocks_throttle_reasons.sync_boost",), None,
                                            reason(0x10)),
        **{f"clocks_event_reasons_counters.{k}": ((), "us", unit("{}", "us", lambda g, s, x: 0))
           for k in ("sw_power_cap", "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown",
                     "hw_power_brake_slowdown")},
        **{f"utilization.{k}": ((), "%", pct(lambda g, s, x: None if c.mig_enabled(g) else 0))
           for k in ("encoder", "decoder", "jpeg", "ofa")},
        "encoder.stats.sessionCount": ((), None, plain(lambda g, s, x: 0)),
        "encoder.stats.averageFps": ((), None, plain(lambda g, s, x: 0)),
        "encoder.stats.averageLatency": ((), None, plain(lambda g, s, x: 0)),
        "dramEncryption.mode.current": ((), None, lambda g, s, x: (NA, NA)),
        "dramEncryption.mode.pending": ((), None, lambda g, s, x: (NA, NA)),
        **{f"ecc.errors.{kind}.{when}.{where}": ((), None, ecc_detail(kind, when, where))
           for kind in ("corrected", "uncorrected") for when in ("volatile", "aggregate")
           for where in ("device_memory", "dram", "register_file", "l1_cache", "l2_cache",
                         "texture_memory", "cbu", "sram")},
        **{f"ecc.errors.uncorrected.{k}": ((), None, plain(lambda g, s, x: 0))
           for k in ("volatile.sram.parity", "volatile.sram.secded", "aggregate.sram.parity",
                     "aggregate.sram.secded", "aggregate.sram.l2", "aggregate.sram.sm",
                     "aggregate.sram.mcu", "aggregate.sram.pcie", "aggregate.sram.other")},
        "ecc.errors.uncorrected.aggregate.sram.thresholdExceeded": ((), None,
                                                                    plain(lambda g, s, x: "No")),
        "remapped_rows.histogram.max": ((), None, lambda g, s, x: (
            (str(remap_banks(g)),) * 2 if g.get("row_remap") else (NA, NA))),
        **{f"remapped_rows.histogram.{k}": ((), None, lambda g, s, x: (
            ("0", "0") if g.get("row_remap") else (NA, NA))) for k in ("high", "partial", "low",
                                                                     "none")},
        "power.management": ((), None, lambda g, s, x: (DEPRECATED, DEPRECATED)),
        **{f"module.{k}": ((), "W", lambda g, s, x: (NA, NA))
           for k in ("power.draw.average", "power.draw.instant", "power.limit",
                     "enforced.power.limit", "power.default_limit", "power.min_limit",
                     "power.max_limit")},
        "edpp_multiplier": ((), "%", lambda g, s, x: (
            ("100.00 %", "100.00") if hopper(g) else (NA, NA))),
        **{f"clocks.{k}": ((), "MHz", lambda g, s, x: (DEPRECATED, DEPRECATED))
           for k in ("applications.graphics", "applications.memory",
                     "default_applications.graphics", "default_applications.memory")},
        "gsp.mode.current": ((), None, plain(lambda g, s, x: "Enabled")),
        "gsp.mode.default": ((), None, plain(lambda g, s, x: "Enabled")),
        "c2c.mode": ((), None, lambda g, s, x: ("Disabled",) * 2 if hopper(g) else (NA, NA)),
        "protected_memory.total": ((), "MiB", mib(lambda g, s, x: 0)),
        "protected_memory.used": ((), "MiB", mib(lambda g, s, x: 0)),
        "protected_memory.free": ((), "MiB", mib(lambda g, s, x: 0)),
        "fabric.cliqueId": ((), None, plain(
            lambda g, s, x: 0 if x["fabric"][0] == "Completed" else "N/A")),
        "fabric.clusterUuid": ((), None, plain(
            lambda g, s, x: "00000000-0000-0000-0000-000000000000"
            if x["fabric"][0] == "Completed" else "N/A")),
        **{f"fabric.health.{k}": ((), None, plain(lambda g, s, x: "N/A"))
           for k in ("summary", "bandwidth", "route_recovery_in_progress", "route_unhealthy",
                     "access_timeout_recovery", "incorrect_configuration")},
        "platform.chassis_serial_number": ((), None, plain(lambda g, s, x: "")),
        "platform.slot_number": ((), None, plain(lambda g, s, x: 0)),
        "platform.tray_index": ((), None, plain(lambda g, s, x: 0)),
        "platform.host_id": ((), None, plain(lambda g, s, x: 1)),
        "platform.peer_type": ((), None, plain(lambda g, s, x: "Direct Connected")),
        "platform.module_id": ((), None, plain(lambda g, s, x: g["index"] + 1)),
        "platform.gpu_fabric_guid": ((), None, plain(lambda g, s, x: "0x0000000000000000")),
        "hostname": ((), None, lambda g, s, x: (NA, NA)),
        "mig.mode.current": ((), None, mig),
        "mig.mode.pending": ((), None, mig),
        "fabric.state": ((), None, plain(lambda g, s, x: x["fabric"][0])),
        "fabric.status": ((), None, plain(lambda g, s, x: x["fabric"][1])),
    }  # fmt: skip


def ecc_detail(kind: str, when: str, where: str):
    """ecc.errors.<kind>.<when>.<where>: DRAM counts are the fault's, SRAM 0, the rest [N/A]."""
    if where in ("device_memory", "dram"):
        key = f"ecc_{'sbe' if kind == 'corrected' else 'dbe'}_{'vol' if when == 'volatile' else 'agg'}"
        return lambda g, s, x: (str(s[key]),) * 2
    if where == "sram":
        return lambda g, s, x: ("0", "0")
    return lambda g, s, x: (NA, NA)


def hopper(g: dict) -> bool:
    return g["architecture"] in ("Hopper", "Blackwell")


def remap_banks(g: dict) -> int:
    """-q "Bank Remap Availability Histogram / Max": 2560 (H100), 3072 (H200), 192 (L40S)."""
    if g["architecture"] == "Ada Lovelace":
        return 192
    if hopper(g):
        return 3072 if g["memory_total_mib"] > 100000 else 2560
    return 640  # docs/unverified.md#gpusim-models


def _resolve_fields(fields: list, table: dict) -> list:
    by_name = {}
    for canonical, (aliases, _u, _f) in table.items():
        by_name[canonical] = canonical
        for a in aliases:
            by_name[a] = canonical
    out = []
    for f in fields:
        if f not in by_name:
            raise KeyError(f'Field "{f}" is not a valid field to query.')
        out.append(by_name[f])
    return out


def query_gpu(fields: list, gpus: list, st: dict, ctx: dict, noheader: bool, nounits: bool) -> str:
    table = _field_table()
    names = _resolve_fields(fields, table)
    lines = []
    if not noheader:
        heads = []
        for f in names:
            u = table[f][1]
            heads.append(f"{f} [{u}]" if u else f)
        lines.append(", ".join(heads))
    for g in gpus:
        s = c.gpu_sample(g, st, ctx["now"])
        vals = []
        for f in names:
            with_unit, without = table[f][2](g, s, ctx)
            vals.append(without if nounits else with_unit)
        lines.append(", ".join(vals))
    return "".join(line + "\n" for line in lines)


# --- --query-compute-apps ---------------------------------------------------------------------

APP_FIELDS = {"timestamp": "timestamp", "gpu_name": "gpu_name", "gpu_bus_id": "gpu_bus_id",
              "gpu_serial": "gpu_serial", "gpu_uuid": "gpu_uuid", "pid": "pid",
              "process_name": "process_name", "name": "process_name",
              "used_gpu_memory": "used_gpu_memory", "used_memory": "used_gpu_memory"}  # fmt: skip


def query_apps(fields: list, gpus: list, st: dict, noheader: bool, nounits: bool) -> str:
    names = []
    for f in fields:
        if f not in APP_FIELDS:
            raise KeyError(f'Field "{f}" is not a valid field to query.')
        names.append(APP_FIELDS[f])
    by_index = {g["index"]: g for g in gpus}
    lines = []
    if not noheader:
        lines.append(", ".join(f"{f} [MiB]" if f == "used_gpu_memory" else f for f in names))
    now = time.time()
    for job in st.get("jobs", []):
        g = by_index.get(job.get("gpu"))
        if g is None:
            continue
        vals = []
        for f in names:
            if f == "pid":
                vals.append(str(job["pid"]))
            elif f == "process_name":
                vals.append(job.get("process_name", "python3"))
            elif f == "used_gpu_memory":
                mib = int(job.get("used_memory_mib", 0))
                vals.append(str(mib) if nounits else f"{mib} MiB")
            elif f == "gpu_uuid":  # the physical GPU's UUID, on MIG too (H100 MIG capture)
                vals.append(g["uuid"])
            elif f == "gpu_bus_id":
                vals.append(g["pci_bus_id"])
            elif f == "gpu_name":
                vals.append(g["name"])
            elif f == "gpu_serial":
                vals.append(g["serial"])
            elif f == "timestamp":
                vals.append(csv_timestamp(now))
        lines.append(", ".join(vals))
    return "".join(line + "\n" for line in lines)


# --- -L ---------------------------------------------------------------------------------------


def listing(gpus: list) -> str:
    """``GPU 0: NAME (UUID: GPU-...)`` and, on a GPU in MIG mode, one ``  MIG <profile> Device N:``
    line per compute instance (H100/H200 MIG captures: profile padded to 11, index to 2)."""
    out = []
    for g in gpus:
        out.append(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})")
        for gi in c.mig_instances(g):
            for ci in gi["compute_instances"]:
                out.append(
                    f"  MIG {ci['profile']:<11} Device {ci['device']:>2}: (UUID: {ci['uuid']})"
                )
    return "".join(line + "\n" for line in out)


# --- the default table ------------------------------------------------------------------------

RULE89 = "+" + "-" * 89 + "+"
GPU_RULE = (
    "+-----------------------------------------+------------------------+----------------------+"
)
MIG_RULE = (
    "+------------------+----------------------------------+-----------+-----------------------+"
)


def _jobs_of(st: dict, gpus: list) -> list:
    indices = {g["index"] for g in gpus}
    return [j for j in st.get("jobs", []) if j.get("gpu") in indices]


def table(gpus: list, st: dict, ctx: dict) -> str:
    d, cuda = ctx["driver"], ctx["cuda"]
    out = [f"{ctime(ctx['now'])}       ", RULE89,
           f"| NVIDIA-SMI {d:<23}Driver Version: {d:<15}CUDA Version: {cuda:<9}|",
           GPU_RULE,
           "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
           "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
           "|                                         |                        |               MIG M. |",
           "|=========================================+========================+======================|"]  # fmt: skip
    mig_rows = []
    for g in gpus:
        s = c.gpu_sample(g, st, ctx["now"])
        pm = "On" if ctx["persistence"] else "Off"
        migged = c.mig_enabled(g)
        ecc = "On" if migged else str(s["ecc_dbe_vol"])
        out.append(
            f"| {g['index']:>3}  {g['name'][:31]:<31}{pm:<4}|   {g['pci_bus_id']} Off |{ecc:>21} |"
        )
        fan = "0%" if g.get("fan") else "N/A"
        pwr = f"{round(s['power_w'])}W / {g['power_limit_w']:>4}W"
        mem = f"{s['fb_used']}MiB / {s['fb_total']:>6}MiB"
        util = "N/A" if s["util"] is None else f"{s['util']}%"
        out.append(f"| {fan:>3}   {s['gpu_temp']:>2}C    {s['pstate']:<3}{pwr:>23} |{mem:>23} |"
                   f"{util:>8}      Default |")  # fmt: skip
        mig = ("Enabled" if migged else "Disabled") if g.get("mig_capable") else "N/A"
        out.append(
            f"|                                         |                        |{mig:>21} |"
        )
        out.append(GPU_RULE)
        for gi in c.mig_instances(g):
            inst = s["instances"].get(gi["gi_id"], {"used": 0})
            for ci in gi["compute_instances"]:
                mig_rows.append(
                    f"|{g['index']:>3}{gi['gi_id']:>5}{ci['ci_id']:>4}{ci['device']:>4}  |"
                    f"{str(inst['used']) + 'MiB':>19} / {str(gi['memory_mib']) + 'MiB':>8}    |"
                    f" {ci['sm']:<3}{0:>6} |{gi['ce']:>3}{gi['enc']:>4}{gi['dec']:>5}{gi['ofa']:>5}"
                    f"{gi['jpg']:>5} |"
                )
                mig_rows.append(
                    f"|                  |{'0MiB':>19} / {str(gi['bar1_mib']) + 'MiB':>8}    |"
                    "           |                       |"
                )
                mig_rows.append(MIG_RULE)
    if mig_rows:
        out += ["", RULE89,
                "| MIG devices:                                                                            |",
                MIG_RULE,
                "| GPU  GI  CI  MIG |              Shared Memory-Usage |        Vol|        Shared         |",
                "|      ID  ID  Dev |                Shared BAR1-Usage | SM     Unc| CE ENC  DEC  OFA  JPG |",
                "|                  |                                  |        ECC|                       |",
                "|==================+==================================+===========+=======================|"]  # fmt: skip
        out += mig_rows
    out += ["", RULE89,
            "| Processes:                                                                              |",
            "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
            "|        ID   ID                                                               Usage      |",
            "|" + "=" * 89 + "|"]  # fmt: skip
    by_index = {g["index"]: g for g in gpus}
    jobs = _jobs_of(st, gpus)
    if not jobs:
        out.append("|  No running processes found".ljust(90) + "|")
    for j in jobs:
        g = by_index[j["gpu"]]
        if c.mig_enabled(g) and c.mig_instances(g):  # H100/H200 MIG captures
            gi_id = j.get("gpu_instance", c.mig_instances(g)[0]["gi_id"])
            ids = f"  {gi_id:>3}  {0:>3}  {j['pid']:>15}"
        else:
            ids = f"   N/A  N/A  {j['pid']:>14}"
        out.append(f"|  {j['gpu']:>3}{ids}      C   {j.get('process_name', 'python3')[:35]:<35}"
                   f"{str(j.get('used_memory_mib', 0)) + 'MiB':>11} |")  # fmt: skip
    out.append(RULE89)
    out.append("")
    out.append(f"  ({c.SIM_NOTE})")  # after the real layout: see the gpusim README
    return "\n".join(out) + "\n"


# --- -q ---------------------------------------------------------------------------------------


class Report:
    """-q lines: keys indented 4 per level and padded to :data:`KEY_WIDTH`, then ``: value``."""

    def __init__(self) -> None:
        self.lines: list = []

    def kv(self, level: int, key: str, value) -> None:
        self.lines.append(f"{' ' * (4 * level) + key:<{KEY_WIDTH}}: {value}")

    def head(self, level: int, key: str) -> None:
        self.lines.append(" " * (4 * level) + key)


def _temps(r: Report, g: dict, s: dict, tlimit: bool) -> None:
    r.head(1, "Temperature")
    r.kv(2, "GPU Current Temp", f"{s['gpu_temp']} C")
    top = g.get("gpu_max_op_temp")
    mem = s["memory_temp"]
    if tlimit:  # R590: thresholds as margins to the T.Limit (the max operating temperature)
        r.kv(2, "GPU T.Limit Temp", "N/A" if top is None else f"{top - s['gpu_temp']} C")
        ref = top if top is not None else g["slowdown_temp"]
        r.kv(2, "GPU Shutdown T.Limit Temp", f"{ref - g['shutdown_temp']} C")
        r.kv(2, "GPU Slowdown T.Limit Temp", f"{ref - g['slowdown_temp']} C")
        r.kv(2, "GPU Max Operating T.Limit Temp", "N/A" if top is None else "0 C")
        r.kv(2, "GPU Target Temperature", "N/A")
        r.kv(2, "Memory Current Temp", "N/A" if mem is None else f"{mem} C")
        r.kv(2, "Memory Max Operating T.Limit Temp", "N/A" if mem is None else "0 C")
    else:  # docs/unverified.md#gpusim-smi-q-before-590
        r.kv(2, "GPU Shutdown Temp", f"{g['shutdown_temp']} C")
        r.kv(2, "GPU Slowdown Temp", f"{g['slowdown_temp']} C")
        r.kv(2, "GPU Max Operating Temp", "N/A" if top is None else f"{top} C")
        r.kv(2, "GPU Target Temperature", "N/A")
        r.kv(2, "Memory Current Temp", "N/A" if mem is None else f"{mem} C")
        mmax = g.get("mem_max_op_temp")
        r.kv(2, "Memory Max Operating Temp", "N/A" if mmax is None or mem is None else f"{mmax} C")


def _mig_devices(r: Report, g: dict, s: dict) -> None:
    for gi in c.mig_instances(g):
        inst = s["instances"].get(gi["gi_id"], {"used": 0, "free": gi["memory_mib"]})
        for ci in gi["compute_instances"]:
            r.head(1, "MIG Device")
            r.kv(2, "Index", ci["device"])
            r.kv(2, "GPU Instance ID", gi["gi_id"])
            r.kv(2, "Compute Instance ID", ci["ci_id"])
            r.head(2, "Device Attributes")
            r.head(3, "Shared")
            for key, v in (("Multiprocessor count", ci["sm"]), ("Copy Engine count", gi["ce"]),
                           ("Encoder count", gi["enc"]), ("Decoder count", gi["dec"]),
                           ("OFA count", gi["ofa"]), ("JPG count", gi["jpg"])):  # fmt: skip
                r.kv(4, key, v)
            r.head(2, "ECC Errors")
            r.head(3, "Volatile")
            r.kv(4, "SRAM Uncorrectable", 0)
            r.head(2, "Shared FB Memory Usage")
            r.kv(3, "Total", f"{gi['memory_mib']} MiB")
            r.kv(3, "Reserved", "0 MiB")
            r.kv(3, "Used", f"{inst['used']} MiB")
            r.kv(3, "Free", f"{inst['free']} MiB")
            r.head(2, "Shared BAR1 Memory")
            r.kv(3, "Total", f"{gi['bar1_mib']} MiB")
            r.kv(3, "Used", "0 MiB")
            r.kv(3, "Free", f"{gi['bar1_mib']} MiB")


def _ecc(r: Report, g: dict, s: dict) -> None:
    r.head(1, "ECC Errors")
    for part in ("Volatile", "Aggregate"):
        dbe = s["ecc_dbe_vol"] if part == "Volatile" else s["ecc_dbe_agg"]
        sbe = s["ecc_sbe_vol"] if part == "Volatile" else s["ecc_sbe_agg"]
        r.head(2, part)
        r.kv(3, "SRAM Correctable", 0)
        r.kv(3, "SRAM Uncorrectable Parity", 0)
        r.kv(3, "SRAM Uncorrectable SEC-DED", 0)
        r.kv(3, "DRAM Correctable", sbe)
        r.kv(3, "DRAM Uncorrectable", dbe)
        if part == "Aggregate":
            r.kv(3, "SRAM Threshold Exceeded", "No")
    r.head(2, "Aggregate Uncorrectable SRAM Sources")
    for key in ("SRAM L2", "SRAM SM", "SRAM Microcontroller", "SRAM PCIE", "SRAM Other"):
        r.kv(3, key, 0)
    r.kv(2, "Channel Repair Pending", "No")
    r.kv(2, "TPC Repair Pending", "No")
    r.kv(2, "Unrepairable Memory", "No" if hopper(g) else "N/A")  # L40S capture: N/A
    r.head(1, "Retired Pages")
    if g.get("row_remap"):
        for key in ("Single Bit ECC", "Double Bit ECC", "Pending Page Blacklist"):
            r.kv(2, key, "N/A")
    else:
        r.kv(2, "Single Bit ECC", s["retired_sbe"])
        r.kv(2, "Double Bit ECC", s["retired_dbe"])
        r.kv(2, "Pending Page Blacklist", "Yes" if s["retired_pending"] else "No")
    if not g.get("row_remap") or c.mig_enabled(g):
        r.kv(1, "Remapped Rows", "N/A")
        return
    r.head(1, "Remapped Rows")
    r.kv(2, "Correctable Error", s["correctable_remapped_rows"])
    if branch_of(r) >= 595:
        r.kv(2, "Inactive Correctable Error", 0)
    r.kv(2, "Uncorrectable Error", s["uncorrectable_remapped_rows"])
    if branch_of(r) >= 595:
        r.kv(2, "Inactive Uncorrectable Error", 0)
    r.kv(2, "Pending", "Yes" if s["row_remap_pending"] else "No")
    r.kv(2, "Remapping Failure Occurred", "Yes" if s["row_remap_failure"] else "No")
    r.head(2, "Bank Remap Availability Histogram")
    for key, v in (("Max", remap_banks(g)), ("High", 0), ("Partial", 0), ("Low", 0), ("None", 0)):
        r.kv(3, key, f"{v} bank(s)")


def branch_of(r: Report) -> int:
    return getattr(r, "branch", 0)


def _gpu_report(r: Report, g: dict, st: dict, ctx: dict) -> None:
    s = c.gpu_sample(g, st, ctx["now"])
    hopper = g["architecture"] in ("Hopper", "Blackwell")
    migged = c.mig_enabled(g)
    na = "N/A"
    r.lines.append(f"GPU {g['pci_bus_id']}")
    r.kv(1, "Product Name", g["name"])
    r.kv(1, "Product Brand", g.get("brand", "NVIDIA"))
    r.kv(1, "Product Architecture", g["architecture"])
    r.kv(1, "Display Mode", "Requested functionality has been deprecated")
    r.kv(1, "Display Attached", "Yes")
    r.kv(1, "Display Active", "Disabled")
    r.kv(1, "Persistence Mode", "Enabled" if ctx["persistence"] else "Disabled")
    r.kv(1, "Addressing Mode", "HMM" if g["architecture"] == "Ada Lovelace" else "None")
    r.head(1, "MIG Mode")
    mig = ("Enabled" if migged else "Disabled") if g.get("mig_capable") else na
    r.kv(2, "Current", mig)
    r.kv(2, "Pending", mig)
    _mig_devices(r, g, s)
    r.kv(1, "Accounting Mode", "Disabled")
    r.kv(1, "Accounting Mode Buffer Size", 4000)
    r.head(1, "Driver Model")
    r.kv(2, "Current", na)
    r.kv(2, "Pending", na)
    r.kv(1, "Serial Number", g["serial"])
    r.kv(1, "GPU UUID", g["uuid"])
    r.kv(1, "GPU PDI", "0x" + g["uuid"][4:12] + g["uuid"][13:17] + g["uuid"][18:22])
    r.kv(1, "Minor Number", g["index"])
    r.kv(1, "VBIOS Version", g["vbios_version"])
    r.kv(1, "MultiGPU Board", "No")
    r.kv(1, "Board ID", f"0x{int(g['pci_bus_id'][9:11], 16) << 8:x}")
    r.kv(1, "Board Part Number", g.get("board_part", na))
    r.kv(1, "GPU Part Number", g.get("gpu_part", na))
    r.kv(1, "FRU Part Number", na)
    r.head(1, "Platform Info")
    for key in ("Chassis Serial Number", "Slot Number", "Tray Index", "Host ID", "Peer Type"):
        r.kv(2, key, na)
    r.kv(2, "Module Id", g["index"] + 1)
    r.kv(2, "GPU Fabric GUID", na)
    r.head(1, "Inforom Version")
    r.kv(2, "Image Version", g["inforom"]["img"])
    r.kv(2, "OEM Object", g["inforom"]["oem"])
    r.kv(2, "ECC Object", g["inforom"]["ecc"])
    r.kv(2, "Power Management Object", na)
    r.head(1, "Inforom BBX Object Flush")
    r.kv(2, "Latest Timestamp", na)
    r.kv(2, "Latest Duration", na)
    r.head(1, "GPU Operation Mode")
    r.kv(2, "Current", na)
    r.kv(2, "Pending", na)
    r.kv(1, "GPU C2C Mode", "Disabled" if hopper else na)
    r.head(1, "GPU Virtualization Mode")
    r.kv(2, "Virtualization Mode", "None")
    r.kv(2, "Host VGPU Mode", na)
    r.kv(2, "vGPU Heterogeneous Mode", na)
    r.kv(1, "GPU Recovery Action", "None")
    r.kv(1, "GSP Firmware Version", ctx["driver"])
    r.head(1, "IBMNPU")
    r.kv(2, "Relaxed Ordering Mode", na)
    r.head(1, "PCI")
    bus = g["pci_bus_id"]
    r.kv(2, "Bus", "0x" + bus[9:11])
    r.kv(2, "Device", "0x" + bus[12:14])
    r.kv(2, "Domain", "0x" + bus[4:8])
    r.kv(2, "Base Classcode", "0x3")
    r.kv(2, "Sub Classcode", "0x2")
    r.kv(2, "Device Id", f"0x{g['pci_device_id']}10DE")
    r.kv(2, "Bus Id", bus)
    sub = g.get("pci_subsystem_id")
    r.kv(2, "Sub System Id", f"0x{sub}10DE" if sub else na)
    r.head(2, "GPU Link Info")
    r.head(3, "PCIe Generation")
    for key in ("Max", "Current", "Device Current", "Device Max"):
        r.kv(4, key, g["pcie_gen"])
    r.kv(4, "Host Max", na)
    r.head(3, "Link Width")
    r.kv(4, "Max", f"{g['pcie_width']}x")
    r.kv(4, "Current", f"{g['pcie_width']}x")
    r.head(2, "Bridge Chip")
    r.kv(3, "Type", na)
    r.kv(3, "Firmware", na)
    r.kv(2, "Replays Since Reset", s["pcie_replay"])
    r.kv(2, "Replay Number Rollovers", 0)
    r.kv(2, "Tx Throughput", f"{int(s['pcie_tx'] // 1024)} KB/s")
    r.kv(2, "Rx Throughput", f"{int(s['pcie_rx'] // 1024)} KB/s")
    r.kv(2, "Atomic Caps Outbound", na)
    r.kv(2, "Atomic Caps Inbound", na)
    r.kv(1, "Fan Speed", "0 %" if g.get("fan") else na)
    r.kv(1, "Performance State", s["pstate"])
    r.head(1, "Clocks Event Reasons")
    bits = s["clocks_event_reasons"]

    def active(bit: int) -> str:
        return "Active" if bits & bit else "Not Active"

    r.kv(2, "Idle", active(0x1))
    r.kv(2, "Applications Clocks Setting", active(0x2))
    r.kv(2, "SW Power Cap", active(0x4))
    r.kv(2, "HW Slowdown", active(0x8))
    r.kv(3, "HW Thermal Slowdown", active(0x40))
    r.kv(3, "HW Power Brake Slowdown", active(0x80))
    r.kv(2, "Sync Boost", active(0x10))
    r.kv(2, "SW Thermal Slowdown", active(0x20))
    r.kv(2, "Display Clock Setting", active(0x100))
    r.head(1, "Clocks Event Reasons Counters")
    for key in ("SW Power Capping", "Sync Boost", "SW Thermal Slowdown", "HW Thermal Slowdown",
                "HW Power Braking"):  # fmt: skip
        r.kv(2, key, "0 us")
    r.kv(1, "Sparse Operation Mode", "Disabled" if hopper else na)
    r.head(1, "FB Memory Usage")
    r.kv(2, "Total", f"{s['fb_total']} MiB")
    r.kv(2, "Reserved", f"{s['fb_reserved']} MiB")
    r.kv(2, "Used", f"{s['fb_used']} MiB")
    r.kv(2, "Free", f"{s['fb_free']} MiB")
    r.head(1, "BAR1 Memory Usage")
    r.kv(2, "Total", f"{g['bar1_mib']} MiB")
    r.kv(2, "Used", "1 MiB")
    r.kv(2, "Free", f"{g['bar1_mib'] - 1} MiB")
    r.head(1, "Conf Compute Protected Memory Usage")
    for key in ("Total", "Used", "Free"):
        r.kv(2, key, "0 MiB")
    r.kv(1, "Compute Mode", "Default")
    r.head(1, "Utilization")
    for key, v in (("GPU", s["util"]), ("Memory", s["mem_util"]), ("Encoder", 0), ("Decoder", 0),
                   ("JPEG", 0), ("OFA", 0)):  # fmt: skip
        r.kv(2, key, na if migged else f"{v} %")
    for block in ("Encoder Stats", "FBC Stats"):
        r.head(1, block)
        r.kv(2, "Active Sessions", 0)
        r.kv(2, "Average FPS", 0)
        r.kv(2, "Average Latency", 0)
    r.head(1, "DRAM Encryption Mode")
    r.kv(2, "Current", na)
    r.kv(2, "Pending", na)
    r.head(1, "ECC Mode")
    r.kv(2, "Current", "Enabled")
    r.kv(2, "Pending", "Enabled")
    _ecc(r, g, s)
    _temps(r, g, s, ctx["tlimit"])
    r.head(1, "GPU Power Readings")
    r.kv(2, "Average Power Draw", f"{s['power_w']:.2f} W")
    r.kv(2, "Instantaneous Power Draw", f"{s['power_w']:.2f} W")
    for key in ("Current Power Limit", "Requested Power Limit", "Default Power Limit"):
        r.kv(2, key, f"{g['power_limit_w']:.2f} W")
    r.kv(2, "Min Power Limit", f"{g['power_min_w']:.2f} W")
    r.kv(2, "Max Power Limit", f"{g['power_limit_w']:.2f} W")
    r.head(1, "GPU Memory Power Readings ")
    r.kv(2, "Average Power Draw", f"{s['power_w'] * 0.6:.2f} W" if hopper else na)
    r.kv(2, "Instantaneous Power Draw", na)
    r.head(1, "Module Power Readings")
    for key in ("Average Power Draw", "Instantaneous Power Draw", "Current Power Limit",
                "Requested Power Limit", "Default Power Limit", "Min Power Limit",
                "Max Power Limit"):  # fmt: skip
        r.kv(2, key, na)
    r.kv(1, "Power Smoothing", na)
    r.head(1, "Workload Power Profiles")
    r.kv(2, "Requested Profiles", na)
    r.kv(2, "Enforced Profiles", na)
    r.kv(1, "EDPp Multiplier", "100.00%" if hopper else na)
    r.head(1, "Clocks")
    r.kv(2, "Graphics", f"{s['sm_clock']} MHz")
    r.kv(2, "SM", f"{s['sm_clock']} MHz")
    r.kv(2, "Memory", f"{s['mem_clock']} MHz")
    r.kv(2, "Video", f"{s['video_clock']} MHz")
    for block in ("Applications Clocks", "Default Applications Clocks"):
        r.head(1, block)
        r.kv(2, "Graphics", "Requested functionality has been deprecated")
        r.kv(2, "Memory", "Requested functionality has been deprecated")
    r.head(1, "Deferred Clocks")
    r.kv(2, "Memory", na)
    r.head(1, "Max Clocks")
    r.kv(2, "Graphics", f"{g['max_sm_clock']} MHz")
    r.kv(2, "SM", f"{g['max_sm_clock']} MHz")
    r.kv(2, "Memory", f"{g['mem_clock']} MHz")
    r.kv(2, "Video", f"{g.get('max_video_clock', 1545)} MHz")
    r.head(1, "Max Customer Boost Clocks")
    r.kv(2, "Graphics", f"{g['max_sm_clock']} MHz")
    r.head(1, "Clock Policy")
    r.kv(2, "Auto Boost", na)
    r.kv(2, "Auto Boost Default", na)
    r.head(1, "Fabric")
    state, status = ctx["fabric"]
    r.kv(2, "State", state)
    r.kv(2, "Status", status)
    r.kv(2, "CliqueId", 0 if state == "Completed" else na)
    r.kv(2, "ClusterUUID", "00000000-0000-0000-0000-000000000000" if state == "Completed" else na)
    r.head(2, "Health")
    health = ["Summary", "Bandwidth", "Route Recovery in progress", "Route Unhealthy",
              "Access Timeout Recovery", "Incorrect Configuration"]  # fmt: skip
    if ctx["branch"] >= 595:
        health.append("Partition Assigned")
    for key in health:
        r.kv(3, key, na)
    jobs = [j for j in st.get("jobs", []) if j.get("gpu") == g["index"]]
    if not jobs:
        r.kv(1, "Processes", "None")
    else:
        r.head(1, "Processes")
        for j in jobs:
            gi = str(j.get("gpu_instance", c.mig_instances(g)[0]["gi_id"])) if migged else na
            r.kv(2, "GPU instance ID", gi)
            r.kv(2, "Compute instance ID", "0" if migged else na)
            r.kv(2, "Process ID", j["pid"])
            r.kv(2, "Type", "C")
            r.kv(2, "Name", j.get("process_name", "python3"))
            r.kv(2, "Used GPU Memory", f"{int(j.get('used_memory_mib', 0))} MiB")
    r.head(1, "Capabilities")
    r.kv(2, "EGM", "disabled")


def full_query(gpus: list, st: dict, ctx: dict) -> str:
    r = Report()
    r.branch = ctx["branch"]  # type: ignore[attr-defined]
    r.lines += ["", "==============NVSMI LOG==============", ""]
    r.kv(0, "Timestamp", ctime(ctx["now"]))
    r.kv(0, "Driver Version", ctx["driver"])
    r.kv(0, "CUDA Version", ctx["cuda"])
    r.lines.append("")
    r.kv(0, "Attached GPUs", len(gpus))
    for g in gpus:
        _gpu_report(r, g, st, ctx)
    r.lines += ["", "", f"# {c.SIM_NOTE}"]  # after the real layout: see the gpusim README
    return "\n".join(r.lines) + "\n"


# --- command line -----------------------------------------------------------------------------

USAGE = f"""NVIDIA System Management Interface -- {c.SIM_NOTE}

Supported here: (no args) table, -L, -q, -i ID, --query-gpu=F1,F2 --format=csv[,noheader][,nounits],
--query-compute-apps=pid,process_name,used_memory --format=csv[,noheader][,nounits], -pm 0|1,
--version.
"""


def _parse_format(fmt: str) -> tuple:
    parts = [p.strip() for p in fmt.split(",")]
    if "csv" not in parts or any(p not in ("csv", "noheader", "nounits") for p in parts):
        raise ValueError(f'"{fmt}" is not a valid format.')
    return ("noheader" in parts, "nounits" in parts)


def _select(gpus: list, ids: str | None) -> list:
    if ids is None:
        return gpus
    chosen = []
    for ident in ids.split(","):
        ident = ident.strip()
        match = [g for g in gpus if str(g["index"]) == ident or g["uuid"] == ident
                 or g["pci_bus_id"].lower() == ident.lower()]  # fmt: skip
        if not match:
            raise LookupError(f"No devices were found matching the identifier '{ident}'")
        chosen.extend(match)
    return chosen


def _parse(argv: list) -> dict:
    opts: dict = {"mode": "table", "ids": None, "format": None, "fields": None, "pm": None}
    i = 0
    while i < len(argv):
        a = argv[i]
        val = None
        if "=" in a and a.startswith("--"):
            a, val = a.split("=", 1)

        def take():
            nonlocal i
            if val is not None:  # noqa: B023 (called in this iteration)
                return val  # noqa: B023
            i += 1
            if i >= len(argv):
                raise ValueError(f"Option {a} requires a value.")  # noqa: B023
            return argv[i]

        if a in ("-h", "--help"):
            opts["mode"] = "help"
        elif a in ("--version",):
            opts["mode"] = "version"
        elif a in ("-L", "--list-gpus"):
            opts["mode"] = "list"
        elif a in ("-q", "--query"):
            opts["mode"] = "query"
        elif a in ("-i", "--id"):
            opts["ids"] = take()
        elif a in ("--query-gpu",):
            opts["mode"], opts["fields"] = "query-gpu", take()
        elif a in ("--query-compute-apps",):
            opts["mode"], opts["fields"] = "query-apps", take()
        elif a in ("--format",):
            opts["format"] = take()
        elif a in ("-d", "--display"):
            take()  # -q sections: the simulated -q always prints the whole report
        elif a in ("-pm", "--persistence-mode"):
            opts["mode"], opts["pm"] = "pm", take()
        else:
            raise ValueError(f'Invalid combination of input arguments. Please run "nvidia-smi -h" '
                             f"for help. (unknown option {a})")  # fmt: skip
        i += 1
    return opts


def main(argv: list) -> int:
    try:
        opts = _parse(argv)
    except ValueError as e:
        c.err(str(e))
        return EXIT_INVALID_ARG
    if opts["mode"] == "help":
        sys.stdout.write(USAGE)
        return 0
    lib = c.nvml_library_version() or "unknown"
    if opts["mode"] == "version":
        nvml = ".".join(lib.split(".")[:2])
        sys.stdout.write(f"NVIDIA-SMI version  : {lib}\nNVML version        : {nvml}\n"
                         f"DRIVER version      : {lib}\nCUDA Version        : {c.cuda_version()}\n"
                         f"({c.SIM_NOTE})\n")  # fmt: skip
        return 0
    try:
        loaded = c.nvml_init()
    except c.NvmlError as e:
        sys.stdout.write(e.message + "\n")
        return e.code
    hw = c.hardware()
    st = c.state()
    gpus = c.visible_gpus(hw, st)
    if not gpus:
        sys.stdout.write("No devices were found\n")
        return EXIT_NOT_FOUND
    try:
        gpus = _select(gpus, opts["ids"])
    except LookupError as e:
        sys.stdout.write(str(e) + "\n")
        return EXIT_NOT_FOUND
    driver = loaded["version"]
    ctx = {"driver": driver, "branch": branch(driver), "tlimit": branch(driver) >= 590,
           "cuda": c.cuda_version(), "count": len(gpus), "now": time.time(),
           "persistence": c.persistence_enabled(), "fabric": c.fabric_state()}  # fmt: skip
    mode = opts["mode"]
    if mode in ("query-gpu", "query-apps"):
        if not opts["format"]:
            c.err('"--format" is required when querying.')
            return EXIT_INVALID_ARG
        try:
            noheader, nounits = _parse_format(opts["format"])
        except ValueError as e:
            c.err(str(e))
            return EXIT_INVALID_ARG
        fields = [f.strip() for f in opts["fields"].split(",") if f.strip()]
        try:
            if mode == "query-gpu":
                text = query_gpu(fields, gpus, st, ctx, noheader, nounits)
            else:
                text = query_apps(fields, gpus, st, noheader, nounits)
        except KeyError as e:
            sys.stdout.write(e.args[0] + "\n")
            return EXIT_INVALID_ARG
        sys.stdout.write(text)
        return 0
    if mode == "list":
        sys.stdout.write(listing(gpus))
    elif mode == "query":
        sys.stdout.write(full_query(gpus, st, ctx))
    elif mode == "pm":
        if opts["pm"] not in ("0", "1"):
            c.err("Invalid value for persistence mode: use 0 or 1.")
            return EXIT_INVALID_ARG
        if c.in_real_root() and os.geteuid() != 0:
            sys.stdout.write("Unable to set persistence mode for GPUs: Insufficient Permissions\n")
            return 4
        c.write_text(c.PERSISTENCE_FILE, opts["pm"] + "\n")
        word = "Enabled" if opts["pm"] == "1" else "Disabled"
        for g in gpus:
            sys.stdout.write(f"{word} persistence mode for GPU {g['pci_bus_id']}.\n")
        sys.stdout.write("All done.\n")
    else:
        sys.stdout.write(table(gpus, st, ctx))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
