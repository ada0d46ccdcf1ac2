"""SIMULATED ``nv-hostengine``: a DCGM host engine that really listens (127.0.0.1:5555 by
default) and answers the simulated ``dcgmi`` and ``dcgm-exporter -r`` with discovery, health and
diagnostics computed from the host's described GPUs, its fault state and the loaded driver.

Wire protocol (simulation only, not DCGM's): one JSON object per line each way.
"""

import contextlib
import json
import os
import signal
import socketserver
import sys
import threading
import time

if __package__:  # imported from the source tree (the tests, the package builder)
    from deployer.lab.gpusim.standins import common as c
else:  # installed on a simulated host: the package ships gpusim_common.py
    import gpusim_common as c  # type: ignore[no-redef]

DEFAULT_PORT = c.DCGM_PORT
DEFAULT_PIDFILE = "/var/run/nvhostengine.pid"
OLD_ARCHS = ("Volta", "Pascal", "Maxwell")
DIAG_TESTS = {
    1: ["software"],
    2: ["software", "pcie", "memory"],
    3: ["software", "pcie", "memory", "memory_bandwidth", "diagnostic", "targeted_stress",
        "targeted_power"],
    4: ["software", "pcie", "memory", "memory_bandwidth", "diagnostic", "targeted_stress",
        "targeted_power", "memtest", "pulse_test"],
}  # fmt: skip


def required_diag_major(driver_cuda: str, gpus: list) -> int:
    """Which -cuda<N> diag package's plugins nvvs loads for this driver and these GPUs: the
    driver's CUDA major, but 12 for Maxwell, Pascal and Volta under CUDA 13.0 exactly (NVIDIA/DCGM
    ``nvvs/include/TestFramework.inl:397-405`` @v4.6.0, ``GetCompatibleCudaMajorVersion``)."""
    try:
        major, _, rest = driver_cuda.partition(".")
        version = (int(major), int(rest.split(".")[0] or 0))
    except ValueError:
        return 12
    if version == (13, 0) and any(g.get("architecture") in OLD_ARCHS for g in gpus):
        return 12
    return version[0]


# dcgmErrorMeta (dcgmlib/src/dcgm_errors.c @v4.6.0): error code (dcgmlib/dcgm_errors.h) ->
# (severity, category). Severity 2 is DCGM_ERROR_ISOLATE, the priority Diag::GetFailureResult
# stops on (dcgmErrorGetPriorityByCode); 4 TRIAGE; 6 RESET. Categories: 10 HARDWARE_MEMORY,
# 15 HARDWARE_OTHER, 16 INTERNAL_OTHER.
ERROR_META = {
    4: (2, 10),  # DCGM_FR_VOLATILE_DBE_DETECTED
    44: (4, 16),  # DCGM_FR_INTERNAL (the lab's injected validation failure)
    83: (6, 10),  # DCGM_FR_DBE_PENDING_PAGE_RETIREMENTS
    85: (6, 10),  # DCGM_FR_PENDING_ROW_REMAP
    120: (2, 15),  # DCGM_FR_FALLEN_OFF_BUS
}
ISOLATE = 2


def _err(message: str, code: int) -> dict:
    severity, category = ERROR_META[code]
    return {"message": message, "code": code, "category": category, "severity": severity,
            "isolate": severity == ISOLATE}  # fmt: skip


def _device_id(g: dict) -> str:
    """The PCI device id as nvvs prints it: 4 lowercase hex digits (nvvs/src/Gpu.cpp:89-92
    @v4.6.0: ``std::hex << std::setw(4) << std::setfill('0')``)."""
    return f"{int(g['pci_device_id'], 16):04x}"


