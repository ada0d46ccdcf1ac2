"""SIMULATED ``dcgm-exporter``: serves ``/metrics`` and ``/health`` on ``-a`` (default :9400)
with the real metric names, types, HELP texts (from the ``-f`` CSV) and labels, values from the
host's fault state; embedded mode by default, ``-r host:port`` to use a running nv-hostengine.
"""

import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

try:
    from deployer.lab.gpusim.standins import common as c
except ImportError:  # installed on a simulated host: the package ships gpusim_common.py
    import gpusim_common as c  # type: ignore[no-redef]

DEFAULT_CSV = "/etc/dcgm-exporter/default-counters.csv"
TYPES = ("gauge", "counter", "label")


def _g(key):
    return lambda g, s, x: s[key]


#: DCGM field -> value of one GPU (None = blank, not emitted). ``x`` is the collection context.
FIELDS = {
    "DCGM_FI_DEV_SM_CLOCK": _g("sm_clock"),
    "DCGM_FI_DEV_MEM_CLOCK": _g("mem_clock"),
    "DCGM_FI_DEV_MEMORY_TEMP": _g("memory_temp"),
    "DCGM_FI_DEV_GPU_TEMP": _g("gpu_temp"),
    "DCGM_FI_DEV_MEM_MAX_OP_TEMP": lambda g, s, x: g["mem_max_op_temp"],
    "DCGM_FI_DEV_GPU_MAX_OP_TEMP": lambda g, s, x: g["gpu_max_op_temp"],
    "DCGM_FI_DEV_SLOWDOWN_TEMP": lambda g, s, x: g["slowdown_temp"],
    "DCGM_FI_DEV_SHUTDOWN_TEMP": lambda g, s, x: g["shutdown_temp"],
    "DCGM_FI_DEV_POWER_USAGE": _g("power_w"),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": lambda g, s, x: float(g["power_limit_w"]),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": lambda g, s, x: float(g["power_limit_w"]),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": _g("energy_mj"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": _g("pcie_replay"),
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": lambda g, s, x: int(s["pcie_tx"] / 1024),
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": lambda g, s, x: int(s["pcie_rx"] / 1024),
    "DCGM_FI_DEV_PCIE_LINK_GEN": lambda g, s, x: g["pcie_gen"],
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": lambda g, s, x: g["pcie_width"],
    "DCGM_FI_DEV_GPU_UTIL": _g("util"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": _g("mem_util"),
    "DCGM_FI_DEV_ENC_UTIL": lambda g, s, x: 0,
    "DCGM_FI_DEV_DEC_UTIL": lambda g, s, x: 0,
    "DCGM_FI_DEV_XID_ERRORS": _g("xid_last"),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": _g("clocks_event_reasons"),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": _g("clocks_event_reasons"),
    "DCGM_FI_DEV_POWER_VIOLATION": lambda g, s, x: 0,
    "DCGM_FI_DEV_THERMAL_VIOLATION": lambda g, s, x: 0,
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": lambda g, s, x: 0,
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": lambda g, s, x: 0,
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION": lambda g, s, x: 0,
    "DCGM_FI_DEV_RELIABILITY_VIOLATION": lambda g, s, x: 0,
    "DCGM_FI_DEV_FB_TOTAL": _g("fb_total"),
    "DCGM_FI_DEV_FB_FREE": _g("fb_free"),
    "DCGM_FI_DEV_FB_USED": _g("fb_used"),
    "DCGM_FI_DEV_FB_RESERVED": _g("fb_reserved"),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": _g("ecc_sbe_vol"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": _g("ecc_dbe_vol"),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": _g("ecc_sbe_agg"),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": _g("ecc_dbe_agg"),
    "DCGM_FI_DEV_RETIRED_SBE": _g("retired_sbe"),
    "DCGM_FI_DEV_RETIRED_DBE": _g("retired_dbe"),
    "DCGM_FI_DEV_RETIRED_PENDING": _g("retired_pending"),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": lambda g, s, x: 0,
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": lambda g, s, x: 0,
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": lambda g, s, x: 0,
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": lambda g, s, x: 0,
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": _g("nvlink_bw"),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0": lambda g, s, x: s["nvlink_bw"] // 18,
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": lambda g, s, x: 0,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": lambda g, s, x: (
        s["uncorrectable_remapped_rows"] if g["row_remap"] else None
    ),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": lambda g, s, x: (
        s["correctable_remapped_rows"] if g["row_remap"] else None
    ),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": lambda g, s, x: (
        s["row_remap_failure"] if g["row_remap"] else None
    ),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": lambda g, s, x: (
        s["row_remap_pending"] if g["row_remap"] else None
    ),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": _g("gr_active"),
    "DCGM_FI_PROF_SM_ACTIVE": _g("gr_active"),
    "DCGM_FI_PROF_SM_OCCUPANCY": lambda g, s, x: round(s["gr_active"] * 0.5, 6),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": _g("tensor_active"),
    "DCGM_FI_PROF_DRAM_ACTIVE": _g("dram_active"),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": lambda g, s, x: 0.0,
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": lambda g, s, x: round(s["gr_active"] * 0.2, 6),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": lambda g, s, x: round(s["gr_active"] * 0.3, 6),
    "DCGM_FI_PROF_PCIE_TX_BYTES": _g("pcie_tx"),
    "DCGM_FI_PROF_PCIE_RX_BYTES": _g("pcie_rx"),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": lambda g, s, x: 0,
    "DCGM_FI_PROF_NVLINK_RX_BYTES": lambda g, s, x: 0,
    # label-type fields
    "DCGM_FI_DRIVER_VERSION": lambda g, s, x: x["driver"],
    "DCGM_FI_NVML_VERSION": lambda g, s, x: x["nvml"],
    "DCGM_FI_DEV_BRAND": lambda g, s, x: "Tesla" if g["name"].startswith("Tesla") else "NVIDIA",
    "DCGM_FI_DEV_NAME": lambda g, s, x: g["name"],
    "DCGM_FI_DEV_UUID": lambda g, s, x: g["uuid"],
    "DCGM_FI_DEV_SERIAL": lambda g, s, x: g["serial"],
    "DCGM_FI_DEV_OEM_INFOROM_VER": lambda g, s, x: "1.1",
    "DCGM_FI_DEV_ECC_INFOROM_VER": lambda g, s, x: "7.0",
    "DCGM_FI_DEV_POWER_INFOROM_VER": lambda g, s, x: "N/A",
    "DCGM_FI_DEV_INFOROM_IMAGE_VER": lambda g, s, x: "G520.0200.00.05",
    "DCGM_FI_DEV_VBIOS_VERSION": lambda g, s, x: g["vbios_version"],
}

