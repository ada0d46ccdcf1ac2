"""SIMULATED ``nvidia-smi --query-gpu`` and ``--query-compute-apps``: the CSV fields, their
aliases and units, and the rows (names and forms as ``nvidia-smi --help-query-gpu`` of R590 lists
them; see ``nvidia_smi.py``).
"""

import time

if __package__:  # imported from the source tree (the tests, the package builder)
    from deployer.lab.gpusim.standins import common as c
    from deployer.lab.gpusim.standins.smi_format import (
        DEPRECATED,
        NA,
        NO_SENSOR,
        classic_power_smoothing,
        csv_timestamp,
        hopper,
        inactive_remaps,
        kmd_version,
        r590_deprecations,
        r610_layout,
        remap_banks,
    )
else:  # installed on a simulated host: the package ships gpusim_*.py
    import gpusim_common as c  # type: ignore[no-redef]
    from gpusim_smi_format import (  # type: ignore[no-redef]
        DEPRECATED,
        NA,
        NO_SENSOR,
        classic_power_smoothing,
        csv_timestamp,
        hopper,
        inactive_remaps,
        kmd_version,
        r590_deprecations,
        r610_layout,
        remap_banks,
    )


# --- --query-gpu ------------------------------------------------------------------------------


def field_table() -> dict:
    """canonical field -> (aliases, header unit or None, fn(gpu, sample, ctx) -> (with, without)).

    Names and aliases as ``nvidia-smi --help-query-gpu`` of R590 and R595 list them (those only
    some branches know: ``_BRANCH_FIELDS``); the header always names the canonical field, with
    its unit even under ``nounits`` (netdata's tesla-p100.csv).
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
        "kmd_version": ((), None, plain(lambda g, s, x: x["driver"])),
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
        **{f"remapped_rows.{k}_inactive": ((), None, na_unless(remap, plain(lambda g, s, x: 0)))
           for k in ("correctable", "uncorrectable")},
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
        "power.management": ((), None, lambda g, s, x: (
            (DEPRECATED,) * 2 if r590_deprecations(x["branch"]) else ("Enabled",) * 2)),
        **{f"module.{k}": ((), "W", lambda g, s, x: (NA, NA))
           for k in ("power.draw.average", "power.draw.instant", "power.limit",
                     "enforced.power.limit", "power.default_limit", "power.min_limit",
                     "power.max_limit")},
        "edpp_multiplier": ((), "%", lambda g, s, x: (
            ("100.00 %", "100.00") if hopper(g) else (NA, NA))),
        **{f"clocks.{k}": ((), "MHz", _application_clock(key))
           for k, key in (("applications.graphics", "max_sm_clock"),
                          ("applications.memory", "mem_clock"),
                          ("default_applications.graphics", "max_sm_clock"),
                          ("default_applications.memory", "mem_clock"))},
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
                     "access_timeout_recovery", "incorrect_configuration",
                     "partition_assigned")},
        "platform.chassis_serial_number": ((), None, plain(lambda g, s, x: "")),
        "platform.slot_number": ((), None, plain(lambda g, s, x: 0)),
        "platform.tray_index": ((), None, plain(lambda g, s, x: 0)),
        "platform.host_id": ((), None, plain(lambda g, s, x: 1)),
        "platform.peer_type": ((), None, plain(lambda g, s, x: "Direct Connected")),
        "platform.module_id": ((), None, plain(lambda g, s, x: g["index"] + 1)),
        "platform.gpu_fabric_guid": ((), None, plain(lambda g, s, x: "0x0000000000000000")),
        "hostname": ((), None, lambda g, s, x: (NA, NA)),
        # [N/A] on every simulated board, as on the H100/H200 captures (R580-R610):
        # docs/unverified.md#gpusim-power-smoothing
        **{f"power_smoothing.{k}": ((), u, lambda g, s, x: (NA, NA))
           for k, u in (*_CLASSIC_POWER_SMOOTHING, *_R610_POWER_SMOOTHING)},
        **{f"gpu.base.{k}": ((), "W", lambda g, s, x: (NA, NA))
           for k in ("current", "requested", "default", "min", "max")},
        "bbx.time_run": ((), "seconds", lambda g, s, x: (
            f"{s['time_run_s']} seconds", str(s["time_run_s"]))),
        "mig.mode.current": ((), None, mig),
        "mig.mode.pending": ((), None, mig),
        "fabric.state": ((), None, plain(lambda g, s, x: x["fabric"][0])),
        "fabric.status": ((), None, plain(lambda g, s, x: x["fabric"][1])),
    }  # fmt: skip


def _application_clock(key: str):
    """clocks.(default_)applications.*: deprecated from R590; before, the board's maximum."""

    def f(g, s, x):
        if r590_deprecations(x["branch"]):
            return (DEPRECATED, DEPRECATED)
        return (f"{g[key]} MHz", str(g[key]))

    return f


