"""SIMULATED ``nvidia-smi -q``: the report's sections and its 55-column key width, by driver
branch (``smi_format``: R580 and later print thresholds as T.Limit margins; see ``nvidia_smi.py``).
"""

if __package__:  # imported from the source tree (the tests, the package builder)
    from deployer.lab.gpusim.standins import common as c
    from deployer.lab.gpusim.standins.smi_format import (
        KEY_WIDTH,
        ctime,
        hopper,
        inactive_remaps,
        r590_deprecations,
        r610_layout,
        remap_banks,
        shared_mig_memory,
        tlimit_temps,
    )
else:  # installed on a simulated host: the package ships gpusim_*.py
    import gpusim_common as c  # type: ignore[no-redef]
    from gpusim_smi_format import (  # type: ignore[no-redef]
        KEY_WIDTH,
        ctime,
        hopper,
        inactive_remaps,
        r590_deprecations,
        r610_layout,
        remap_banks,
        shared_mig_memory,
        tlimit_temps,
    )


# --- -q ---------------------------------------------------------------------------------------


class Report:
    """-q lines: keys indented 4 per level and padded to :data:`KEY_WIDTH`, then ``: value``."""

    def __init__(self) -> None:
        self.lines: list = []

    def kv(self, level: int, key: str, value) -> None:
        self.lines.append(f"{' ' * (4 * level) + key:<{KEY_WIDTH}}: {value}")

    def head(self, level: int, key: str) -> None:
        self.lines.append(" " * (4 * level) + key)


def _temps(r: Report, g: dict, s: dict, branch: int) -> None:
    r.head(1, "Temperature")
    r.kv(2, "GPU Current Temp", f"{s['gpu_temp']} C")
    top = g.get("gpu_max_op_temp")
    mem = s["memory_temp"]
    if tlimit_temps(branch):  # margins to the T.Limit (the max operating temperature)
        # R610 names the limits "... Specification" and the margin "GPU Current T.Limit Temp"
        spec, current = (" Specification", " Current") if r610_layout(branch) else ("", "")
        r.kv(2, f"GPU{current} T.Limit Temp", "N/A" if top is None else f"{top - s['gpu_temp']} C")
        ref = top if top is not None else g["slowdown_temp"]
        r.kv(2, f"GPU Shutdown T.Limit Temp{spec}", f"{ref - g['shutdown_temp']} C")
        r.kv(2, f"GPU Slowdown T.Limit Temp{spec}", f"{ref - g['slowdown_temp']} C")
        r.kv(2, f"GPU Max Operating T.Limit Temp{spec}", "N/A" if top is None else "0 C")
        r.kv(2, f"GPU Target Temperature{spec}", "N/A")
        r.kv(2, "Memory Current Temp", "N/A" if mem is None else f"{mem} C")
        r.kv(2, f"Memory Max Operating T.Limit Temp{spec}", "N/A" if mem is None else "0 C")
    else:  # docs/unverified.md#gpusim-smi-q-before-580
        r.kv(2, "GPU Shutdown Temp", f"{g['shutdown_temp']} C")
        r.kv(2, "GPU Slowdown Temp", f"{g['slowdown_temp']} C")
        r.kv(2, "GPU Max Operating Temp", "N/A" if top is None else f"{top} C")
        r.kv(2, "GPU Target Temperature", "N/A")
        r.kv(2, "Memory Current Temp", "N/A" if mem is None else f"{mem} C")
        mmax = g.get("mem_max_op_temp")
        r.kv(2, "Memory Max Operating Temp", "N/A" if mmax is None or mem is None else f"{mmax} C")


def _mig_devices(r: Report, g: dict, s: dict, branch: int) -> None:
    shared = "Shared " if shared_mig_memory(branch) else ""
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
            r.head(2, f"{shared}FB Memory Usage")
            r.kv(3, "Total", f"{gi['memory_mib']} MiB")
            r.kv(3, "Reserved", "0 MiB")
            r.kv(3, "Used", f"{inst['used']} MiB")
            r.kv(3, "Free", f"{inst['free']} MiB")
            r.head(2, f"{shared}BAR1 Memory")
            r.kv(3, "Total", f"{gi['bar1_mib']} MiB")
            r.kv(3, "Used", "0 MiB")
            r.kv(3, "Free", f"{gi['bar1_mib']} MiB")