#: Metrics the exporter computes itself (not DCGM fields); rendered by ``_exporter_series``.
EXPORTER_METRICS = ("DCGM_EXP_XID_ERRORS_COUNT", "DCGM_EXP_XID_ERRORS_TOTAL",
                    "DCGM_EXP_CLOCK_EVENTS_COUNT", "DCGM_EXP_CLOCK_EVENTS_TOTAL",
                    "DCGM_EXP_GPU_HEALTH_STATUS", "DCGM_EXP_P2P_STATUS")  # fmt: skip

CLOCK_EVENTS = ((0x1, "gpu_idle"), (0x2, "clocks_setting"), (0x4, "power_cap"),
                (0x8, "hw_slowdown"), (0x10, "sync_boost"), (0x20, "sw_thermal"),
                (0x40, "hw_thermal"), (0x80, "hw_power_brake"), (0x100, "display_clocks"))  # fmt: skip


class CsvError(ValueError):
    pass


def parse_csv(text: str, source: str = "CSV") -> list:
    """[(field, type, help)] from a dcgm-exporter collectors CSV; raises CsvError naming the line."""
    out = []
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) != 3:
            raise CsvError(f"{source}:{n}: malformed line (need 'field, type, help'): {raw!r}")
        name, typ, help_text = parts
        if typ not in TYPES:
            raise CsvError(f"{source}:{n}: unknown metric type {typ!r} for {name}")
        if name not in FIELDS and name not in EXPORTER_METRICS:
            raise CsvError(f"{source}:{n}: could not find DCGM field {name}")
        out = [e for e in out if e[0] != name]
        out.append((name, typ, help_text))
    return out