#: power_smoothing.<field> and its unit: R580/R590/R610 (not 595.80), then R610's own
_CLASSIC_POWER_SMOOTHING = (
    ("delayed_power_smoothing_supported", None), ("primary_power_floor", "W"),
    ("secondary_power_floor", "W"), ("min_primary_floor_activation_offset", "W"),
    ("min_primary_floor_activation_point", "W"), ("window_multiplier", "ms"),
    ("curr_profile.secondary_power_floor", "W"),
    ("curr_profile.primary_floor_act_window_multiplier", None),
    ("curr_profile.primary_floor_tar_window_multiplier", None),
    ("curr_profile.primary_floor_act_offset", "W"), ("admin_override.secondary_power_floor", "W"),
    ("admin_override.primary_floor_act_window_multiplier", None),
    ("admin_override.primary_floor_tar_window_multiplier", None),
    ("admin_override.primary_floor_act_offset", "W"),
)  # fmt: skip
_R610_POWER_SMOOTHING = (
    ("tmp_floor", "W"), ("tmp_ceil", "W"), ("hw_lifetime_remaining_percent", "%"),
    ("enabled", None), ("soc_power_smoothing_enabled", None), ("priv_level", None),
    ("imm_ramp_down", None), ("max_percent_tmp_floor", "%"), ("min_percent_tmp_floor", "%"),
    ("num_preset_profiles", None), ("curr_profile.percent_tmp_floor", "%"),
    ("curr_profile.ramp_up_rate", "W/s"), ("curr_profile.ramp_down_rate", "W/s"),
    ("curr_profile.ramp_down_hysteresis", "ms"), ("active_profile", None),
    ("admin_override.percent_tmp_floor", "%"), ("admin_override.ramp_up_rate", "W/s"),
    ("admin_override.ramp_down_rate", "W/s"), ("admin_override.ramp_down_hysteresis", "ms"),
)  # fmt: skip

# Query fields only some branches' nvidia-smi knows (smi_format): asked elsewhere, the field is
# refused as nvidia-smi refuses one it does not know.
_BRANCH_FIELDS = {
    "kmd_version": kmd_version,
    **{f"power_smoothing.{k}": classic_power_smoothing for k, _u in _CLASSIC_POWER_SMOOTHING},
    **{f"power_smoothing.{k}": r610_layout for k, _u in _R610_POWER_SMOOTHING},
    **{f"gpu.base.{k}": r610_layout for k in ("current", "requested", "default", "min", "max")},
    "bbx.time_run": r610_layout,
    "edpp_multiplier": r590_deprecations,
    "remapped_rows.correctable_inactive": inactive_remaps,
    "remapped_rows.uncorrectable_inactive": inactive_remaps,
    "fabric.health.partition_assigned": inactive_remaps,
}


def ecc_detail(kind: str, when: str, where: str):
    """ecc.errors.<kind>.<when>.<where>: DRAM counts are the fault's, SRAM 0, the rest [N/A]."""
    if where in ("device_memory", "dram"):
        key = f"ecc_{'sbe' if kind == 'corrected' else 'dbe'}_{'vol' if when == 'volatile' else 'agg'}"
        return lambda g, s, x: (str(s[key]),) * 2
    if where == "sram":
        return lambda g, s, x: ("0", "0")
    return lambda g, s, x: (NA, NA)


def _resolve_fields(fields: list, table: dict, branch: int) -> list:
    by_name = {}
    for canonical, (aliases, _u, _f) in table.items():
        known = _BRANCH_FIELDS.get(canonical)
        if known is not None and not known(branch):
            continue
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
    table = field_table()
    names = _resolve_fields(fields, table, ctx["branch"])
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
