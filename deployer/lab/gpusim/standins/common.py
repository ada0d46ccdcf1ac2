"""What every SIMULATED NVIDIA stand-in shares: paths on the host, the simulated kernel module,
NVML initialisation (with the real version-mismatch failure), and the live per-GPU sample.

This file is inlined at the top of every stand-in executable the packages install, so it may use
the Python 3 standard library only (GPU hosts have python3 and nothing else). ``GPUSIM_ROOT``
(default ``/``) prefixes every path, so tests run the stand-ins against a temporary root.
"""

import contextlib
import json
import math
import os
import socket
import struct
import subprocess
import sys
import time


def _load_build() -> dict:
    """Facts baked in by the package build (package, version, DCGM/exporter versions)."""
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "build.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


BUILD: dict = _load_build()

SIM_NOTE = "SIMULATED by the gpumon-deploy lab (no GPU, no NVIDIA software)"

HARDWARE_FILE = "/etc/gpusim/hardware.json"
STATE_FILE = "/var/lib/gpusim/state.json"
NVML_FILE = "/usr/lib/gpusim/libnvidia-ml.json"
CUDA_FILE = "/usr/lib/gpusim/libcuda.json"
KMOD_FILE = "/usr/lib/gpusim/nvidia-kernel.json"
DCGM_CORE_FILE = "/usr/lib/gpusim/dcgm-core.json"
DCGM_DIAG_FILE = "/usr/lib/gpusim/dcgm-diag-cuda{major}.json"
LOADED_FILE = "/run/gpusim/nvidia-module.json"
PROC_SRC_DIR = "/run/gpusim/proc-driver"
PERSISTENCE_FILE = "/run/gpusim/persistence-mode"
FABRIC_FILE = "/run/gpusim/fabric.json"

NVML_SUCCESS = 0
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18

#: XID -> (DCGM health result, health system, text) as DCGM 4.6's health watch classifies it
#: (NVIDIA/DCGM modules/health/DcgmHealthWatch.cpp:3355-3430 @v4.6.0 51b65cc). System "ALL" are
#: the "devastating" XIDs, reported whatever watches are set.
XID_HEALTH = {
    48: ("Failure", "ALL", "Double Bit ECC Error"), 74: ("Failure", "ALL", "NVLink Critical Error"),
    79: ("Failure", "ALL", "GPU %d has fallen off the bus"),
    94: ("Warning", "ALL", "GPU had a contained error."),
    95: ("Failure", "ALL", "GPU had an uncontained error (XID 95)"),
    119: ("Failure", "ALL", "GSP RPC Timeout"), 120: ("Failure", "ALL", "GSP Error"),
    140: ("Failure", "ALL", "ECC unrecovered error"),
    31: ("Warning", "Memory", "MMU Error"), 32: ("Warning", "Memory", "PBDMA Error"),
    43: ("Warning", "Memory", "Reset Channel Verif Error"),
    63: ("Warning", "Memory", "A pending retired page has been detected in GPU %u."),
    64: ("Failure", "Memory", "GPU %u had uncorrectable memory errors and row remapping failed."),
    38: ("Warning", "PCIe", "PCIe Bus Error"), 39: ("Warning", "PCIe", "PCIe Fabric Error"),
    42: ("Warning", "PCIe", "PCIe Replay Error"),
    60: ("Warning", "Thermal", "Detected clocks event due to thermal violation in GPU %u."),
    61: ("Warning", "Thermal", "EDPP Power Brake Thermal limit"),
    62: ("Warning", "Thermal", "Thermal Violation"),
    54: ("Warning", "Power", "Power state change"), 56: ("Warning", "Power", "Clock change"),
    57: ("Warning", "Power", "Clock change due to power"),
    58: ("Warning", "Power", "Clock change due to thermal"),
    78: ("Warning", "Power", "Power state forced change"),
    67: ("Warning", "NVLINK", "NVLink Error"), 73: ("Warning", "NVLINK", "NVLink Flow Control Error"),
    121: ("Warning", "NVLINK", "C2C Link corrected error"),
    137: ("Warning", "NVLINK", "NVLink FLA privilege error"),
}  # fmt: skip
#: The dcgm-exporter's err_msg of the XIDs the lab can inject (NVIDIA/dcgm-exporter
#: internal/pkg/collector/xid_errors.go:20-193 @691c927, same at 4.4.2-4.7.1 and d5e5f51); codes
#: past the end of upstream's table (172) read "Unknown Error" there (gpu_collector.go:326-331).
XID_TEXT = {
    0: "No Error", 13: "Graphics Engine Exception", 31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream", 38: "Driver firmware error",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda",
    48: "Double Bit ECC Error", 61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure", 68: "NVDEC0 Exception",
    69: "Graphics Engine class error", 74: "NVLINK Error", 79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate", 94: "Contained ECC error", 95: "Uncontained ECC error",
    109: "Context Switch Timeout Error", 110: "Security Fault Error", 119: "GSP RPC Timeout",
    120: "GSP Error", 121: "C2C Link Error", 136: "ALI Training Fail", 137: "NVLink Privilege Error",
    140: "Unrecovered ECC Error", 143: "GPU Initialization Failure", 144: "NVLINK: Saw Error",
    145: "NVLINK: RLW Error", 149: "NVLINK: NETIR Error", 154: "GPU Recovery Action Changed",
    155: "NVLINK: SW Defined Error", 156: "Resource Retirement Event",
    157: "Resource Retirement Failure", 158: "GPU Fatal Timeout",
}  # fmt: skip
XID_TABLE_END = 172
UNKNOWN_XID_TEXT = "Unknown Error"