def _esc(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    return f"{float(v):.6f}"


class Collector:
    """Samples the GPUs and renders the exposition text; resamples every ``interval_ms`` or as soon
    as the host's fault state changes."""

    def __init__(self, counters: list, opts: dict, driver: str) -> None:
        self.counters = counters
        self.opts = opts
        self.driver = driver
        self.started = time.time()
        self.cache = ("", 0.0, None)
        self.lock = threading.Lock()

    def _state_stamp(self):
        stamps = []
        for rel in (c.STATE_FILE, c.HARDWARE_FILE):
            try:
                stamps.append(os.stat(c.path(rel)).st_mtime_ns)
            except OSError:
                stamps.append(None)
        return tuple(stamps)

    def render(self) -> str:
        with self.lock:
            text, when, stamp = self.cache
            now_stamp = self._state_stamp()
            fresh = time.time() - when < self.opts["interval_ms"] / 1000.0
            if text and fresh and stamp == now_stamp:
                return text
            text = self._collect()
            self.cache = (text, time.time(), now_stamp)
            return text

    def _labels(self, g: dict, extra: dict | None = None) -> str:
        model = g["name"].replace(" ", "-") if self.opts["rbmn"] else g["name"]
        pairs = [("gpu", str(g["index"])), ("uuid" if self.opts["old_ns"] else "UUID", g["uuid"]),
                 ("pci_bus_id", g["pci_bus_id"]), ("device", f"nvidia{g['index']}"),
                 ("modelName", model)]  # fmt: skip
        if not self.opts["no_hostname"]:
            pairs.append(("Hostname", c.hostname()))
        pairs.extend(self._label_fields(g))
        pairs.extend((extra or {}).items())
        return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in pairs) + "}"

    def _label_fields(self, g: dict) -> list:
        ctx = {"driver": self.driver, "nvml": self.opts.get("nvml", "")}
        return [
            (name, FIELDS[name](g, {}, ctx)) for name, typ, _ in self.counters if typ == "label"
        ]

    def _gpus_and_state(self):
        if self.opts["remote"]:
            host, port = self.opts["remote"]
            try:
                reply = c.request(host, port, {"op": "discovery"}, timeout=5)
                hello = c.request(host, port, {"op": "hello"}, timeout=5)
            except (OSError, ValueError) as e:
                log(f'level=error msg="Failed to collect metrics; host engine {host}:{port}: {e}"')
                return None, None
            self.driver = hello.get("driver", self.driver)
            return reply["gpus"], c.state()
        st = c.state()
        return c.visible_gpus(c.hardware(), st), st

    def _collect(self) -> str:
        gpus, st = self._gpus_and_state()
        out = [f"# {c.SIM_NOTE}: dcgm-exporter {c.BUILD.get('exporter_tag', '')}".rstrip()]
        if gpus is None:
            return "\n".join(out) + "\n"
        samples = {g["index"]: c.gpu_sample(g, st) for g in gpus}
        ctx = {"driver": self.driver}
        for name, typ, help_text in self.counters:
            if typ == "label":
                continue
            if name in EXPORTER_METRICS:
                lines = self._exporter_series(name, gpus, samples, st)
            else:
                lines = []
                for g in gpus:
                    v = FIELDS[name](g, samples[g["index"]], ctx)
                    if v is not None:
                        lines.append(f"{name}{self._labels(g)} {_fmt(v)}")
            if not lines:
                continue
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {typ}")
            out.extend(lines)
        return "\n".join(out) + "\n"

    def _exporter_series(self, name: str, gpus: list, samples: dict, st: dict) -> list:
        lines = []
        now = time.time()
        win = self.opts["xid_window_ms"]
        for g in gpus:
            s = samples[g["index"]]
            if name in ("DCGM_EXP_XID_ERRORS_COUNT", "DCGM_EXP_XID_ERRORS_TOTAL"):
                counts: dict = {}
                for e in s["xid_events"]:
                    code = str(e["xid"])
                    counts.setdefault(code, 0)
                    if (
                        name.endswith("_COUNT") and now - float(e.get("time", 0)) <= win / 1000.0
                    ) or (name.endswith("_TOTAL") and float(e.get("time", 0)) >= self.started - 1):
                        counts[code] += 1
                for code, n in sorted(counts.items(), key=lambda kv: int(kv[0])):
                    extra = {"xid": code, "window_size_in_ms": str(win)} if name.endswith("_COUNT") \
                        else {"xid": code}  # fmt: skip
                    lines.append(f"{name}{self._labels(g, extra)} {n}")
            elif name in ("DCGM_EXP_CLOCK_EVENTS_COUNT", "DCGM_EXP_CLOCK_EVENTS_TOTAL"):
                bits = s["clocks_event_reasons"]
                for mask, label in CLOCK_EVENTS:
                    if bits & mask:
                        extra = {"clock_event": label}
                        if name.endswith("_COUNT"):
                            extra["window_size_in_ms"] = str(self.opts["clock_window_ms"])
                        lines.append(f"{name}{self._labels(g, extra)} 1")
            elif name == "DCGM_EXP_GPU_HEALTH_STATUS":
                incidents = c.gpu_health(g, st)
                if not incidents:
                    lines.append(
                        f"{name}{self._labels(g, {'health_watch': 'ALL', 'health_error_code': 'DCGM_FR_OK'})} 0"
                    )
                for system, level, _msg in incidents:
                    code = "DCGM_FR_" + system.upper()
                    lines.append(f"{name}{self._labels(g, {'health_watch': system.upper(), 'health_error_code': code})} "
                                 f"{20 if level == 'Failure' else 10}")  # fmt: skip
        return lines


