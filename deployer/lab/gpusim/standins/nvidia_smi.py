"""SIMULATED ``nvidia-smi``: the table, ``-L``, ``-q``, ``--query-gpu``, ``--query-compute-apps``
and ``-pm``, answered from the host's described GPUs, its fault state and the loaded module.

Every layout is the one real nvidia-smi prints (``../shared/gpu_reality_fixtures``:
``nvidia_gpu_exporter/*__590.48.01.txt``, ``*l40s__595.80.txt``, with MIG in ``*-mig__*``; R580's
``-q`` from the H200 580.173.02 capture proposed for it, tests/reality.py ``PROPOSED``): the
column widths of the table and its MIG devices block, ``-L`` with ``MIG <profile> Device N``
lines, ``-q``'s sections and 55-column key width, the CSV's units, ``[N/A]`` (not supported) and
``N/A`` (no sensor) forms. What differs by branch is in ``smi_format`` (``tlimit_temps``: R580 and
later print ``-q`` thresholds as T.Limit margins, ``GPU T.Limit Temp``; earlier ones absolute
thresholds; ``r590_deprecations``; ``inactive_remaps``). Fails like the real tool when the
driver is missing (exit 9) or when the user-space library was upgraded but the old module is still
loaded (exit 18, "Driver/library version mismatch" on stdout).

This module is the command line; each output has a module of its own: ``smi_query`` (the CSV
queries), ``smi_table`` (the table, ``-L``), ``smi_report`` (``-q``), ``smi_format`` (what they
share). The nvidia-smi package ships them all (``catalog.py``, ``add_tools(parts=...)``).
"""

import os
import sys
import time

if __package__:  # imported from the source tree (the tests, the package builder)
    from deployer.lab.gpusim.standins import common as c
    from deployer.lab.gpusim.standins.smi_format import branch, r610_layout
    from deployer.lab.gpusim.standins.smi_query import query_apps, query_gpu
    from deployer.lab.gpusim.standins.smi_report import full_query
    from deployer.lab.gpusim.standins.smi_table import listing, table
else:  # installed on a simulated host: the package ships gpusim_*.py
    import gpusim_common as c  # type: ignore[no-redef]
    from gpusim_smi_format import branch, r610_layout  # type: ignore[no-redef]
    from gpusim_smi_query import query_apps, query_gpu  # type: ignore[no-redef]
    from gpusim_smi_report import full_query  # type: ignore[no-redef]
    from gpusim_smi_table import listing, table  # type: ignore[no-redef]

EXIT_INVALID_ARG = 2
EXIT_NOT_FOUND = 6


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
        nvml, cuda = ".".join(lib.split(".")[:2]), c.cuda_version()
        if r610_layout(branch(lib)):
            versions = ('DRIVER version      : Deprecated, see "KMD version" instead\n'
                        'CUDA version        : Deprecated, see "CUDA UMD version" instead\n'
                        f"KMD version         : {lib}\nCUDA UMD version    : {cuda}\n")  # fmt: skip
        else:
            versions = f"DRIVER version      : {lib}\nCUDA Version        : {cuda}\n"
        sys.stdout.write(f"NVIDIA-SMI version  : {lib}\nNVML version        : {nvml}\n"
                         f"{versions}({c.SIM_NOTE})\n")  # fmt: skip
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
    ctx = {"driver": driver, "branch": branch(driver),
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
