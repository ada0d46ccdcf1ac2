"""SIMULATED ``dcgmi``: ``discovery -l [-a]``, ``health -s/-f/-c [-j]``, ``diag -r N [-j]`` and
``-v``, asking the simulated host engine (``--host``, default localhost:5555) like the real one.

The text is laid out by the same rules as NVIDIA/DCGM's (tag v4.6.0, 51b65ccebf9d): tables of
``dcgmi/DcgmiOutput.cpp`` (``DcgmiOutputColumns`` / ``DcgmiOutputTree``), ``dcgmi/Query.cpp``
(``N GPUs found.`` up to 4.4.x, ``N GPU(s) found (Active).`` / ``(All)`` from 4.5.0 with a Note when
GPUs are hidden), ``dcgmi/Health.cpp`` and ``dcgmi/Diag.cpp``. The exit status is the
``dcgmReturn_t`` that ``main`` returns (``dcgmi/main_dcgmi.cpp:83``), taken modulo 256:

- 0 when the command ran -- ``health -c`` included, whatever the health (``Health.cpp:389-391``);
- 226 (DCGM_ST_NVVS_ERROR, -30) when a diagnostic test failed, 205 (DCGM_ST_NVVS_ISOLATE_ERROR,
  -51) when the failure's error code has isolate priority (``Diag.cpp:248-293``); 226 too
  when nvvs cannot load the plugins of the driver's CUDA major (no ``-cuda<N>`` package: its
  message is the response's system error, ``Diag.cpp:436-477``);
- 235 (DCGM_ST_CONNECTION_NOT_VALID, -21) without a host engine (``Command.cpp:83-105``);
- 253 (DCGM_ST_GENERIC_ERROR, -3) for ``health -c`` before any watch is set (``Health.cpp:383``);
- 2 for bad usage (the simulation's; real dcgmi's parser prints its usage).

A ``dcgmi`` of another DCGM release than the running host engine connects and is answered by that
engine: DCGM has no release handshake. The client's connect succeeds once the socket does
(``dcgmlib/src/DcgmClientHandler.cpp:274-284``); the engine's build string it asks for is kept for
a debug log only (``PopulateConnectionAttributes``, ``:475-508``); the engine checks only the
login message's struct version (``modules/core/DcgmModuleCore.cpp:1756-1781``), a struct unchanged
from v4.2.3 to v4.6.0. A call whose message struct differs in size or revision between the two
releases fails alone with DCGM_ST_VER_MISMATCH (-12, ``modules/DcgmModule.cpp:33-38``); which
subcommands do between which releases is not simulated (docs/unverified.md#dcgm-version-skew).
"""

import sys

if __package__:  # imported from the source tree (the tests, the package builder)
    from deployer.lab.gpusim.standins import common as c
else:  # installed on a simulated host: the package ships gpusim_common.py
    import gpusim_common as c  # type: ignore[no-redef]

EXIT_BAD_ARGS = 2
ST_GENERIC_ERROR = 256 - 3
ST_CONNECTION_NOT_VALID = 256 - 21
ST_NVVS_ERROR = 256 - 30
ST_NVVS_ISOLATE_ERROR = 256 - 51


# --- DcgmiOutputColumns (DcgmiOutput.cpp:384-533) ---------------------------------------------


def _hline(widths: list, ch: str = "-") -> str:
    return "+" + "+".join(ch * w for w in widths) + "+\n"


def _row(widths: list, cells: list) -> str:
    parts = [f"{cell:<{w - 2}}" for w, cell in zip(widths, cells, strict=True)]
    return "| " + " | ".join(parts) + " |\n"


def columns(widths: list, labels: list, sections: list, separate: bool) -> str:
    """A DcgmiOutputColumns table: each section is a list of rows (first, then overflow)."""
    out = _hline(widths) + _row(widths, labels) + _hline(widths)
    for n, rows in enumerate(sections):
        if n and separate:
            out += _hline(widths)
        for cells in rows:
            out += _row(widths, cells)
    return out + _hline(widths)