def log(msg: str) -> None:
    sys.stderr.write(f'time="{time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}" {msg}\n')
    sys.stderr.flush()


def parse_listen(text: str) -> tuple:
    """(family, host, port) of a ``-a`` address: ``:9400``, ``127.0.0.1:9400``, ``[::]:9400``."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return socket.AF_INET6, host, int(rest.lstrip(":"))
    host, _, port = text.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"invalid listen address {text!r}")
    return socket.AF_INET, host or "0.0.0.0", int(port)


def _parse(argv: list) -> dict:
    env = os.environ
    o = {
        "csv": env.get("DCGM_EXPORTER_COLLECTORS", DEFAULT_CSV),
        "listen": env.get("DCGM_EXPORTER_LISTEN", ":9400"),
        "interval_ms": int(env.get("DCGM_EXPORTER_INTERVAL", "30000")),
        "remote": env.get("DCGM_REMOTE_HOSTENGINE_INFO"),
        "no_hostname": env.get("DCGM_EXPORTER_NO_HOSTNAME", "false").lower() == "true",
        "old_ns": False,
        "rbmn": False,
        "xid_window_ms": int(env.get("DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE", "300000")),
        "clock_window_ms": 300000,
        "mode": "run",
    }
    takes = {"-f": "csv", "--collectors": "csv", "-a": "listen", "--address": "listen",
             "-c": "interval_ms", "--collect-interval": "interval_ms",
             "-r": "remote", "--remote-hostengine-info": "remote",
             "-x": "xid_window_ms", "--xid-count-window-size": "xid_window_ms",
             "--clock-events-count-window-size": "clock_window_ms"}  # fmt: skip
    ignored_values = {"-d", "--devices", "-s", "--switch-devices", "-p", "--cpu-devices", "-m",
                      "--configmap-data", "--log-format", "--dcgm-log-level",
                      "--hpc-job-mapping-dir"}  # fmt: skip
    flags = {"-n": "no_hostname", "--no-hostname": "no_hostname", "-o": "old_ns",
             "--use-old-namespace": "old_ns", "-rbmn": "rbmn",
             "--replace-blanks-in-model-name": "rbmn"}  # fmt: skip
    i = 0
    while i < len(argv):
        a = argv[i]
        val = None
        if a.startswith("-") and "=" in a:
            a, val = a.split("=", 1)
        if a in ("-v", "--version"):
            o["mode"] = "version"
        elif a in ("-h", "--help"):
            o["mode"] = "help"
        elif a in takes or a in ignored_values:
            if val is None:
                i += 1
                if i >= len(argv):
                    raise ValueError(f"flag needs an argument: {a}")
                val = argv[i]
            if a in takes:
                key = takes[a]
                o[key] = int(val) if key.endswith("_ms") else val
        elif a in flags:
            o[flags[a]] = True
        elif a in ("-k", "--kubernetes", "--enable-dcgm-log", "--disable-startup-validate",
                   "--enable-pprof", "--web-systemd-socket"):  # fmt: skip
            pass
        elif a == "--web-config-file":
            raise ValueError("--web-config-file (TLS/basic auth) is not simulated")
        else:
            raise ValueError(f"flag provided but not defined: {a}")
        i += 1
    return o


def main(argv: list) -> int:
    try:
        o = _parse(argv)
    except ValueError as e:
        log(f'level=fatal msg="{e}"')
        return 1
    tag = c.BUILD.get("exporter_tag", "unknown")
    if o["mode"] == "version":
        sys.stdout.write(f"dcgm-exporter version {tag}\n{c.SIM_NOTE}\n")
        return 0
    if o["mode"] == "help":
        sys.stdout.write(
            f"dcgm-exporter [-f CSV] [-a ADDR] [-c MS] [-r HOST:PORT] -- {c.SIM_NOTE}\n"
        )
        return 0
    log(f'level=info msg="Starting dcgm-exporter" Version={tag} simulated=true')
    try:
        with open(c.path(o["csv"]), encoding="utf-8") as f:
            counters = parse_csv(f.read(), o["csv"])
    except OSError as e:
        log(f'level=fatal msg="Could not read collectors file {o["csv"]}: {e.strerror}"')
        return 1
    except CsvError as e:
        log(f'level=fatal msg="{e}"')
        return 1
    o["nvml"] = c.nvml_library_version() or ""
    if o["remote"]:
        host, port = c.parse_hostport(o["remote"])
        o["remote"] = (host, port)
        hello, e = None, None
        # a short grace for a host engine that is still starting (both units start together)
        deadline = time.monotonic() + float(os.environ.get("GPUSIM_HOSTENGINE_WAIT_S", "5"))
        while hello is None:
            try:
                hello = c.request(host, port, {"op": "hello"}, timeout=5)
            except (OSError, ValueError) as err:
                e = err
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.25)
        if hello is None:
            log(f'level=fatal msg="Error connecting to nv-hostengine at {host}:{port}: {e}. '
                f'Host engine connection invalid/disconnected"')  # fmt: skip
            return 1
        driver = hello.get("driver", "")
        log(f'level=info msg="Attemping to connect to remote hostengine at {host}:{port}"')
    else:
        try:
            driver = c.nvml_init()["version"]
        except c.NvmlError as e:
            log(f'level=fatal msg="Error starting embedded DCGM: {e.message.splitlines()[0]}"')
            return 1
    collector = Collector(counters, o, driver)
    try:
        family, host, port = parse_listen(o["listen"])
    except ValueError as e:
        log(f'level=fatal msg="{e}"')
        return 1

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, ctype = (
                    collector.render().encode(),
                    "text/plain; version=0.0.4; charset=utf-8",
                )
            elif path == "/health":
                body, ctype = b"OK", "text/plain; charset=utf-8"
            elif path == "/":
                body = (b"<html><head><title>GPU Exporter (SIMULATED)</title></head><body>"
                        b"<h1>GPU Exporter (SIMULATED)</h1><p><a href=\"./metrics\">Metrics</a></p>"
                        b"</body></html>")  # fmt: skip
                ctype = "text/html; charset=utf-8"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    class Server(ThreadingHTTPServer):
        address_family = family
        allow_reuse_address = True
        daemon_threads = True

    try:
        server = Server((host, port), Handler)
    except OSError as e:
        log(f'level=fatal msg="Failed to listen on {o["listen"]}: {e.strerror}"')
        return 1
    import signal

    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    log(f'level=info msg="Starting webserver" address={o["listen"]}')
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