def run_diag(level: int, st: dict, hw: dict, driver: str, known: list | None = None) -> dict:
    """The result of ``dcgmi diag -r LEVEL``: per test, per GPU Pass/Fail with the DCGM errors
    (messages of dcgmlib/dcgm_errors.h, isolate priority of dcgmlib/src/dcgm_errors.c @v4.6.0)."""
    gpus = [g for g in hw.get("gpus", []) if known is None or g["index"] in known]
    cuda = c.cuda_version()
    need = required_diag_major(cuda, hw.get("gpus", []))
    result = {"level": level, "dcgm_version": c.dcgm_version(), "driver": driver,
              "entities": [{"gpu": g["index"], "device_id": _device_id(g),
                            "serial": g.get("serial", "")} for g in gpus],
              "tests": [], "errors": []}  # fmt: skip
    if c.read_json(c.DCGM_DIAG_FILE.format(major=need)) is None:
        # nvvs (in -core) loads the plugins of -cuda<N> from its plugin directory; without it
        # TestFramework::LoadPluginWithDir throws (TestFramework.inl:574-579 @v4.6.0), nvvs
        # reports it as the response's system error (NvvsMain.cpp:80, 129-132) and the host
        # engine answers DCGM_ST_NVVS_ERROR (modules/diag/DcgmDiagManager.cpp:1186-1189)
        result["errors"].append(
            "Error: Cannot load plugins. Unable to change to the plugin dir "
            f"'/usr/libexec/datacenter-gpu-manager-4/plugins/cuda{need}/': "
            "'No such file or directory'"
        )
        return result
    failure = st.get("validation_failure")
    for test in DIAG_TESTS[level]:
        entry = {"name": test, "gpus": []}
        for g in gpus:
            i = g["index"]
            fault = c.gpu_fault(st, i)
            errs = []
            dbe = int(fault.get("ecc_dbe", 0))
            if fault.get("missing"):
                if test == "software":  # DCGM_FR_FALLEN_OFF_BUS (isolate)
                    errs.append(_err(f"GPU {i} has fallen off the bus", 120))
            elif test == "software" and dbe > 0:
                if g.get("row_remap"):  # DCGM_FR_PENDING_ROW_REMAP (reset)
                    errs.append(_err(f"GPU {i} had memory errors and row remappings are pending",
                                     85))  # fmt: skip
                else:  # DCGM_FR_DBE_PENDING_PAGE_RETIREMENTS (reset)
                    errs.append(_err(f"Pending page retirements together with a DBE were detected "
                                     f"on GPU {i}.", 83))  # fmt: skip
            elif test == "memory" and dbe > 0:  # DCGM_FR_VOLATILE_DBE_DETECTED (isolate)
                errs.append(_err(f"Detected {dbe} volatile double-bit ECC error(s) in GPU {i}.",
                                 4))  # fmt: skip
            if (
                failure
                and failure.get("test", "software") == test
                and failure.get("gpu") in (None, i)
                and not fault.get("missing")
            ):
                errs.append(_err(failure.get("message") or
                                 f"GPU {i}: validation failure injected by the gpumon-deploy lab",
                                 44))  # fmt: skip
            entry["gpus"].append({"gpu": i, "result": "Fail" if errs else "Pass", "errors": errs})
        result["tests"].append(entry)
    return result


#: dcgmi health -s letters -> DCGM systems (dcgmi/CommandLineParser.cpp:1236-1248 @v4.6.0)
WATCH_LETTERS = {"p": ("PCIe",), "m": ("Memory",), "i": ("InfoROM",), "n": ("NVLINK",),
                 "t": ("Thermal", "Power"), "d": ("Driver",)}  # fmt: skip


class Engine:
    def __init__(self, driver: str) -> None:
        self.driver = driver
        self.started = time.time()
        self.watches = ""  # a new host engine watches nothing until "dcgmi health -s"
        self.lock = threading.Lock()
        # the GPUs NVML enumerated when the engine started; one that falls off later stays in
        # DCGM's entity list with status LOST
        self.known = [g["index"] for g in c.visible_gpus()]

    def _watched(self, system: str) -> bool:
        if system == "ALL":
            return True
        if "a" in self.watches:
            return True
        return any(system in WATCH_LETTERS.get(ch, ()) for ch in self.watches)

    def handle(self, req: dict) -> dict:
        op = req.get("op")
        hw, st = c.hardware(), c.state()
        if op == "hello":
            return {"ok": True, "version": c.dcgm_version(), "driver": self.driver}
        if op == "discovery":
            visible = {g["index"] for g in c.visible_gpus(hw, st)}
            gpus = []
            for g in hw.get("gpus", []):
                if g["index"] in self.known:
                    gpus.append({**g, "status": "OK" if g["index"] in visible else "LOST"})
            return {"ok": True, "gpus": gpus, "nvswitches": hw.get("nvswitches", [])}
        if op == "health_set":
            with self.lock:
                self.watches = str(req.get("mask", "a"))
            return {"ok": True}
        if op == "health_get":
            return {"ok": True, "mask": self.watches}
        if op == "health_check":
            # From DCGM 4.5.0 the check reads only the group's active entities: a GPU DCGM has
            # LOST gets no incident (modules/health/DcgmHealthWatch.cpp MonitorWatches,
            # EntityListOption::ActiveOnly: :536 @v4.5.0, :660 @v4.6.0; 4.4.2 read every entity
            # of the group, :459)
            newer = c.version_tuple(c.dcgm_version()) >= (4, 5, 0)
            active = {g["index"] for g in c.visible_gpus(hw, st)} if newer else None
            incidents = []
            for g in hw.get("gpus", []):
                if g["index"] not in self.known or (
                    active is not None and g["index"] not in active
                ):
                    continue
                for system, level, msg, _code in c.gpu_health(g, st):
                    if self._watched(system):
                        incidents.append({"gpu": g["index"], "system": system, "health": level,
                                          "message": msg})  # fmt: skip
            return {"ok": True, "watched": bool(self.watches), "incidents": incidents}
        if op == "diag":
            level = int(req.get("level", 1))
            if level not in DIAG_TESTS:
                return {"ok": False, "error": f"Invalid run level {level}: use 1, 2, 3 or 4"}
            return {"ok": True, "result": run_diag(level, st, hw, self.driver, self.known)}
        if op == "samples":
            return {"ok": True, "driver": self.driver}
        return {"ok": False, "error": f"unsupported request {op!r}"}


