"""SIMULATED ``dcgmi``: ``discovery -l``, ``health -s/-c [-j]``, ``diag -r N [-j]`` and
``-v``, asking the simulated host engine (``--host``, default localhost:5555) like the real one.

Exit status: 0 when healthy / passed; 1 when ``health -c`` finds a failure; 226 when a diagnostic
fails; 247 when the host engine cannot be reached; 2 for bad arguments.
"""

import json
import sys

try:
    from deployer.lab.gpusim.standins import common as c
except ImportError:  # installed on a simulated host: the package ships gpusim_common.py
    import gpusim_common as c  # type: ignore[no-redef]

EXIT_HEALTH_FAILURE = 1
EXIT_BAD_ARGS = 2
EXIT_DIAG_FAILURE = 226
EXIT_CONNECTION = 247
W1, W2 = 27, 58


def _row(left: str, right: str) -> str:
    return f"| {left:<{W1 - 1}}| {right:<{W2 - 2}} |"


def _rule(ch: str = "-") -> str:
    return "+" + ch * W1 + "+" + ch * W2 + "+"


def discovery(reply: dict) -> str:
    gpus, switches = reply["gpus"], reply["nvswitches"]
    out = [f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''} found.",
           "+--------+----------------------------------------------------------------------+",
           "| GPU ID | Device Information                                                   |",
           "+--------+----------------------------------------------------------------------+"]  # fmt: skip
    for g in gpus:
        for n, text in enumerate((f"Name: {g['name']}", f"PCI Bus ID: {g['pci_bus_id']}",
                                  f"Device UUID: {g['uuid']}")):  # fmt: skip
            left = str(g["index"]) if n == 0 else ""
            out.append(f"| {left:<7}| {text:<69}|")
        out.append(
            "+--------+----------------------------------------------------------------------+"
        )
    out.append(f"{len(switches)} NvSwitch{'es' if len(switches) != 1 else ''} found.")
    out.append("+-----------+")
    out.append("| Switch ID |")
    out.append("+-----------+")
    for sw in switches:
        out.append(f"| {sw['index']:<10}|")
    out.append("+-----------+")
    out.append("0 CPUs found.")
    return "\n".join(out) + "\n"


def health_report(incidents: list) -> tuple:
    """(text, overall) of a health check; overall is Healthy, Warning or Failure."""
    overall = "Healthy"
    if any(i["health"] == "Failure" for i in incidents):
        overall = "Failure"
    elif incidents:
        overall = "Warning"
    out = [_rule(), "| Health Monitor Report" + " " * (W1 + W2 - 21) + "|", _rule("="),
           _row("Overall Health", overall)]  # fmt: skip
    by_gpu: dict = {}
    for inc in incidents:
        by_gpu.setdefault(inc["gpu"], []).append(inc)
    if by_gpu:
        out.append(_row("GPU", ""))
    for gpu, incs in sorted(by_gpu.items()):
        worst = "Failure" if any(i["health"] == "Failure" for i in incs) else "Warning"
        out.append(_row(f"-> {gpu}", worst))
        out.append(_row("   -> Errors" if worst == "Failure" else "   -> Warnings", ""))
        for inc in incs:
            out.append(_row(f"      -> {inc['system']} system", inc["health"]))
            msg = inc["message"]
            while msg:
                out.append(_row("", msg[: W2 - 2]))
                msg = msg[W2 - 2 :]
    out.append(_rule())
    return "\n".join(out) + "\n", overall


def health_json(incidents: list, overall: str) -> str:
    body = {"body": {"Overall Health": {"value": overall}, "GPU": {}}}
    for inc in incidents:
        gpu = body["body"]["GPU"].setdefault(str(inc["gpu"]), {"children": {}})
        gpu["children"].setdefault(inc["system"], {"value": inc["health"], "messages": []})
        gpu["children"][inc["system"]]["messages"].append(inc["message"])
    return json.dumps(body, indent=4) + "\n"