def sim_root() -> str:
    return os.environ.get("GPUSIM_ROOT", "/")


def in_real_root() -> bool:
    return sim_root() == "/"


def path(rel: str) -> str:
    return os.path.join(sim_root(), rel.lstrip("/"))


def read_json(rel: str, default=None):
    try:
        with open(path(rel), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return default
    except (OSError, ValueError):
        return default


def write_json_atomic(rel: str, data) -> None:
    target = path(rel)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = f"{target}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, target)


def write_text(rel: str, text: str) -> None:
    target = path(rel)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "w", encoding="utf-8") as f:
        f.write(text)


def hardware() -> dict:
    hw = read_json(HARDWARE_FILE)
    if not hw:
        return {"hostname": "unknown", "gpus": [], "nvswitches": [], "nvswitch": False}
    return hw


def state() -> dict:
    st = read_json(STATE_FILE, {}) or {}
    st.setdefault("gpus", {})
    st.setdefault("xid_events", [])
    st.setdefault("jobs", [])
    return st


def hostname() -> str:
    try:
        with open(path("/etc/hostname"), encoding="utf-8") as f:
            name = f.read().strip()
            if name:
                return name
    except OSError:
        pass
    return hardware().get("hostname") or os.uname().nodename


def gpu_fault(st: dict, index: int) -> dict:
    return st.get("gpus", {}).get(str(index), {})


def visible_gpus(hw: dict | None = None, st: dict | None = None) -> list:
    """GPUs NVML can see: the described ones minus those that fell off the bus."""
    hw = hw if hw is not None else hardware()
    st = st if st is not None else state()
    return [g for g in hw.get("gpus", []) if not gpu_fault(st, g["index"]).get("missing")]


# --- the simulated kernel module -------------------------------------------------------------


def installed_module() -> dict | None:
    """The driver's module source the DKMS package installed (what ``/usr/src/nvidia-<version>``
    is to dkms): its version and flavour; the module a kernel loads is what the DKMS stand-in
    built from it (:func:`built_module`)."""
    return read_json(KMOD_FILE)


# Where Debian's dkms 3.0.10 installs a module it built (``/usr/sbin/dkms``
# ``override_dest_module_location``: ``/updates/dkms`` on debian* and ubuntu*)
DKMS_MODULE_DIR = "/lib/modules/{kernel}/updates/dkms"
OPEN_LICENSE = "Dual MIT/GPL"  # MODULE_LICENSE of the open modules; "NVIDIA" of the proprietary