def serve(engine: Engine, bind: str, port: int) -> socketserver.ThreadingTCPServer:
    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            for raw in self.rfile:
                try:
                    reply = engine.handle(json.loads(raw))
                except (ValueError, KeyError, TypeError) as e:
                    reply = {"ok": False, "error": str(e)}
                self.wfile.write(json.dumps(reply).encode() + b"\n")
                self.wfile.flush()

    class Server(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True

    return Server((bind, port), Handler)


def _parse(argv: list) -> dict:
    o = {"daemon": True, "bind": "127.0.0.1", "port": DEFAULT_PORT, "pid": DEFAULT_PIDFILE,
         "log": None, "mode": "run"}  # fmt: skip
    i = 0
    while i < len(argv):
        a = argv[i]
        val = None
        if a.startswith("--") and "=" in a:
            a, val = a.split("=", 1)

        def take():
            nonlocal i
            if val is not None:  # noqa: B023 (called in this iteration)
                return val  # noqa: B023
            i += 1
            if i >= len(argv):
                raise ValueError(f"missing value for {a}")  # noqa: B023
            return argv[i]

        if a in ("-n", "--no-daemon"):
            o["daemon"] = False
        elif a in ("-v", "--version"):
            o["mode"] = "version"
        elif a in ("-h", "--help"):
            o["mode"] = "help"
        elif a in ("-t", "--term"):
            o["mode"] = "term"
        elif a in ("-b", "--bind-interface"):
            v = take()
            o["bind"] = "0.0.0.0" if v.upper() == "ALL" else v
        elif a in ("-p", "--port"):
            o["port"] = int(take())
        elif a == "--pid":
            o["pid"] = take()
        elif a in ("-f", "--log-filename"):
            o["log"] = take()
        elif a in ("--log-level", "--service-account", "--home-dir", "--denylist-modules"):
            take()
        elif a == "--log-rotate":
            pass
        elif a in ("-d", "--domain-socket", "-c", "--vsock-cid"):
            raise ValueError(f"{a} is not supported by the simulated host engine (TCP only)")
        else:
            raise ValueError(f"unknown option {a}")
        i += 1
    return o


def _log(o: dict, msg: str) -> None:
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} [SIMULATED nv-hostengine] {msg}\n"
    if o.get("log"):
        try:
            with open(c.path(o["log"]), "a", encoding="utf-8") as f:
                f.write(line)
        except OSError:
            pass
    sys.stderr.write(line)


def main(argv: list) -> int:
    try:
        o = _parse(argv)
    except ValueError as e:
        c.err(f"nv-hostengine: {e}")
        return 2
    if o["mode"] == "help":
        sys.stdout.write(
            f"nv-hostengine [-n] [-b ADDR|ALL] [-p PORT] [--pid FILE] -- {c.SIM_NOTE}\n"
        )
        return 0
    if o["mode"] == "version":
        sys.stdout.write(c.dcgm_version_text(c.dcgm_version()))
        return 0
    if o["mode"] == "term":
        try:
            with open(c.path(o["pid"]), encoding="utf-8") as f:
                os.kill(int(f.read().strip()), signal.SIGTERM)
            sys.stdout.write("Host engine successfully terminated.\n")
            return 0
        except (OSError, ValueError):
            sys.stdout.write("Unable to terminate host engine.\n")
            return 1
    try:
        loaded = c.nvml_init()
    except c.NvmlError as e:
        _log(o, f"DCGM failed to initialize NVML: {e.message.splitlines()[0]}")
        sys.stdout.write(f"Error: DCGM failed to initialize NVML: {e.message.splitlines()[0]}\n")
        return 1
    engine = Engine(loaded["version"])
    try:
        server = serve(engine, o["bind"], o["port"])
    except OSError as e:
        sys.stdout.write(f"Err: Failed to start DCGM Server: {e}\n")
        return 1
    if o["daemon"]:
        c.daemonize(o["pid"])
    else:
        c.write_pidfile(o["pid"])
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    _log(
        o,
        f"DCGM {c.dcgm_version()} listening on {o['bind']}:{o['port']} (driver {loaded['version']})",
    )
    sys.stdout.flush()
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        with contextlib.suppress(OSError):
            os.unlink(c.path(o["pid"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