def discovery(reply: dict, version: str, show_all: bool) -> str:
    gpus = reply["gpus"]
    total = len(gpus)
    active_style = c.version_tuple(version) >= (4, 5, 0)
    if active_style and not show_all:
        gpus = [g for g in gpus if g.get("status", "OK") == "OK"]
    sections = []
    for g in gpus:
        lost = g.get("status", "OK") != "OK"
        suffix = " (last known)" if lost and active_style else ""
        info = []
        if show_all and lost:
            info.append(f"Status: {g['status']}")
        info += [f"Name: {g['name']}{suffix}", f"PCI Bus ID: {g['pci_bus_id']}{suffix}",
                 f"Device UUID: {g['uuid']}"]  # fmt: skip
        sections.append([[str(g["index"]) if n == 0 else "", text] for n, text in enumerate(info)])
    n = len(gpus)
    if active_style:  # Query.cpp:281-286 @v4.6.0
        out = f"{n} GPU{'' if n == 1 else 's'} found ({'All' if show_all else 'Active'}).\n"
        if not show_all and n != total:
            out += "Note: Use -a flag to show all GPUs, including those that are not active.\n"
    else:  # Query.cpp:192 @v4.4.2
        out = f"{n} GPU{'' if n == 1 else 's'} found.\n"
    out += columns([8, 70], ["GPU ID", "Device Information"], sections, separate=True)
    switches = reply["nvswitches"]
    out += f"{len(switches)} NvSwitch{'' if len(switches) == 1 else 'es'} found.\n"
    out += columns([11], ["Switch ID"], [[[str(sw["index"])]] for sw in switches], separate=False)
    out += "0 ConnectX found.\n" + columns([10], ["ConnectX"], [], separate=False)
    out += "0 CPUs found.\n" + columns([8, 70], ["CPU ID", "Device Information"], [], separate=True)
    return out


# --- DcgmiOutputTree (DcgmiOutput.cpp:255-380), Health.cpp ------------------------------------

TREE_LEFT, TREE_RIGHT = 28, 60  # Health::CheckWatches: DcgmiOutputTree outTree(28, 60)
MAX_HEALTH_INFO = 54  # Health.cpp MAX_SIZE_OF_HEALTH_INFO
# Health::HelperSystemToString (Health.cpp:408-437); "ALL" (no one system) is its default
SYSTEM_NAMES = {"PCIe": "PCIe system", "NVLINK": "NVLINK system", "PMU": "PMU system",
                "MCU": "MCU system", "Memory": "Memory system", "SM": "SM system",
                "InfoROM": "InfoROM system", "Thermal": "Thermal system", "Power": "Power system",
                "Driver": "Driver", "ConnectX": "ConnectX system", "ALL": "Internal error"}  # fmt: skip


def _tree_row(level: int, prefix: str, label: str, value: str) -> str:
    left = f"{prefix:>{level * 3}}{label}" if level else label
    return f"| {left:<{TREE_LEFT - 3}} | {value:<{TREE_RIGHT - 4}} |\n"


def _wrap_health(msg: str) -> list:
    """Health::AddErrorMessage: break at word ends so each piece fits MAX_SIZE_OF_HEALTH_INFO."""
    msg = msg.replace("\n", " ")
    if len(msg) <= MAX_HEALTH_INFO:
        return [msg]
    parts, start, p = [], 0, 0
    while start < len(msg):
        p += MAX_HEALTH_INFO
        if p >= len(msg):
            p = len(msg) - 1
        elif p != len(msg) - 1:
            while msg[p] != " ":
                if msg[p + 1] in " .,/":
                    break
                p -= 1
            while msg[p] == " ":
                p -= 1
        while start < len(msg) and msg[start] == " ":
            start += 1
        if start >= len(msg):
            break
        parts.append(msg[start : p + 1])
        start = p + 2
    return parts


_RANK = {"Healthy": 0, "Warning": 1, "Failure": 2}


def _worst(incidents: list) -> str:
    return max((i["health"] for i in incidents), key=_RANK.get, default="Healthy")


def health_tree(incidents: list) -> list:
    """The report's entities as ``Health::HandleOneEntity`` builds them (``Health.cpp:279-328``):
    per GPU (in the incidents' order) its worst health and its systems, each with its worst
    health and its messages joined by ``", "`` (``AppendSystemIncidents``) and cut into pieces
    (``AddErrorMessage``): ``[(gpu, health, [(system name, health, pieces)])]``."""
    by_gpu: dict = {}
    for inc in incidents:
        by_gpu.setdefault(inc["gpu"], {}).setdefault(inc["system"], []).append(inc)
    return [
        (gpu, _worst([i for group in systems.values() for i in group]), [
            (SYSTEM_NAMES.get(system, "Internal error"), _worst(group),
             _wrap_health(", ".join(i["message"] for i in group)))
            for system, group in systems.items()
        ])
        for gpu, systems in by_gpu.items()
    ]  # fmt: skip