def running_kernel() -> str:
    """``uname -r``: the lab's hosts run the lab machine's kernel (containers share it)."""
    return os.uname().release


def module_info(data: bytes) -> dict:
    """The ``key=value`` strings of an ELF module's ``.modinfo`` section, as ``modinfo`` shows
    them (64-bit little-endian ELF, what the DKMS stand-in writes); {} for anything else."""
    if data[:6] != b"\x7fELF\x02\x01" or len(data) < 64:
        return {}
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def section(i: int) -> tuple:
        name, _type, _flags, _addr, offset, size = struct.unpack_from(
            "<IIQQQQ", data, shoff + i * shentsize
        )
        return name, offset, size

    try:
        _, names_at, _ = section(shstrndx)
        for i in range(shnum):
            name, offset, size = section(i)
            end = data.index(b"\0", names_at + name)
            if data[names_at + name : end] == b".modinfo":
                pairs = data[offset : offset + size].split(b"\0")
                return dict(p.decode().partition("=")[::2] for p in pairs if b"=" in p)
    except (struct.error, ValueError, UnicodeDecodeError):
        return {}
    return {}


def built_module(kernel: str) -> dict | None:
    """The NVIDIA module on disk for ``kernel`` (the DKMS stand-in's build): its version and
    flavour, or None where none is built for that kernel."""
    try:
        with open(path(DKMS_MODULE_DIR.format(kernel=kernel) + "/nvidia.ko"), "rb") as f:
            info = module_info(f.read())
    except OSError:
        return None
    if not info.get("version"):
        return None
    flavour = "open" if info.get("license") == OPEN_LICENSE else "proprietary"
    return {"version": info["version"], "flavour": flavour}


def loaded_module() -> dict | None:
    return read_json(LOADED_FILE)


def proc_version_text(version: str, flavour: str) -> str:
    """The two lines of /proc/driver/nvidia/version, worded as the open or proprietary module."""
    stamp = BUILD.get("build_dates", {}).get(version) or "Tue Jul  1 00:00:00 UTC 2025"
    gcc = "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)"
    if flavour == "open":
        head = (
            f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build"
            f"  (gpusim@gpumon-lab-SIMULATED)  {stamp}"
        )
    else:
        head = f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  {stamp}"
    return f"{head}\n{gcc}\n"


def load_module(reason: str = "boot") -> dict | None:
    """Load the module built for the running kernel if none is loaded (what modprobe /
    nvidia-modprobe do): none built for it (no headers, DKMS autoinstall off, a failed build),
    no module, as after a real reboot into such a kernel.

    The loaded version stays fixed until the next boot (/run is emptied by a reboot), so a package
    upgrade without a reboot leaves the old module loaded, exactly like the real driver.
    """
    loaded = loaded_module()
    if loaded:
        return loaded
    inst = built_module(running_kernel())  # modprobe loads what is on disk for this kernel
    if not inst:
        return None
    loaded = {"version": inst["version"], "flavour": inst["flavour"], "loaded_at": time.time(),
              "reason": reason}  # fmt: skip
    write_json_atomic(LOADED_FILE, loaded)
    proc_dir = PROC_SRC_DIR + "/nvidia"
    write_text(proc_dir + "/version", proc_version_text(inst["version"], inst["flavour"]))
    hw = hardware()
    for g in hw.get("gpus", []):
        bus = g["pci_bus_id"].lower()[4:]
        write_text(
            f"{proc_dir}/gpus/{bus}/information",
            f"Model: \t\t {g['name']}\nIRQ:   \t\t 0\nGPU UUID: \t {g['uuid']}\n"
            f"Bus Location: \t {bus}\nDevice Minor: \t {g['index']}\n",
        )
    for sw in hw.get("nvswitches", []):
        write_text(f"{PROC_SRC_DIR}/nvidia-nvswitch/devices/{sw['pci_bus_id'].lower()[4:]}", "")
    expose_proc_driver()
    return loaded


