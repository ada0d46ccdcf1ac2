"""SIMULATED ``nvidia-smi``: the table, ``-L``, ``-q``, ``--query-gpu``, ``--query-compute-apps``
and ``-pm``, answered from the host's described GPUs, its fault state and the loaded module.

Fails like the real tool when the driver is missing (exit 9) or when the user-space library was
upgraded but the old module is still loaded (exit 18, "Driver/library version mismatch").
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


def _mem(v: int) -> tuple:
    return (f"{v} MiB", str(v))


def _field_table() -> dict:
    """query field -> (header unit or None, function(gpu, sample, ctx) -> (with unit, without))."""

    def plain(fn):
        return lambda g, s, x: (str(fn(g, s, x)),) * 2

    def on_off(b: bool) -> str:
        return "Enabled" if b else "Disabled"

    def mig(g, s, x):
        v = "Disabled" if g.get("mig_capable") else "[N/A]"
        return (v, v)

    def watts(v: float) -> tuple:
        return (f"{v:.2f} W", f"{v:.2f}")

    def pct(v: int) -> tuple:
        return (f"{v} %", str(v))

    def mhz(v: int) -> tuple:
        return (f"{v} MHz", str(v))

    fields = {
        "index": (None, plain(lambda g, s, x: g["index"])),
        "uuid": (None, plain(lambda g, s, x: g["uuid"])),
        "gpu_uuid": (None, plain(lambda g, s, x: g["uuid"])),
        "name": (None, plain(lambda g, s, x: g["name"])),
        "gpu_name": (None, plain(lambda g, s, x: g["name"])),
        "serial": (None, plain(lambda g, s, x: g["serial"])),
        "vbios_version": (None, plain(lambda g, s, x: g["vbios_version"])),
        "count": (None, plain(lambda g, s, x: x["count"])),
        "driver_version": (None, plain(lambda g, s, x: x["driver"])),
        "compute_cap": (None, plain(lambda g, s, x: g["compute_cap"])),
        "pci.bus_id": (None, plain(lambda g, s, x: g["pci_bus_id"])),
        "gpu_bus_id": (None, plain(lambda g, s, x: g["pci_bus_id"])),
        "pci.device_id": (None, plain(lambda g, s, x: f"0x{g['pci_device_id']}10DE")),
        "pcie.link.gen.current": (None, plain(lambda g, s, x: g["pcie_gen"])),
        "pcie.link.gen.max": (None, plain(lambda g, s, x: g["pcie_gen"])),
        "pcie.link.width.current": (None, plain(lambda g, s, x: g["pcie_width"])),
        "memory.total": ("MiB", lambda g, s, x: _mem(s["fb_total"])),
        "memory.reserved": ("MiB", lambda g, s, x: _mem(s["fb_reserved"])),
        "memory.used": ("MiB", lambda g, s, x: _mem(s["fb_used"])),
        "memory.free": ("MiB", lambda g, s, x: _mem(s["fb_free"])),
        "temperature.gpu": (None, plain(lambda g, s, x: s["gpu_temp"])),
        "temperature.memory": (None, plain(lambda g, s, x: s["memory_temp"])),
        "power.draw": ("W", lambda g, s, x: watts(s["power_w"])),
        "power.limit": ("W", lambda g, s, x: watts(float(g["power_limit_w"]))),
        "enforced.power.limit": ("W", lambda g, s, x: watts(float(g["power_limit_w"]))),
        "utilization.gpu": ("%", lambda g, s, x: pct(s["util"])),
        "utilization.memory": ("%", lambda g, s, x: pct(s["mem_util"])),
        "clocks.sm": ("MHz", lambda g, s, x: mhz(s["sm_clock"])),
        "clocks.current.sm": ("MHz", lambda g, s, x: mhz(s["sm_clock"])),
        "clocks.mem": ("MHz", lambda g, s, x: mhz(s["mem_clock"])),
        "clocks.max.sm": ("MHz", lambda g, s, x: mhz(g["max_sm_clock"])),
        "pstate": (None, plain(lambda g, s, x: s["pstate"])),
        "fan.speed": ("%", lambda g, s, x: ("[N/A]", "[N/A]")),
        "persistence_mode": (None, plain(lambda g, s, x: on_off(x["persistence"]))),
        "compute_mode": (None, plain(lambda g, s, x: "Default")),
        "mig.mode.current": (None, mig),
        "mig.mode.pending": (None, mig),
        "ecc.mode.current": (None, plain(lambda g, s, x: "Enabled")),
        "ecc.errors.corrected.volatile.total": (None, plain(lambda g, s, x: s["ecc_sbe_vol"])),
        "ecc.errors.uncorrected.volatile.total": (None, plain(lambda g, s, x: s["ecc_dbe_vol"])),
        "ecc.errors.uncorrected.aggregate.total": (None, plain(lambda g, s, x: s["ecc_dbe_agg"])),
        "retired_pages.pending": (None, plain(
            lambda g, s, x: "[N/A]" if g["row_remap"] else ("Yes" if s["retired_pending"] else "No"))),
        "fabric.state": (None, plain(lambda g, s, x: x["fabric"][0])),
        "fabric.status": (None, plain(lambda g, s, x: x["fabric"][1])),
        "timestamp": (None, plain(lambda g, s, x: time.strftime("%Y/%m/%d %H:%M:%S.000"))),
    }  # fmt: skip
    return fields


APP_FIELDS = ("pid", "process_name", "used_memory", "gpu_uuid", "gpu_bus_id", "gpu_name", "name",
              "used_gpu_memory", "timestamp")  # fmt: skip


def _parse_format(fmt: str) -> tuple:
    parts = [p.strip() for p in fmt.split(",")]
    if parts[0] != "csv" or any(p not in ("csv", "noheader", "nounits") for p in parts):
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


def query_gpu(fields: list, gpus: list, st: dict, ctx: dict, noheader: bool, nounits: bool) -> str:
    table = _field_table()
    for f in fields:
        if f not in table:
            raise KeyError(f'Field "{f}" is not a valid field to query.')
    lines = []
    if not noheader:
        heads = []
        for f in fields:
            unit = table[f][0]
            heads.append(f"{f} [{unit}]" if unit else f)
        lines.append(", ".join(heads))
    for g in gpus:
        s = c.gpu_sample(g, st)
        vals = []
        for f in fields:
            with_unit, without = table[f][1](g, s, ctx)
            vals.append(without if nounits else with_unit)
        lines.append(", ".join(vals))
    return "".join(line + "\n" for line in lines)


def query_apps(fields: list, gpus: list, st: dict, noheader: bool, nounits: bool) -> str:
    for f in fields:
        if f not in APP_FIELDS:
            raise KeyError(f'Field "{f}" is not a valid field to query.')
    by_index = {g["index"]: g for g in gpus}
    lines = []
    if not noheader:
        lines.append(", ".join(f"{f} [MiB]" if f in ("used_memory", "used_gpu_memory") else f
                               for f in fields))  # fmt: skip
    for job in st.get("jobs", []):
        g = by_index.get(job.get("gpu"))
        if g is None:
            continue
        vals = []
        for f in fields:
            if f == "pid":
                vals.append(str(job["pid"]))
            elif f in ("process_name", "name"):
                vals.append(job.get("process_name", "python3"))
            elif f in ("used_memory", "used_gpu_memory"):
                mib = int(job.get("used_memory_mib", 0))
                vals.append(str(mib) if nounits else f"{mib} MiB")
            elif f == "gpu_uuid":
                vals.append(g["uuid"])
            elif f == "gpu_bus_id":
                vals.append(g["pci_bus_id"])
            elif f == "gpu_name":
                vals.append(g["name"])
            elif f == "timestamp":
                vals.append(time.strftime("%Y/%m/%d %H:%M:%S.000"))
        lines.append(", ".join(vals))
    return "".join(line + "\n" for line in lines)


def listing(gpus: list) -> str:
    return "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in gpus)


def table(gpus: list, st: dict, ctx: dict) -> str:
    w = 89
    out = [time.strftime("%a %b %d %H:%M:%S %Y"),
           "+" + "-" * w + "+",
           "| " + f"NVIDIA-SMI {ctx['driver']:<22}Driver Version: {ctx['driver']:<15}"
           f"CUDA Version: {ctx['cuda']:<9}".ljust(w - 1) + "|",
           "+-----------------------------------------+------------------------+----------------------+",
           "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
           "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
           "|                                         |                        |               MIG M. |",
           "|=========================================+========================+======================|"]  # fmt: skip
    for g in gpus:
        s = c.gpu_sample(g, st)
        pm = "On" if ctx["persistence"] else "Off"
        mig = "Disabled" if g.get("mig_capable") else "N/A"
        name = g["name"][:28]
        out.append(f"| {g['index']:>3}  {name:<28}{pm:>5}  |   {g['pci_bus_id']} Off |"
                   f" {s['ecc_dbe_vol']:>20} |")  # fmt: skip
        pwr = f"{round(s['power_w'])}W /  {g['power_limit_w']}W"
        mem = f"{s['fb_used']}MiB /  {s['fb_total']}MiB"
        out.append(f"| N/A   {s['gpu_temp']:>2}C    {s['pstate']:<3}{pwr:>23} |{mem:>23} |"
                   f"{str(s['util']) + '%':>8}      Default |")  # fmt: skip
        out.append(
            f"|                                         |                        |{mig:>21} |"
        )
        out.append(
            "+-----------------------------------------+------------------------+----------------------+"
        )
    out.append("")
    out.append("+" + "-" * w + "+")
    out.append("| Processes:".ljust(w + 1) + "|")
    out.append(
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |"
    )
    out.append(
        "|        ID   ID                                                               Usage      |"
    )
    out.append("|" + "=" * w + "|")
    jobs = [j for j in st.get("jobs", []) if j.get("gpu") in {g["index"] for g in gpus}]
    if not jobs:
        out.append("|  No running processes found".ljust(w + 1) + "|")
    for j in jobs:
        out.append(f"|  {j['gpu']:>3}   N/A  N/A  {j['pid']:>13}      C   {j.get('process_name', 'python3'):<36}"
                   f"{str(j.get('used_memory_mib', 0)) + 'MiB':>10} |")  # fmt: skip
    out.append("+" + "-" * w + "+")
    out.append(f"  ({c.SIM_NOTE})")
    return "\n".join(out) + "\n"


def full_query(gpus: list, st: dict, ctx: dict) -> str:
    out = ["", "==============NVSMI LOG==============", "",
           f"{'Timestamp':<42}: {time.strftime('%a %b %d %H:%M:%S %Y')}",
           f"{'Driver Version':<42}: {ctx['driver']}",
           f"{'CUDA Version':<42}: {ctx['cuda']}", "",
           f"{'Attached GPUs':<42}: {len(gpus)}"]  # fmt: skip
    for g in gpus:
        s = c.gpu_sample(g, st)
        mig = "Disabled" if g.get("mig_capable") else "N/A"

        def kv(k, v, ind=4):
            out.append(f"{' ' * ind}{k:<{42 - ind}}: {v}")

        out.append(f"GPU {g['pci_bus_id']}")
        kv("Product Name", g["name"])
        kv("Product Architecture", g["architecture"])
        kv("Persistence Mode", "Enabled" if ctx["persistence"] else "Disabled")
        out.append("    MIG Mode")
        kv("Current", mig, 8)
        kv("Pending", mig, 8)
        kv("Serial Number", g["serial"])
        kv("GPU UUID", g["uuid"])
        kv("Minor Number", g["index"])
        kv("VBIOS Version", g["vbios_version"])
        out.append("    Fabric")
        kv("State", ctx["fabric"][0], 8)
        kv("Status", ctx["fabric"][1], 8)
        out.append("    PCI")
        kv("Bus Id", g["pci_bus_id"], 8)
        out.append("    FB Memory Usage")
        kv("Total", f"{s['fb_total']} MiB", 8)
        kv("Reserved", f"{s['fb_reserved']} MiB", 8)
        kv("Used", f"{s['fb_used']} MiB", 8)
        kv("Free", f"{s['fb_free']} MiB", 8)
        out.append("    Temperature")
        kv("GPU Current Temp", f"{s['gpu_temp']} C", 8)
        kv("GPU Slowdown Temp", f"{g['slowdown_temp']} C", 8)
        kv("GPU Shutdown Temp", f"{g['shutdown_temp']} C", 8)
        kv("Memory Current Temp", f"{s['memory_temp']} C", 8)
        kv("Memory Max Operating Temp", f"{g['mem_max_op_temp']} C", 8)
        out.append("    GPU Power Readings")
        kv("Power Draw", f"{s['power_w']:.2f} W", 8)
        kv("Current Power Limit", f"{g['power_limit_w']:.2f} W", 8)
    out.append("")
    out.append(f"# {c.SIM_NOTE}")
    return "\n".join(out) + "\n"


USAGE = f"""NVIDIA System Management Interface -- {c.SIM_NOTE}

Supported here: (no args) table, -L, -q, -i ID, --query-gpu=F1,F2 --format=csv[,noheader][,nounits],
--query-compute-apps=pid,process_name,used_memory --format=csv[,noheader][,nounits], -pm 0|1,
--version.
"""


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
            take()  # -q sections: the simulated -q always prints its one short report
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
        sys.stdout.write(f"NVIDIA-SMI version  : {lib}\nNVML version        : {lib}\n"
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
    ctx = {"driver": loaded["version"], "cuda": c.cuda_version(), "count": len(gpus),
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