def health_report(incidents: list) -> tuple:
    """(text, overall) of ``dcgmi health -c``; overall is Healthy, Warning or Failure."""
    overall = _worst(incidents)
    widths = [TREE_LEFT - 1, TREE_RIGHT - 2]
    out = _hline(widths)
    out += f"| {'Health Monitor Report':<{TREE_LEFT + TREE_RIGHT - 3}}|\n"
    out += _hline(widths, "=")
    out += _tree_row(0, "", "Overall Health", overall)
    tree = health_tree(incidents)
    if tree:
        out += _tree_row(0, "", "GPU", "")
    for gpu, worst, systems in tree:
        out += _tree_row(1, "-> ", str(gpu), worst)
        out += _tree_row(2, "-> ", "Errors", "")
        for name, health, pieces in systems:
            out += _tree_row(3, "-> ", name, health)
            for piece in pieces:
                out += _tree_row(3, "", "", piece)
    return out + _hline(widths), overall


def health_json(incidents: list, overall: str) -> str:
    """``dcgmi health -c -j``: the same report as the tree, through ``DcgmiOutputJson``
    (``dcgmi/DcgmiOutput.cpp:79,206,222``, ``DcgmiOutput.h:266-280``): a header list, then under
    ``body`` each section a box of ``value``, ``overflow`` (the message's pieces, as the tree
    wraps them) and ``children``; ``GPU`` -> entity -> ``Errors`` -> system
    (``Health::HandleOneEntity``, ``Health.cpp:279-328``; no ``GPU`` section when healthy).
    Printed as jsoncpp's ``toStyledString`` prints it (``common.jsoncpp_styled``)."""
    body: dict = {"Overall Health": {"value": overall}}
    for gpu, worst, systems in health_tree(incidents):
        errors = {name: {"value": health, "overflow": pieces} for name, health, pieces in systems}
        entity = {"value": worst, "children": {"Errors": {"children": errors}}}
        body.setdefault("GPU", {"children": {}})["children"][str(gpu)] = entity
    return c.jsoncpp_styled({"body": body, "header": ["Health Monitor Report"]})


# --- Diag.cpp ---------------------------------------------------------------------------------

DIAG_RULE = "+---------------------------+------------------------------------------------+\n"
DIAG_HEADER = (DIAG_RULE + "| Diagnostic                | Result                                         |\n"
               "+===========================+================================================+\n")  # fmt: skip
DIAG_CATEGORIES = (
    ("Deployment", "|-----  Deployment  --------+------------------------------------------------|\n"),
    ("Hardware", "+-----  Hardware  ----------+------------------------------------------------+\n"),
    ("Integration", "+-----  Integration  -------+------------------------------------------------+\n"),
    ("Stress", "+-----  Stress  ------------+------------------------------------------------+\n"),
)  # fmt: skip
#: nvvs/include/PluginStrings.h @v4.6.0: *_PLUGIN_CATEGORY
TEST_CATEGORY = {"software": "Deployment", "pcie": "Integration", "memory": "Hardware",
                 "diagnostic": "Hardware", "pulse_test": "Hardware", "memory_bandwidth": "Stress",
                 "targeted_stress": "Stress", "targeted_power": "Stress", "memtest": "Stress"}  # fmt: skip
INFO_LEN = 45  # Diag.cpp DATA_INFO_TAG_LEN


def _data(name: str, info: str) -> str:
    """One DIAG_DATA stencil line (CommandOutputController::ReplaceTag: pad, or cut with ...)."""

    def fit(text: str, width: int) -> str:
        return text.ljust(width) if len(text) <= width else text[: width - 3] + "..."

    return f"| {fit(name, 25)} | {fit(info, 46)} |\n"


def diag_report(res: dict) -> str:
    out = "Successfully ran diagnostic for group.\n" + DIAG_HEADER
    out += "|-----  Metadata  ----------+------------------------------------------------|\n"
    out += _data("DCGM Version", res["dcgm_version"])
    if res["driver"]:
        out += _data("Driver Version Detected", res["driver"])
    if res["entities"]:
        out += _data("GPU Device IDs Detected", ", ".join(e["device_id"] for e in res["entities"]))
    for category, banner in DIAG_CATEGORIES:
        tests = [t for t in res["tests"] if TEST_CATEGORY.get(t["name"]) == category]
        if not tests:
            continue
        out += banner
        for t in tests:
            fails = any(g["result"] == "Fail" for g in t["gpus"])
            out += _data(t["name"], "Fail" if fails else "Pass")
            for g in t["gpus"]:
                out += _data("", f"GPU{g['gpu']}: {g['result']}")
                for err in g["errors"]:
                    msg = err["message"].strip()
                    for pos in range(0, len(msg), INFO_LEN):
                        out += _data(f"Warning: GPU{g['gpu']}" if pos == 0 else "",
                                     msg[pos : pos + INFO_LEN])  # fmt: skip
    return out + DIAG_RULE