def expose_proc_driver() -> None:
    """Make /proc/driver show the simulated module's files (a bind mount, in a real host only)."""
    if not in_real_root():
        return
    if os.path.exists("/proc/driver/nvidia/version"):
        return
    src = PROC_SRC_DIR
    os.makedirs(src, exist_ok=True)
    # without mount(8) the files stay readable under /run/gpusim/proc-driver
    with contextlib.suppress(OSError):
        subprocess.run(["mount", "--bind", src, "/proc/driver"], check=False, capture_output=True)


# --- NVML -------------------------------------------------------------------------------------


class NvmlError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def nvml_library_version() -> str | None:
    info = read_json(NVML_FILE)
    return info["version"] if info else None


def nvml_init(autoload: bool = True) -> dict:
    """Initialise the simulated NVML: returns the loaded module, or raises NvmlError."""
    lib = nvml_library_version()
    if lib is None:
        raise NvmlError(127, "NVML library (libnvidia-ml.so.1) not found")
    loaded = loaded_module()
    if loaded is None and autoload:
        try:
            loaded = load_module(reason="on demand")
        except PermissionError:  # only root may load a module
            loaded = None
    if loaded is None:
        raise NvmlError(
            NVML_ERROR_DRIVER_NOT_LOADED,
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.",
        )
    if loaded["version"] != lib:
        raise NvmlError(
            NVML_ERROR_LIB_RM_VERSION_MISMATCH,
            f"Failed to initialize NVML: Driver/library version mismatch\nNVML library version: {lib}",
        )
    return loaded


def cuda_version() -> str:
    info = read_json(CUDA_FILE)
    return info["cuda_version"] if info else "N/A"


def persistence_enabled() -> bool:
    try:
        with open(path(PERSISTENCE_FILE), encoding="utf-8") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def fabric_state() -> tuple:
    """(state, status) of the NVSwitch fabric as nvidia-smi -q reports it."""
    hw = hardware()
    if not hw.get("nvswitches"):
        return ("N/A", "N/A")
    fab = read_json(FABRIC_FILE)
    if fab and fab.get("state") == "Completed":
        return ("Completed", "Success")
    return ("In Progress", "N/A")


# --- live values ------------------------------------------------------------------------------


def _uptime_s() -> float:
    loaded = loaded_module() or {}
    return max(0.0, time.time() - float(loaded.get("loaded_at", time.time())))


def mig_instances(g: dict) -> list:
    """The GPU instances of a GPU in MIG mode ([] when MIG is off or not supported)."""
    return list(g.get("mig") or [])


def mig_enabled(g: dict) -> bool:
    return g.get("mig") is not None