def _ecc(r: Report, g: dict, s: dict, branch: int) -> None:
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
    if inactive_remaps(branch):
        r.kv(2, "Inactive Correctable Error", 0)
    r.kv(2, "Uncorrectable Error", s["uncorrectable_remapped_rows"])
    if inactive_remaps(branch):
        r.kv(2, "Inactive Uncorrectable Error", 0)
    r.kv(2, "Pending", "Yes" if s["row_remap_pending"] else "No")
    r.kv(2, "Remapping Failure Occurred", "Yes" if s["row_remap_failure"] else "No")
    r.head(2, "Bank Remap Availability Histogram")
    for key, v in (("Max", remap_banks(g)), ("High", 0), ("Partial", 0), ("Low", 0), ("None", 0)):
        r.kv(3, key, f"{v} bank(s)")


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
    _mig_devices(r, g, s, ctx["branch"])
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
    if r610_layout(ctx["branch"]):
        r.head(1, "Inforom Time Data")
        r.kv(2, "Time Run", f"{s['time_run_s']} seconds")
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
    _ecc(r, g, s, ctx["branch"])
    _temps(r, g, s, ctx["branch"])
    r.head(1, "GPU Power Readings")
    r.kv(2, "Average Power Draw", f"{s['power_w']:.2f} W")
    r.kv(2, "Instantaneous Power Draw", f"{s['power_w']:.2f} W")
    limits = ("Current Power Limit", "Requested Power Limit", "Default Power Limit")
    if r610_layout(ctx["branch"]):
        r.head(2, "GPU Ceiling Power Limit")
        for key in limits:
            r.kv(3, key, f"{g['power_limit_w']:.2f} W")
        r.head(2, "GPU Base Power")
        for key in ("Current Base Power", "Requested Base Power", "Default Base Power"):
            r.kv(3, key, na)
    else:
        for key in limits:
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
    if r590_deprecations(ctx["branch"]):
        r.kv(1, "EDPp Multiplier", "100.00%" if hopper else na)
    r.head(1, "Clocks")
    r.kv(2, "Graphics", f"{s['sm_clock']} MHz")
    r.kv(2, "SM", f"{s['sm_clock']} MHz")
    r.kv(2, "Memory", f"{s['mem_clock']} MHz")
    r.kv(2, "Video", f"{s['video_clock']} MHz")
    deprecated = "Requested functionality has been deprecated"
    for block in ("Applications Clocks", "Default Applications Clocks"):
        r.head(1, block)
        if r590_deprecations(ctx["branch"]):
            r.kv(2, "Graphics", deprecated)
            r.kv(2, "Memory", deprecated)
        else:  # the default application clocks: the boards' maximum clocks
            r.kv(2, "Graphics", f"{g['max_sm_clock']} MHz")
            r.kv(2, "Memory", f"{g['mem_clock']} MHz")
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
    if inactive_remaps(ctx["branch"]):
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
    r.lines += ["", "==============NVSMI LOG==============", ""]
    r.kv(0, "Timestamp", ctime(ctx["now"]))
    if r610_layout(ctx["branch"]):
        gone = "[Deprecated; will be removed in CUDA 14.0. Use {} instead]"
        r.kv(0, "Driver Version", f"{ctx['driver']} {gone.format('KMD Version')}")
        r.kv(0, "CUDA Version", f"{ctx['cuda']} {gone.format('CUDA UMD Version')}")
        r.kv(0, "KMD Version", ctx["driver"])
        r.kv(0, "CUDA UMD Version", ctx["cuda"])
    else:
        r.kv(0, "Driver Version", ctx["driver"])
        r.kv(0, "CUDA Version", ctx["cuda"])
    r.lines.append("")
    r.kv(0, "Attached GPUs", len(gpus))
    for g in gpus:
        _gpu_report(r, g, st, ctx)
    r.lines += ["", "", f"# {c.SIM_NOTE}"]  # after the real layout: see the gpusim README
    return "\n".join(r.lines) + "\n"