def diag_json(res: dict) -> str:
    """``dcgmi diag -r N -j`` (``Diag::HelperJsonBuildOutput`` and the helpers it calls,
    ``dcgmi/Diag.cpp:1056-1288``; key names ``nvvs/include/NvvsJsonStrings.h``): the GPUs under
    ``entity_groups``, DCGM's and the driver's versions under ``metadata``, and under ``DCGM
    Diagnostic`` -> ``test_categories`` each category's tests, each with one result per GPU
    (``status``; a failure's ``warnings`` with DCGM's error id, category and severity) and a
    ``test_summary`` holding every error of the test."""

    def warnings(errors: list) -> dict:
        if not errors:
            return {}
        return {"warnings": [{"warning": e["message"], "error_id": e["code"],
                              "error_category": e["category"], "error_severity": e["severity"]}
                             for e in errors]}  # fmt: skip

    categories = []
    for category, _ in DIAG_CATEGORIES:
        tests = []
        for t in (t for t in res["tests"] if TEST_CATEGORY.get(t["name"]) == category):
            results = [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": g["gpu"],
                        "status": g["result"], **warnings(g["errors"])} for g in t["gpus"]]  # fmt: skip
            every = [e for g in t["gpus"] for e in g["errors"]]
            summary = {"status": "Fail" if any(g["result"] == "Fail" for g in t["gpus"])
                       else "Pass", **warnings(every)}  # fmt: skip
            tests.append({"name": t["name"], "results": results, "test_summary": summary})
        if tests:
            categories.append({"category": category, "tests": tests})
    # Diag::HelperJsonAddEntities: a serial only where DCGM has one (not DCGM_STR_BLANK)
    entities = [{"entity_id": e["gpu"], "device_id": e["device_id"],
                 **({"serial_num": e["serial"]} if e["serial"] else {})}
                for e in res.get("entities", [])]  # fmt: skip
    out: dict = {"DCGM Diagnostic": {"test_categories": categories}} if categories else {}
    if entities:
        out["entity_groups"] = [{"entities": entities, "entity_group": "GPU", "entity_group_id": 1}]
    metadata = {"version": res["dcgm_version"]}
    if res["driver"]:
        metadata["Driver Version Detected"] = res["driver"]
    out["metadata"] = metadata
    return c.jsoncpp_styled(out)


def diag_status(res: dict) -> int:
    """Diag::GetFailureResult: isolate-priority errors first, any other error next."""
    errors = [e for t in res["tests"] for g in t["gpus"] for e in g["errors"]]
    if any(e.get("isolate") for e in errors):
        return ST_NVVS_ISOLATE_ERROR
    return ST_NVVS_ERROR if errors else 0


# --- command line -----------------------------------------------------------------------------


def _parse(argv: list) -> dict:
    o = {"host": "localhost", "cmd": None, "args": []}
    rest = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--host":
            i += 1
            if i >= len(argv):
                raise ValueError("--host needs a value")
            o["host"] = argv[i]
        elif a.startswith("--host="):
            o["host"] = a.split("=", 1)[1]
        else:
            rest.append(a)
        i += 1
    if rest and rest[0] in ("-v", "--version"):
        o["cmd"] = "version"
    elif rest and rest[0] in ("-h", "--help"):
        o["cmd"] = "help"
    elif rest:
        o["cmd"], o["args"] = rest[0], rest[1:]
    return o


def _connect_error(host: str) -> int:
    # Command::Connect and Command::DoExecuteConnectionFailure (dcgmi/Command.cpp:69-105)
    sys.stdout.write(f"Error: unable to establish a connection to the specified host: {host}\n"
                     "Error: Unable to connect to host engine. Host engine connection "
                     "invalid/disconnected.\n")  # fmt: skip
    return ST_CONNECTION_NOT_VALID


def _flag_value(args: list, *names: str) -> str | None:
    for n, a in enumerate(args):
        for name in names:
            if a == name and n + 1 < len(args):
                return args[n + 1]
            if a.startswith(name + "=") and name.startswith("--"):
                return a.split("=", 1)[1]
            if a.startswith(name) and not name.startswith("--") and len(a) > len(name):
                return a[len(name) :]
    return None