def _gi_idle_used(gi: dict) -> int:
    # the captures: 26/17/9/9 MiB used by idle 3g.40gb/2g.20gb/1g.10gb/1g.10gb (H100, R590)
    return max(9, gi["memory_mib"] // 1550)


def gpu_sample(g: dict, st: dict, now: float | None = None) -> dict:
    """The current readings of one GPU: idle baseline, raised by jobs, overridden by faults.

    ``memory_temp`` is None on boards without a memory sensor (nvidia-smi N/A, DCGM 0); a GPU in
    MIG mode has per-instance memory in ``instances`` (GI id -> used/free MiB) and no utilisation.
    """
    now = time.time() if now is None else now
    i = g["index"]
    fault = gpu_fault(st, i)
    jobs = [j for j in st.get("jobs", []) if j.get("gpu") == i]
    busy = bool(jobs)
    base_temp = 30 + (i * 3) % 7
    gpu_temp = base_temp + (28 if busy else 0)
    mem_temp = gpu_temp + 6 if g.get("memory_sensor", True) else None
    if "gpu_temp" in fault:
        gpu_temp = int(fault["gpu_temp"])
    if "memory_temp" in fault and g.get("memory_sensor", True):
        mem_temp = int(fault["memory_temp"])
    limit = float(g["power_limit_w"])
    wobble = 1.0 + 0.02 * math.sin(now / 7.0 + i)
    power = round(limit * (0.82 if busy else 0.1) * wobble, 3)
    total = g["memory_total_mib"]
    reserved = int(g.get("memory_reserved_mib", max(256, total // 147)))
    instances = {}
    if mig_enabled(g):
        for gi in mig_instances(g):
            gi_jobs = [j for j in jobs if j.get("gpu_instance", gi["gi_id"]) == gi["gi_id"]]
            gi_used = _gi_idle_used(gi) + sum(int(j.get("used_memory_mib", 0)) for j in gi_jobs)
            instances[gi["gi_id"]] = {"used": gi_used, "free": max(0, gi["memory_mib"] - gi_used),
                                      "busy": bool(gi_jobs)}  # fmt: skip
        used = sum(v["used"] for v in instances.values())
    else:
        used = sum(int(j.get("used_memory_mib", 0)) for j in jobs)
    free = max(0, total - reserved - used)
    xids = [e for e in st.get("xid_events", []) if e.get("gpu") == i]
    last_xid = xids[-1]["xid"] if xids else None
    dbe = int(fault.get("ecc_dbe", 0))
    row_remap = bool(g.get("row_remap"))
    uptime = _uptime_s()
    slowdown = g["slowdown_temp"]
    return {
        "gpu_temp": gpu_temp,
        "memory_temp": mem_temp,
        "power_w": power,
        "energy_mj": int(limit * 0.1 * uptime * 1000),
        # "Total time (in seconds) the GPU has been running since first initialization" (R610's
        # bbx.time_run): the time since this module load, a lower bound of it
        "time_run_s": int(uptime),
        "util": None if mig_enabled(g) else (100 if busy else 0),
        "mem_util": None if mig_enabled(g) else (35 if busy else 0),
        "sm_clock": g["max_sm_clock"] if busy else g.get("idle_sm_clock", 345),
        "mem_clock": g["mem_clock"] if busy else g.get("idle_mem_clock", g["mem_clock"]),
        "video_clock": g.get("max_video_clock", 1545) if busy else g.get("idle_video_clock", 765),
        "fb_total": total,
        "fb_reserved": reserved,
        "fb_used": used,
        "fb_free": free,
        "instances": instances,
        "xid_last": last_xid,
        "xid_events": xids,
        "ecc_dbe_vol": dbe,
        "ecc_dbe_agg": dbe,
        "ecc_sbe_vol": int(fault.get("ecc_sbe", 0)),
        "ecc_sbe_agg": int(fault.get("ecc_sbe", 0)),
        "uncorrectable_remapped_rows": dbe if row_remap else 0,
        "correctable_remapped_rows": 0,
        "row_remap_failure": 1 if fault.get("row_remap_failure") else 0,
        "row_remap_pending": 1 if (row_remap and dbe) else 0,
        "retired_dbe": 0 if row_remap else dbe,
        "retired_sbe": 0,
        "retired_pending": 0 if row_remap else (1 if dbe else 0),
        "pcie_replay": 0,
        "pstate": "P0",
        "gr_active": 0.93 if busy else 0.0,
        "tensor_active": 0.41 if busy else 0.0,
        "dram_active": 0.37 if busy else 0.000131,
        "pcie_tx": 1.5e8 if busy else 175084,
        "pcie_rx": 2.5e8 if busy else 19831,
        "nvlink_bw": int(uptime * (4.2e6 if busy else 1.0e3)),
        "jobs": jobs,
        "thermal_slowdown": gpu_temp >= slowdown,
        "clocks_event_reasons": 0x20 if gpu_temp >= slowdown else (0 if busy else 1),
    }


# Next steps DCGM appends to its health messages (NVIDIA/DCGM dcgmlib/dcgm_errors.h @v4.6.0:
# DCGM_FR_VOLATILE_DBE_DETECTED_NEXT :533, DEBUG_COOLING_MSG :223, DCGM_FR_ROW_REMAP_FAILURE_NEXT
# :652, DCGM_FR_XID_ERROR_NEXT :683, DCGM_FR_FALLEN_OFF_BUS_NEXT :700; DcgmError.h SetFullError
# joins message, next steps and details with a space).
_DBE_NEXT = "Drain the GPU and reset it or reboot the node."
_COOLING = ("Verify that the cooling on this machine is functional, including external, thermal "
            "material interface, fans, and any other components.")  # fmt: skip
_REMAP_NEXT = ("Row remapping failure indicates unrecoverable memory hardware damage. Reset the "
               "GPU or reboot the node immediately.")  # fmt: skip
_XID_NEXT = "Please consult the documentation for details of this XID."
_BUS_NEXT = ("Please re-seat the GPU, check for thermal and power issues, and verify that there is "
             "no outstanding bug against your driver or BIOS versions. If the issue persists, "
             "please run a field diagnostic on the GPU.")  # fmt: skip


#: the dcgm-exporter's health_error_code of a health incident (DCGM_FR_* names as its
#: healthCheckErrorToStringMap spells them, gpu_health_collector.go:324-457 @691c927)
_XID_CODES = {79: "DCGM_FR_FALLEN_OFF_BUS", 64: "DCGM_FR_ROW_REMAP_FAILURE",
              63: "DCGM_FR_PENDING_PAGE_RETIREMENTS", 60: "DCGM_FR_CLOCK_THROTTLE_THERMAL",
              95: "DCGM_FR_UNCONTAINED_ERROR", 94: "DCGM_FR_UNKNOWN(131)"}  # fmt: skip


def _xid_incident(i: int, xid: int) -> tuple | None:
    info = XID_HEALTH.get(xid)
    if info is None:
        return None
    health, system, text = info
    if xid == 79:
        head = f"GPU {i} has fallen off the bus {_BUS_NEXT}"
    elif xid == 64:
        head = f"GPU {i} had uncorrectable memory errors and row remapping failed. {_REMAP_NEXT}"
    else:
        head = f"Detected XID {xid} for GPU {i} {_XID_NEXT}"
    if system != "ALL":  # subsystem XIDs substitute %u (DcgmHealthWatch.cpp:3540-3552)
        text = text.replace("%u", str(i))
    code = _XID_CODES.get(xid, "DCGM_FR_XID_ERROR")
    return (system, health, f"{head}  (triggered by XID {xid}: {text})", code)


def gpu_health(g: dict, st: dict) -> list:
    """DCGM health incidents of one GPU: (system, 'Failure'|'Warning', message, DCGM_FR code)
    tuples, in the order DCGM's health watch reports them (memory, thermal, XIDs)."""
    i = g["index"]
    out = []
    fault = gpu_fault(st, i)
    s = gpu_sample(g, st)
    if s["ecc_dbe_vol"] > 0:  # DcgmHealthWatch.cpp:1736-1741
        out.append(("Memory", "Failure",
                    f"Detected {s['ecc_dbe_vol']} volatile double-bit ECC error(s) in GPU {i}. "
                    f"{_DBE_NEXT}", "DCGM_FR_VOLATILE_DBE_DETECTED"))  # fmt: skip
    if s["row_remap_failure"]:  # :1927-1932
        out.append(("Memory", "Failure",
                    f"GPU {i} had uncorrectable memory errors and row remapping failed. "
                    f"{_REMAP_NEXT}", "DCGM_FR_ROW_REMAP_FAILURE"))  # fmt: skip
    if s["thermal_slowdown"] and not fault.get("missing"):  # :2406-2411
        out.append(("Thermal", "Warning",
                    f"Detected clocks event due to thermal violation in GPU {i}. {_COOLING}",
                    "DCGM_FR_CLOCK_THROTTLE_THERMAL"))  # fmt: skip
    seen = set()
    for e in s["xid_events"]:
        xid = int(e["xid"])
        if xid in seen:
            continue
        seen.add(xid)
        inc = _xid_incident(i, xid)
        if inc:
            out.append(inc)
    return out


def daemonize(pidfile: str | None) -> None:
    """Fork into the background like the real daemons do (Type=forking units)."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    write_pidfile(pidfile)


def write_pidfile(pidfile: str | None) -> None:
    if pidfile:
        os.makedirs(os.path.dirname(path(pidfile)), exist_ok=True)
        with open(path(pidfile), "w", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")


def err(msg: str) -> None:
    sys.stderr.write(msg.rstrip("\n") + "\n")


# --- the host engine wire protocol (simulation only) -----------------------------------------

DCGM_PORT = 5555


def request(host: str, port: int, req: dict, timeout: float = 5.0) -> dict:
    """One request to a running host engine (used by dcgmi and dcgm-exporter)."""
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except socket.gaierror:
        if host != "localhost":
            raise
        conn = socket.create_connection(("127.0.0.1", port), timeout=timeout)  # no /etc/hosts
    with conn as s:
        s.sendall(json.dumps(req).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    return json.loads(buf)


def parse_hostport(text: str, default_port: int = DCGM_PORT) -> tuple:
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") else default_port
        return host, port
    if text.count(":") == 1:
        host, port = text.split(":")
        return host or "localhost", int(port)
    return text or "localhost", default_port


def dcgm_version() -> str:
    return BUILD.get("dcgm_version") or (read_json(DCGM_CORE_FILE) or {}).get("version", "")


def dcgm_version_text(version: str) -> str:
    """The build info block of ``dcgmi -v`` (gpu_reality_fixtures/dcgmi/dcgmi-v__dcgm-4.7.0.txt);
    the SIMULATED mark sits in the Commit ID and Build Platform values."""
    return (f"Version : {version}\nBuild ID : 1\nBuild Date : {BUILD.get('build_date', '2025-10-01')}\n"
            f"Build Type : Release\nCommit ID : gpusim-SIMULATED\nBranch Name : v{version}\n"
            f"CPU Arch : x86_64\nBuild Platform : Linux x86_64 ({SIM_NOTE})\n"
            f"CRC : 00000000000000000000000000000000\n")  # fmt: skip


def jsoncpp_styled(value) -> str:
    """``value`` as jsoncpp's ``Value::toStyledString`` prints it, which dcgmi's JSON output
    calls (NVIDIA/DCGM ``dcgmi/DcgmiOutput.cpp:547-550``, ``dcgmi/Diag.cpp:1303`` @v4.6.0): a
    tab per level, keys sorted, ``"key" : `` and a non-empty object or array opening on the next
    line, an empty one as ``{}`` / ``[]``, characters outside ASCII as ``\\uXXXX``, then a
    newline (tests/fixtures/jsoncpp: real jsoncpp's output of the same values)."""

    def write(v, depth: int, inline: bool) -> str:
        if isinstance(v, dict | list) and v:
            head = "" if inline else "\n" + "\t" * depth
            inner = "\t" * (depth + 1)
            if isinstance(v, dict):
                items = [f'{inner}{json.dumps(str(k))} : {write(v[k], depth + 1, False)}'
                         for k in sorted(v)]  # fmt: skip
                return head + "{\n" + ",\n".join(items) + "\n" + "\t" * depth + "}"
            items = [inner + write(x, depth + 1, True) for x in v]
            return head + "[\n" + ",\n".join(items) + "\n" + "\t" * depth + "]"
        if isinstance(v, dict):
            return "{}"
        if isinstance(v, list):
            return "[]"
        return json.dumps(v)

    return write(value, 0, True) + "\n"


def version_tuple(version: str) -> tuple:
    """A release's numbers (``4.5.3`` -> ``(4, 5, 3)``), to compare releases."""
    return tuple(int(p) for p in version.split(".")[:3] if p.isdigit())
