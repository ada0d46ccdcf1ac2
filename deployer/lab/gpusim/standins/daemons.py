"""SIMULATED NVIDIA daemons and the simulated kernel-module load: ``nvidia-persistenced``,
``nv-fabricmanager`` and the boot-time ``gpusim-nvidia-module`` oneshot.
"""

import contextlib
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

PERSISTENCED_PID = "/var/run/nvidia-persistenced/nvidia-persistenced.pid"
FABRICMANAGER_PID = "/var/run/nvidia-fabricmanager/nv-fabricmanager.pid"
FM_CONFIG = "/usr/share/nvidia/nvswitch/fabricmanager.cfg"
FM_PORT = 6666


def _wait_for_term(cleanup) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    cleanup()
    return 0


def module_load_main(argv: list) -> int:
    """Boot-time oneshot: load the installed module (copy its version to the loaded one)."""
    if argv and argv[0] in ("-h", "--help"):
        sys.stdout.write(f"gpusim-nvidia-module-load -- {c.SIM_NOTE}\n")
        return 0
    loaded = c.load_module(reason="boot")
    if loaded is None and c.installed_module() is not None:
        # the driver is installed but DKMS built no module for this kernel: modprobe's words
        kernel = c.running_kernel()
        c.err(f"modprobe: FATAL: Module nvidia not found in directory /lib/modules/{kernel}")
        return 1
    if loaded is None:
        sys.stdout.write("no simulated NVIDIA kernel module installed; nothing to load\n")
        return 0
    c.expose_proc_driver()
    sys.stdout.write(
        f"simulated NVIDIA kernel module {loaded['version']} ({loaded['flavour']}) loaded\n"
    )
    return 0


def persistenced_main(argv: list) -> int:
    """``nvidia-persistenced [--user U] [--persistence-mode|--no-persistence-mode] [-V]``."""
    mode = None
    foreground = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-v", "--version"):
            sys.stdout.write(f"nvidia-persistenced:  version {c.BUILD.get('version', '')}\n"
                             f"({c.SIM_NOTE})\n")  # fmt: skip
            return 0
        if a in ("-u", "--user"):
            i += 1
        elif a.startswith("--user="):
            pass
        elif a == "--persistence-mode":
            mode = "1"
        elif a == "--no-persistence-mode":
            mode = "0"
        elif a in ("-V", "--verbose"):
            pass
        elif a in ("--no-fork", "-f"):
            foreground = True
        else:
            c.err(f"nvidia-persistenced: Unrecognized option: {a}")
            return 1
        i += 1
    try:
        c.nvml_init()
    except c.NvmlError as e:
        c.err(f"nvidia-persistenced failed to initialize. {e.message.splitlines()[0]}")
        return 1
    if mode is not None:
        c.write_text(c.PERSISTENCE_FILE, mode + "\n")
    if not foreground:
        c.daemonize(PERSISTENCED_PID)
    else:
        c.write_pidfile(PERSISTENCED_PID)

    def cleanup() -> None:
        for rel in (PERSISTENCED_PID,):
            with contextlib.suppress(OSError):
                os.unlink(c.path(rel))

    return _wait_for_term(cleanup)


def fabricmanager_main(argv: list) -> int:
    """``nv-fabricmanager -c CONFIG``: needs NVSwitches and a loaded driver of its exact version."""
    foreground = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-v", "--version"):
            sys.stdout.write(f"Fabric Manager version is : {c.BUILD.get('version', '')}\n"
                             f"({c.SIM_NOTE})\n")  # fmt: skip
            return 0
        if a in ("-c", "--config"):
            i += 1
        elif a in ("--no-daemon", "-n"):
            foreground = True
        else:
            c.err(f"nv-fabricmanager: unknown option {a}")
            return 1
        i += 1
    mine = c.BUILD.get("version", "")
    try:
        loaded = c.nvml_init()
    except c.NvmlError as e:
        c.err(f"fabric manager failed to initialize: {e.message.splitlines()[0]}")
        return 1
    if not c.hardware().get("nvswitches"):
        c.err("NVIDIA Fabric Manager: no NVSwitch devices found (not an NVSwitch system); "
              "fabric manager exits")  # fmt: skip
        return 1
    if loaded["version"] != mine:
        c.err(f"fabric manager version {mine} is not matching with the running driver version "
              f"{loaded['version']}; install the fabric manager of the same version")  # fmt: skip
        return 1

    class Quiet(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.sendall(b"SIMULATED fabric manager\n")

    class Server(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True

    try:
        server = Server(("127.0.0.1", FM_PORT), Quiet)
    except OSError as e:
        c.err(f"fabric manager: cannot listen on 127.0.0.1:{FM_PORT}: {e}")
        return 1
    if not foreground:
        c.daemonize(FABRICMANAGER_PID)
    else:
        c.write_pidfile(FABRICMANAGER_PID)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    c.write_json_atomic(
        c.FABRIC_FILE, {"state": "Completed", "version": mine, "since": time.time()}
    )

    def cleanup() -> None:
        server.shutdown()
        for rel in (FABRICMANAGER_PID, c.FABRIC_FILE):
            with contextlib.suppress(OSError):
                os.unlink(c.path(rel))

    return _wait_for_term(cleanup)