def main(argv: list) -> int:
    try:
        o = _parse(argv)
    except ValueError as e:
        c.err(f"dcgmi: {e}")
        return EXIT_BAD_ARGS
    mine = c.dcgm_version()
    if o["cmd"] in (None, "help"):
        sys.stdout.write(f"dcgmi discovery|health|diag|-v ... -- {c.SIM_NOTE}\n")
        return 0 if o["cmd"] == "help" else EXIT_BAD_ARGS
    if o["cmd"] not in ("discovery", "health", "diag", "version"):
        c.err(f"dcgmi: subcommand {o['cmd']!r} is not simulated (discovery, health, diag are)")
        return EXIT_BAD_ARGS
    host, port = c.parse_hostport(o["host"])

    def ask(req: dict) -> dict:
        return c.request(host, port, req, timeout=120)

    try:
        hello = ask({"op": "hello"})
    except (OSError, ValueError):
        if o["cmd"] == "version":  # VersionInfo is silent about the connection (Version.cpp)
            return ST_CONNECTION_NOT_VALID
        return _connect_error(o["host"])
    if o["cmd"] == "version":  # VersionInfo::DoExecuteConnected (dcgmi/Version.cpp)
        sys.stdout.write("\nLocal build info:\n" + c.dcgm_version_text(mine))
        sys.stdout.write("\nHostengine build info:\n" + c.dcgm_version_text(hello.get("version")))
        return 0
    args = o["args"]
    as_json = "-j" in args or "--json" in args
    if o["cmd"] == "discovery":
        if "-l" not in args and "--list" not in args:
            c.err("dcgmi discovery: use -l (list)")
            return EXIT_BAD_ARGS
        show_all = "-a" in args or "--all" in args
        if show_all and c.version_tuple(mine) < (4, 5, 0):
            c.err("dcgmi discovery: -a is new in DCGM 4.5")
            return EXIT_BAD_ARGS
        sys.stdout.write(discovery(ask({"op": "discovery"}), mine, show_all))
        return 0
    if o["cmd"] == "health":
        mask = _flag_value(args, "-s", "--set")
        if mask is not None:
            ask({"op": "health_set", "mask": mask})
            sys.stdout.write("Health monitor systems set successfully.\n")
            return 0
        if "-f" in args or "--fetch" in args:
            sys.stdout.write(f"Health monitor systems: {ask({'op': 'health_get'})['mask']}\n")
            return 0
        if "-c" in args or "--check" in args:
            reply = ask({"op": "health_check"})
            if not reply.get("watched"):
                sys.stdout.write("Error: Health watches not enabled. Please enable watches. \n")
                return ST_GENERIC_ERROR
            incidents = reply["incidents"]
            text, overall = health_report(incidents)
            sys.stdout.write(health_json(incidents, overall) if as_json else text)
            return 0  # Health::CheckWatches returns DCGM_ST_OK whatever the health
        c.err("dcgmi health: use -s MASK, -f or -c")
        return EXIT_BAD_ARGS
    level = _flag_value(args, "-r", "--run")
    if level is None:
        c.err("dcgmi diag: -r LEVEL is required")
        return EXIT_BAD_ARGS
    try:
        lvl = int(level)
    except ValueError:
        c.err(f"dcgmi diag: only numeric run levels are simulated, got {level!r}")
        return EXIT_BAD_ARGS
    reply = ask({"op": "diag", "level": lvl})
    if not reply.get("ok"):
        sys.stdout.write(f"Error: {reply.get('error')}\n")
        return EXIT_BAD_ARGS
    res = reply["result"]
    if res["errors"]:  # the run did not complete: Diag::RunDiagOnce (Diag.cpp:436-477 @v4.6.0)
        group = _flag_value(args, "-g", "--group")
        which = f"group {group}" if group is not None else "entities *,cpu:*"  # -i's default
        message = (f"Error: Unable to complete diagnostic for {which}. Return: (-30) : "
                   "DCGM GPU Diagnostic returned an error\n" + "\n".join(res["errors"]))  # fmt: skip
        # Diag::HelperDisplayFailureMessage (Diag.cpp:633-643): the message, or with -j its JSON
        # (then std::endl after toStyledString's own newline)
        if as_json:
            failed = {"runtime_error": message, "version": mine}
            sys.stdout.write(c.jsoncpp_styled({"DCGM Diagnostic": failed}) + "\n")
        else:
            sys.stdout.write(message + "\n")
        return ST_NVVS_ERROR
    sys.stdout.write(diag_json(res) if as_json else diag_report(res))
    return diag_status(res)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