def diag_report(res: dict) -> tuple:
    """(text, passed) of a diagnostic run."""
    if res["errors"]:
        return "Error: " + "\n".join(res["errors"]) + "\n", False
    passed = all(g["result"] == "Pass" for t in res["tests"] for g in t["gpus"])
    out = ["Successfully ran diagnostic for group.", _rule(), _row("Diagnostic", "Result"),
           _rule("="), "|-----  Metadata  ----------+" + "-" * W2 + "|",
           _row("DCGM Version", res["dcgm_version"]),
           _row("Driver Version Detected", res["driver"]),
           _row("GPU Device IDs Detected", ",".join(res["device_ids"])),
           "|-----  Deployment  --------+" + "-" * W2 + "|"]  # fmt: skip
    headings = {"pcie": "Integration", "memory": "Hardware", "diagnostic": "Stress"}
    for t in res["tests"]:
        if t["name"] in headings:
            out.append(f"|-----  {headings[t['name']]}  " + "-" * (W1 - 9 - len(headings[t["name"]]))
                       + "+" + "-" * W2 + "|")  # fmt: skip
        fails = [g for g in t["gpus"] if g["result"] == "Fail"]
        out.append(_row(t["name"], "Fail" if fails else "Pass"))
        for g in t["gpus"]:
            out.append(_row("", f"GPU{g['gpu']}: {g['result']}"))
            for m in g["messages"]:
                text = "  Error: " + m
                while text:
                    out.append(_row("", text[: W2 - 2]))
                    text = "  " + text[W2 - 2 :] if len(text) > W2 - 2 else ""
    out.append(_rule())
    return "\n".join(out) + "\n", passed


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
    sys.stdout.write(f"Error: unable to establish a connection to the specified host: {host}\n"
                     "Error: Unable to connect to host engine. Host engine connection "
                     "invalid/disconnected.\n")  # fmt: skip
    return EXIT_CONNECTION


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
    if o["cmd"] == "version":
        sys.stdout.write(c.dcgm_version_text(mine))
        return 0
    if o["cmd"] in (None, "help"):
        sys.stdout.write(f"dcgmi discovery|health|diag ... -- {c.SIM_NOTE}\n")
        return 0 if o["cmd"] == "help" else EXIT_BAD_ARGS
    if o["cmd"] not in ("discovery", "health", "diag"):
        c.err(f"dcgmi: subcommand {o['cmd']!r} is not simulated (discovery, health, diag are)")
        return EXIT_BAD_ARGS
    host, port = c.parse_hostport(o["host"])

    def ask(req: dict) -> dict:
        return c.request(host, port, req, timeout=120)

    try:
        hello = ask({"op": "hello"})
    except (OSError, ValueError):
        return _connect_error(o["host"])
    if hello.get("version") != mine:
        sys.stdout.write(f"Error: API version mismatch (dcgmi {mine}, host engine "
                         f"{hello.get('version')}). Restart nvidia-dcgm after a DCGM upgrade.\n")  # fmt: skip
        return EXIT_CONNECTION
    args = o["args"]
    as_json = "-j" in args or "--json" in args
    if o["cmd"] == "discovery":
        if "-l" not in args and "--list" not in args and "-c" not in args:
            c.err("dcgmi discovery: use -l (list) or -c (MIG hierarchy)")
            return EXIT_BAD_ARGS
        sys.stdout.write(discovery(ask({"op": "discovery"})))
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
            incidents = ask({"op": "health_check"})["incidents"]
            text, overall = health_report(incidents)
            sys.stdout.write(health_json(incidents, overall) if as_json else text)
            return EXIT_HEALTH_FAILURE if overall == "Failure" else 0
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
    text, passed = diag_report(res)
    sys.stdout.write(json.dumps(res, indent=4) + "\n" if as_json else text)
    return 0 if passed else EXIT_DIAG_FAILURE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
