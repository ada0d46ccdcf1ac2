"""SIMULATED ``dcgm-exporter``: serves ``/metrics`` and ``/health`` on ``-a`` (default :9400)
with the real metric names, types, HELP texts (from the ``-f`` CSV) and labels, values from the
host's fault state; embedded mode by default, ``-r host:port`` to use a running nv-hostengine.
"""

import os
import re
import socket
import stat
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

if __package__:  # imported from the source tree (the tests, the package builder)
    from deployer.lab.gpusim.standins import common as c
    from deployer.lab.gpusim.standins import webconfig
else:  # installed on a simulated host: the package ships gpusim_common.py
    import gpusim_common as c  # type: ignore[no-redef]
    import gpusim_webconfig as webconfig  # type: ignore[no-redef]

DEFAULT_CSV = "/etc/dcgm-exporter/default-counters.csv"
TYPES = ("gauge", "counter", "label")
BLANK = None  # a DCGM blank value: the exporter skips it (gpu_collector.go:303 @691c927)
#: Exporter counters: the only DCGM_EXP_* names (internal/pkg/counters/const.go:25-28 @691c927)
#: and their ids (exporter_counters.go:24-29: iota + 9000), which sort them after DCGM's fields
EXPORTER_METRICS = {"DCGM_EXP_XID_ERRORS_COUNT": 9001, "DCGM_EXP_CLOCK_EVENTS_COUNT": 9002,
                    "DCGM_EXP_GPU_HEALTH_STATUS": 9003, "DCGM_EXP_P2P_STATUS": 9004}  # fmt: skip


def _g(key):
    return lambda g, s, x: s[key]


def _const(v):
    return lambda g, s, x: v


def _if(cond, fn):
    return lambda g, s, x: fn(g, s, x) if cond(g) else BLANK


def _nvlink(g: dict) -> bool:
    return bool(g.get("nvlink")) and g.get("mig") is None  # "not supported ... in MIG mode"


def _remap(g: dict) -> bool:
    return bool(g.get("row_remap")) and g.get("mig") is None  # MIG captures: remapped rows N/A


def _mem_temp(g, s, x):
    # a board without a memory sensor reads 0 (l40s_595.58.03_default-counters.metrics)
    return 0 if s["memory_temp"] is None else s["memory_temp"]


#: DCGM field id -> (value type, where it lives on a MIG GPU, fn(gpu, sample, ctx)).
#: Scope "gpu": the GPU's value on every GPU instance (DcgmCacheManager.cpp:6215 @v4.5.3 remaps a
#: GPU-level field of an instance to its GPU; a800_mig_535.129.03 shows temperatures, power and
#: energy per instance); "gi": the instance's own value (FB, XID, profiling); "nomig": blank on a
#: GPU in MIG mode (NVML has no utilisation or remapped rows there: the H100/H200 MIG nvidia-smi
#: captures print [N/A], a800_mig has no GPU_UTIL or row-remap series for its MIG GPU).
SPECS = {
    1: ("string", "gpu", lambda g, s, x: x["driver"]),
    2: ("string", "gpu", lambda g, s, x: x["nvml"]),
    50: ("string", "gpu", lambda g, s, x: g["name"]),
    51: ("string", "gpu", lambda g, s, x: g.get("brand", "NVIDIA")),
    53: ("string", "gpu", lambda g, s, x: g["serial"]),
    54: ("string", "gpu", lambda g, s, x: g["uuid"]),
    56: ("string", "gpu", lambda g, s, x: g.get("inforom", {}).get("oem", "N/A")),
    80: ("string", "gpu", lambda g, s, x: g.get("inforom", {}).get("ecc", "N/A")),
    81: ("string", "gpu", _const(BLANK)),
    82: ("string", "gpu", lambda g, s, x: g.get("inforom", {}).get("img", "N/A")),
    85: ("string", "gpu", lambda g, s, x: g["vbios_version"]),
    100: ("int", "gpu", _g("sm_clock")),
    101: ("int", "gpu", _g("mem_clock")),
    112: ("int", "gpu", _g("clocks_event_reasons")),
    140: ("int", "gpu", _mem_temp),
    150: ("int", "gpu", _g("gpu_temp")),
    151: ("int", "gpu", lambda g, s, x: g["mem_max_op_temp"] if g.get("memory_sensor", True)
          else BLANK),  # docs/unverified.md#gpusim-sensorless-thresholds
    152: ("int", "gpu", lambda g, s, x: g.get("gpu_max_op_temp")),
    155: ("double", "gpu", _g("power_w")),
    156: ("int", "gpu", _g("energy_mj")),
    158: ("int", "gpu", lambda g, s, x: g["slowdown_temp"]),
    159: ("int", "gpu", lambda g, s, x: g["shutdown_temp"]),
    160: ("double", "gpu", lambda g, s, x: float(g["power_limit_w"])),
    164: ("double", "gpu", lambda g, s, x: float(g["power_limit_w"])),
    200: ("int", "gpu", lambda g, s, x: int(s["pcie_tx"] / 1024)),
    201: ("int", "gpu", lambda g, s, x: int(s["pcie_rx"] / 1024)),
    202: ("int", "gpu", _g("pcie_replay")),
    203: ("int", "nomig", _g("util")),
    204: ("int", "nomig", _g("mem_util")),
    206: ("int", "nomig", _const(0)),
    207: ("int", "nomig", _const(0)),
    # blank until the first XID (DcgmCacheManager.cpp:12195-12197 @v4.4.2: only the NVML event
    # thread writes it; the L40S scrape has no XID_ERRORS series)
    230: ("int", "gi", _g("xid_last")),  # docs/unverified.md#gpusim-mig-xid
    237: ("int", "gpu", lambda g, s, x: g["pcie_gen"]),
    238: ("int", "gpu", lambda g, s, x: g["pcie_width"]),
    **{fid: ("int", "gpu", _const(0)) for fid in (240, 241, 242, 243, 244, 245)},
    250: ("int", "gi", lambda g, s, x: x["gi"]["memory_mib"] if x.get("gi") else s["fb_total"]),
    251: ("int", "gi", lambda g, s, x: x["gi_sample"]["free"] if x.get("gi") else s["fb_free"]),
    252: ("int", "gi", lambda g, s, x: x["gi_sample"]["used"] if x.get("gi") else s["fb_used"]),
    253: ("int", "gi", lambda g, s, x: 0 if x.get("gi") else s["fb_reserved"]),
    310: ("int", "gpu", _g("ecc_sbe_vol")),
    311: ("int", "gpu", _g("ecc_dbe_vol")),
    312: ("int", "gpu", _g("ecc_sbe_agg")),
    313: ("int", "gpu", _g("ecc_dbe_agg")),
    # page retirement is Volta/Turing's; Ampere and later have row remapping (nvidia-smi -q:
    # "Retired Pages ... N/A" on H100/H200/L40S)
    390: ("int", "gpu", _if(lambda g: not g.get("row_remap"), _g("retired_sbe"))),
    391: ("int", "gpu", _if(lambda g: not g.get("row_remap"), _g("retired_dbe"))),
    392: ("int", "gpu", _if(lambda g: not g.get("row_remap"), _g("retired_pending"))),
    393: ("int", "gpu", _if(_remap, _g("uncorrectable_remapped_rows"))),
    394: ("int", "gpu", _if(_remap, _g("correctable_remapped_rows"))),
    395: ("int", "gpu", _if(_remap, _g("row_remap_failure"))),
    396: ("int", "gpu", _if(_remap, _g("row_remap_pending"))),
    **{fid: ("int", "gpu", _if(_nvlink, _const(0))) for fid in (409, 419, 429, 439)},
    440: ("int", "gpu", _if(_nvlink, lambda g, s, x: s["nvlink_bw"] // 18)),
    449: ("int", "gpu", _if(_nvlink, _g("nvlink_bw"))),
    526: ("int", "gpu", _const(0)),
    1001: ("double", "gi", lambda g, s, x: x["activity"] * 0.93),
    1002: ("double", "gi", lambda g, s, x: x["activity"] * 0.93),
    1003: ("double", "gi", lambda g, s, x: x["activity"] * 0.465),
    1004: ("double", "gi", lambda g, s, x: x["activity"] * 0.41),
    1005: ("double", "gi", lambda g, s, x: s["dram_active"]),
    1006: ("double", "gi", _const(0.0)),
    1007: ("double", "gi", lambda g, s, x: x["activity"] * 0.186),
    1008: ("double", "gi", lambda g, s, x: x["activity"] * 0.279),
    1009: ("int", "gi", lambda g, s, x: int(s["pcie_tx"])),
    1010: ("int", "gi", lambda g, s, x: int(s["pcie_rx"])),
    1011: ("int", "gi", _const(0)),
    1012: ("int", "gi", _const(0)),
}  # fmt: skip

CLOCK_EVENTS = ((0x1, "gpu_idle"), (0x2, "clocks_setting"), (0x4, "power_cap"),
                (0x8, "hw_slowdown"), (0x10, "sync_boost"), (0x20, "sw_thermal"),
                (0x40, "hw_thermal"), (0x80, "hw_power_brake"), (0x100, "display_clocks"))  # fmt: skip
#: gpu_health_collector.go:37-52 @691c927 (4.4.2-4.7.1 has no "ALL")
HEALTH_WATCHES = ("PCIE", "NVLINK", "PMU", "MCU", "MEM", "SM", "INFOROM", "THERMAL", "POWER",
                  "DRIVER", "ALL")  # fmt: skip
HEALTH_SYSTEM = {"PCIe": "PCIE", "NVLINK": "NVLINK", "Memory": "MEM", "InfoROM": "INFOROM",
                 "Thermal": "THERMAL", "Power": "POWER", "Driver": "DRIVER", "ALL": "ALL"}  # fmt: skip
HEALTH_VALUE = {"Healthy": 0, "Warning": 10, "Failure": 20}


def field_names() -> dict:
    """Field name -> DCGM id as this exporter release's go-dcgm resolves it (from build.json;
    outside a package, the newest simulated release's)."""
    names = c.BUILD.get("field_names")
    if names:
        return names
    from deployer.lab.gpusim import exporter_fields  # tests import this module directly

    return exporter_fields.field_names("4.8.3")


class CsvError(ValueError):
    pass


def parse_csv(text: str, source: str = "CSV", names: dict | None = None) -> list:
    """[(field, type, help)] from a collectors CSV, read as upstream reads it (encoding/csv with
    '#' comments, fields trimmed); errors worded as counter_config.go:92-141 @691c927 words
    them. A name go-dcgm does not know and that is not a DCGM_EXP_* name is fatal."""
    import csv
    import io

    names = field_names() if names is None else names
    rows = []
    reader = csv.reader(io.StringIO(text), skipinitialspace=False)
    width = None
    for line_no, record in enumerate(reader, start=1):
        if not record or record[0].lstrip().startswith("#") or record == [""]:
            continue
        if width is None:
            width = len(record)
        elif len(record) != width:  # Go's csv.Reader: FieldsPerRecord fixed by the first record
            raise CsvError(f"Could not read metrics file '{source}'; err: record on line "
                           f"{line_no}: wrong number of fields")  # fmt: skip
        rows.append(record)
    out = []
    for i, record in enumerate(rows):
        record = [r.strip(" ") for r in record]
        if len(record) != 3:
            raise CsvError(f"malformed CSV record; err: failed to parse line {i} "
                           f"(`[{' '.join(record)}]`), expected 3 fields")  # fmt: skip
        name, typ, help_text = record
        if name not in names and name not in EXPORTER_METRICS:
            raise CsvError(
                f"could not find DCGM field; err: unknown ExporterCounter field '{name}'"
            )
        if typ not in TYPES:
            raise CsvError(f"could not find Prometheus metric type '{typ}'")
        out.append((name, typ, help_text))
    return out


def _esc(v: str) -> str:
    return str(v)  # text/template prints label values as they are


def _fmt(v, kind: str) -> str:
    if kind == "double":
        return f"{float(v):f}"
    if kind == "int":
        return str(int(v))
    return str(v)


class HpcError(OSError):
    """The job mapping could not be read: upstream fails the whole scrape (HTTP 500)."""


class HpcMapper:
    """``--hpc-job-mapping-dir DIR`` (env ``DCGM_HPC_JOB_MAPPING_DIR``): the hpcMapper
    transformation of NVIDIA/dcgm-exporter ``internal/pkg/transformation/hpc.go``, line numbers
    @691c927 (tag 4.5.3-4.8.2; @b921c57, 4.4.2-4.7.1, where they differ), read at every scrape:

    - DIR missing when the exporter starts: ignored silently until it appears; missing later:
      an error logged, the scrape goes on unlabelled (hpc.go:39-69);
    - DIR listed (``os.ReadDir``, names sorted); an entry whose lstat fails (gone since the
      listing) or that is a directory is skipped; the names kept: ``^\\d+(\\.\\d+)?$`` (hpc.go:165-192),
      or on 4.4.2-4.7.1 what ``strconv.Atoi`` parses (hpc.go:176 @b921c57: ``+1`` and ``01`` too,
      which then match no ``gpu`` label);
    - each kept file read line by line (bufio.Scanner: ``\\n`` ends a line, a trailing ``\\r`` is
      dropped, an empty line is a job named "", a line over 64 KiB is an error); a file that
      cannot be opened or read (removed after the listing) fails the scrape (hpc.go:80-84,
      132-161; server.go:308-320 returns the error, the handler answers 500);
    - every series of a GPU whose file lists jobs is replaced by one copy per line with the
      attribute ``hpc_job`` (const.go:27), rendered after the labels with the other attributes,
      sorted by name (render_metrics.go:52-54); an empty file leaves the series as they are
      (hpc.go:107, ``len(jobs) != 0``, from 4.3.1-4.4.0). The key of a series is its ``gpu``
      label, for a MIG GPU instance ``<gpu>.<GPU_I_ID>`` (hpc.go:98-105), except on
      4.4.2-4.7.1, where every series of GPU N, its instances' too, is keyed N (hpc.go:97).
    """

    GO_SCANNER_MAX = 64 * 1024  # bufio.MaxScanTokenSize

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.instance_keys = c.BUILD.get("hpc_job_files", "gpu_or_instance") == "gpu_or_instance"
        log("INFO", f'HPC job mapping is enabled and watch for the "{directory}" directory')
        self.missing = not os.path.exists(c.path(directory))
        if self.missing:
            log("ERROR", f"HPC job mapping file directory '{directory}' not found on "
                "initialization.", error=f"stat {directory}: no such file or directory")  # fmt: skip

    def _name_ok(self, name: str) -> bool:
        if self.instance_keys:
            return re.fullmatch(r"\d+(\.\d+)?", name, flags=re.ASCII) is not None
        return re.fullmatch(r"[+-]?\d+", name, flags=re.ASCII) is not None

    def jobs(self) -> dict:
        """{file name: [job, ...]} of this scrape; ``HpcError`` when upstream fails it."""
        root = c.path(self.dir)
        if not os.path.exists(root):
            if not self.missing:
                log("ERROR", f"Unable to access HPC job mapping file directory '{self.dir}' - "
                    "directory not found. Ignoring.")  # fmt: skip
            return {}
        self.missing = False
        try:
            names = sorted(os.listdir(root))
        except OSError as e:
            raise HpcError(f"open {self.dir}: {e.strerror}") from e
        out = {}
        for name in names:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                log("WARN", f"HPC mapper: can not get file info for the {name} file.")
                continue
            if stat.S_ISDIR(st.st_mode) or not self._name_ok(name):
                continue
            full = f"{self.dir.rstrip('/')}/{name}"
            try:
                with open(os.path.join(root, name), "rb") as f:
                    data = f.read()
            except OSError as e:
                raise HpcError(f"open {full}: {e.strerror}") from e
            lines = data.split(b"\n")
            if lines and lines[-1] == b"":
                lines.pop()
            if any(len(line) >= self.GO_SCANNER_MAX for line in lines):
                raise HpcError("bufio.Scanner: token too long")
            out[name] = [line.removesuffix(b"\r").decode("utf-8", "replace") for line in lines]
        return out

    def copies(self, e: dict, jobs: dict) -> list:
        """The attributes of each copy of entity ``e``'s series: [{}] when no job maps to it."""
        key = str(e["gpu"]["index"])
        if e.get("gi") and self.instance_keys:
            key = f"{key}.{e['gi']['gi_id']}"
        return [{"hpc_job": job} for job in jobs.get(key, ())] or [{}]


class Collector:
    """Samples the GPUs and renders the exposition text; resamples every ``interval_ms`` or as soon
    as the host's fault state changes."""

    def __init__(self, counters: list, opts: dict, driver: str) -> None:
        self.counters = counters
        self.opts = opts
        self.driver = driver
        self.started = time.time()
        self.cache: tuple = ([], 0.0, None)
        self.lock = threading.Lock()
        self.names = field_names()
        self.hpc = HpcMapper(opts["hpc_dir"]) if opts.get("hpc_dir") else None

    def _state_stamp(self):
        stamps = []
        for rel in (c.STATE_FILE, c.HARDWARE_FILE):
            try:
                stamps.append(os.stat(c.path(rel)).st_mtime_ns)
            except OSError:
                stamps.append(None)
        return tuple(stamps)

    def render(self) -> str:
        """The exposition of one scrape: the cached sample (resampled every ``interval_ms`` or on
        a fault change), then the transformations, which upstream applies at every scrape
        (internal/pkg/server/server.go:308-321 @691c927). ``HpcError`` fails the scrape."""
        with self.lock:
            families, when, stamp = self.cache
            now_stamp = self._state_stamp()
            fresh = time.time() - when < self.opts["interval_ms"] / 1000.0
            if not (families and fresh and stamp == now_stamp):
                families = self._collect()
                self.cache = (families, time.time(), now_stamp)
        jobs = self.hpc.jobs() if self.hpc else None
        out = [f"# {c.SIM_NOTE}: dcgm-exporter {c.BUILD.get('exporter_tag', '')}".rstrip()]
        for name, typ, help_text, rows in families:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {typ}")
            for e, labels, attrs, value in rows:
                for extra in self.hpc.copies(e, jobs) if self.hpc else ({},):
                    out.append(f"{name}{self._labels(e, labels, {**(attrs or {}), **extra})} "
                               f"{value}")  # fmt: skip
        return "\n".join(out) + "\n"

    def _labels(self, e: dict, labels: dict, attributes: dict | None = None) -> str:
        """render_metrics.go:47 @691c927: the fixed labels in their order, then the label fields
        and extra labels sorted by name, then the attributes (err_code, err_msg) sorted."""
        g = e["gpu"]
        model = g["name"]
        if self.opts["rbmn"]:
            model = "-".join(model.split())
        pairs = [("gpu", str(g["index"])), ("uuid" if self.opts["old_ns"] else "UUID", g["uuid"]),
                 ("pci_bus_id", g["pci_bus_id"]), ("device", f"nvidia{g['index']}"),
                 ("modelName", model)]  # fmt: skip
        if e.get("gi"):
            pairs += [("GPU_I_PROFILE", e["gi"]["profile"]), ("GPU_I_ID", str(e["gi"]["gi_id"]))]
        if self.opts["hostname"]:
            pairs.append((c.BUILD.get("hostname_label", "Hostname"), self.opts["hostname"]))
        pairs += sorted(labels.items())
        pairs += sorted((attributes or {}).items())
        return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in pairs) + "}"

    def _gpus_and_state(self):
        if self.opts["remote"]:
            host, port = self.opts["remote"]
            try:
                reply = c.request(host, port, {"op": "discovery"}, timeout=5)
                hello = c.request(host, port, {"op": "hello"}, timeout=5)
            except (OSError, ValueError) as e:
                log("ERROR", f"Failed to collect metrics; host engine {host}:{port}: {e}")
                return None, None
            self.driver = hello.get("driver", self.driver)
            gpus = [g for g in reply["gpus"] if g.get("status", "OK") == "OK"]
            return gpus, c.state()
        st = c.state()
        return c.visible_gpus(c.hardware(), st), st

    def _entities(self, gpus: list) -> list:
        """devicemonitoring.GetMonitoredEntities (device_monitoring.go:41-128 @691c927): with
        -d f a GPU in MIG mode is monitored as its GPU instances, any other GPU as itself."""
        mode = self.opts["devices"]
        out = []
        for g in gpus:
            gis = c.mig_instances(g)
            if mode in ("f", "i") and gis:
                out += [{"gpu": g, "gi": gi} for gi in gis]
            elif mode in ("f", "g"):
                out.append({"gpu": g, "gi": None})
        return out

    def _collect(self) -> list:
        """[(name, type, help, rows)] in exposition order; a row is (entity, labels, attributes,
        value text), rendered by ``render``."""
        gpus, st = self._gpus_and_state()
        if gpus is None:
            return []
        samples = {g["index"]: c.gpu_sample(g, st) for g in gpus}
        entities = self._entities(gpus)
        base_ctx = {"driver": self.driver, "nvml": self.opts.get("nvml", "")}
        label_fields = [(n, self.names[n]) for n, t, _ in self.counters
                        if t == "label" and n in self.names]  # fmt: skip
        families = []
        for name, typ, help_text in self.counters:
            if typ == "label":
                continue
            if name in EXPORTER_METRICS:
                lines = self._exporter_series(name, entities, samples, st, base_ctx, label_fields)
                fid = EXPORTER_METRICS[name]
            else:
                fid = self.names[name]
                lines = self._field_series(name, fid, entities, samples, base_ctx, label_fields)
            if lines:
                families.append(((fid, name), name, typ, help_text, lines))
        # text/template ranges over the counters map in key order: FieldID first
        return [(name, typ, help_text, rows)
                for _key, name, typ, help_text, rows in sorted(families, key=lambda f: f[0])]  # fmt: skip

    def _ctx(self, e: dict, samples: dict, base: dict) -> dict:
        s = samples[e["gpu"]["index"]]
        gi = e.get("gi")
        ctx = dict(base)
        if gi:
            gi_sample = s["instances"].get(gi["gi_id"], {"used": 0, "free": gi["memory_mib"],
                                                         "busy": False})  # fmt: skip
            ctx.update(gi=gi, gi_sample=gi_sample, activity=1.0 if gi_sample["busy"] else 0.0)
        else:
            ctx.update(gi=None, activity=1.0 if s["jobs"] else 0.0)
        return ctx

    def _label_values(self, e: dict, samples: dict, base: dict, label_fields: list) -> dict:
        s = samples[e["gpu"]["index"]]
        ctx = self._ctx(e, samples, base)
        out = {}
        for name, fid in label_fields:
            spec = SPECS.get(fid)
            if spec is None:
                continue
            v = spec[2](e["gpu"], s, ctx)
            if v is not BLANK:
                out[name] = v
        return out

    def _field_series(self, name: str, fid: int, entities: list, samples: dict, base: dict,
                      label_fields: list) -> list:  # fmt: skip
        spec = SPECS.get(fid)
        if spec is None:  # a real field the simulation has no reading for: blank, skipped
            return []
        kind, scope, fn = spec
        lines = []
        for e in entities:
            g = e["gpu"]
            if scope == "nomig" and g.get("mig") is not None:
                continue
            v = fn(g, samples[g["index"]], self._ctx(e, samples, base))
            if v is BLANK:
                continue
            attrs = None
            if fid == 230:  # gpu_collector.go:323-331: err_code / err_msg on XID_ERRORS
                code = int(v)
                text = c.XID_TEXT.get(code) if 0 <= code <= c.XID_TABLE_END else None
                attrs = {"err_code": str(code), "err_msg": text or c.UNKNOWN_XID_TEXT}
            labels = self._label_values(e, samples, base, label_fields)
            lines.append((e, labels, attrs, _fmt(v, kind)))
        return lines

    def _exporter_series(self, name: str, entities: list, samples: dict, st: dict, base: dict,
                         label_fields: list) -> list:  # fmt: skip
        lines = []
        now = time.time()
        for e in entities:
            g = e["gpu"]
            s = samples[g["index"]]
            labels = self._label_values(e, samples, base, label_fields)
            if name == "DCGM_EXP_XID_ERRORS_COUNT":  # expcollector.go:39-109, xid_collector.go
                win = self.opts["xid_window_ms"]
                counts: dict = {}
                for ev in s["xid_events"]:
                    if now - float(ev.get("time", 0)) <= win / 1000.0:
                        counts[int(ev["xid"])] = counts.get(int(ev["xid"]), 0) + 1
                window = {"window_size_in_ms": str(win)}
                if not counts:  # "Create metric with Zero value" (expcollector.go:101-104)
                    lines.append((e, {**labels, **window}, None, "0"))
                for xid, n in counts.items():
                    lines.append((e, {**labels, **window, "xid": str(xid)}, None, str(n)))
            elif name == "DCGM_EXP_CLOCK_EVENTS_COUNT":  # clock_events_collector.go
                window = {"window_size_in_ms": str(self.opts["clock_window_ms"])}
                active = [label for mask, label in CLOCK_EVENTS if s["clocks_event_reasons"] & mask]
                if not active:
                    lines.append((e, {**labels, **window}, None, "0"))
                for label in active:
                    lines.append((e, {**labels, **window, "clock_event": label}, None, "1"))
            elif name == "DCGM_EXP_GPU_HEALTH_STATUS":
                # only GPU entities: the collector's group holds FE_GPUs (gpu_health_collector.go
                # :242-244), so instances of a MIG GPU get no series
                if e.get("gi"):
                    continue
                watches = (
                    HEALTH_WATCHES if c.BUILD.get("version") != "4.7.1" else HEALTH_WATCHES[:-1]
                )
                found = {}
                for system, level, _msg, code in c.gpu_health(g, st):
                    found[HEALTH_SYSTEM.get(system, system)] = (level, code)
                for watch in watches:
                    level, code = found.get(watch, ("Healthy", "DCGM_FR_OK"))
                    extra = {**labels, "health_watch": watch, "health_error_code": code}
                    lines.append((e, extra, None, str(HEALTH_VALUE[level])))
            # DCGM_EXP_P2P_STATUS: accepted, not modelled (see the gpusim README)
        return lines


def log(level: str, msg: str, **attrs) -> None:
    """One log/slog text-handler line on stderr, as dcgm-exporter 4.x logs."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
    extra = "".join(f" {k}={v}" for k, v in attrs.items())
    sys.stderr.write(f'time={stamp} level={level} msg="{msg}"{extra}\n')
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
        # parsed but unused upstream: NoHostname is read nowhere (git grep NoHostname @691c927)
        "no_hostname": env.get("DCGM_EXPORTER_NO_HOSTNAME", "false").lower() == "true",
        "kubernetes": False,
        "devices": env.get("DCGM_EXPORTER_DEVICES_STR", "f"),
        "old_ns": False,
        "rbmn": False,
        "xid_window_ms": int(env.get("DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE", "300000")),
        "clock_window_ms": 300000,
        "hpc_dir": env.get("DCGM_HPC_JOB_MAPPING_DIR", ""),
        "web_config": "",
        "mode": "run",
    }
    takes = {"-f": "csv", "--collectors": "csv", "-a": "listen", "--address": "listen",
             "-c": "interval_ms", "--collect-interval": "interval_ms",
             "-r": "remote", "--remote-hostengine-info": "remote",
             "-x": "xid_window_ms", "--xid-count-window-size": "xid_window_ms",
             "--clock-events-count-window-size": "clock_window_ms",
             "-d": "devices", "--devices": "devices",
             "--hpc-job-mapping-dir": "hpc_dir"}  # fmt: skip
    ignored_values = {"-s", "--switch-devices", "-p", "--cpu-devices", "-m",
                      "--configmap-data", "--log-format", "--dcgm-log-level"}  # fmt: skip
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
        elif a in ("-k", "--kubernetes"):
            o["kubernetes"] = True
        elif a in ("--enable-dcgm-log", "--disable-startup-validate", "--enable-pprof",
                   "--web-systemd-socket"):  # fmt: skip
            pass
        elif a == "--web-config-file":
            if val is None:
                i += 1
                if i >= len(argv):
                    raise ValueError(f"flag needs an argument: {a}")
                val = argv[i]
            o["web_config"] = val
        else:
            raise ValueError(f"flag provided but not defined: {a}")
        i += 1
    if o["devices"] not in ("f", "g", "i"):
        raise ValueError(f"Invalid device option '{o['devices']}' (simulated: f, g, i)")
    return o


def hostname_label_value(o: dict) -> str:
    """hostname.GetHostname (internal/pkg/hostname/hostname.go:29-61, the same at 4.4.2-4.7.1,
    691c927 and d5e5f51): in Kubernetes (-k) the local name; with -r the host part of -r as
    given (``-r localhost:5555`` -> ``localhost`` on every host); else $NODE_NAME or the host's
    name."""
    if o["remote"] and not o["kubernetes"]:
        text = o["remote"] if isinstance(o["remote"], str) else ""
        host, _, port = text.rpartition(":")
        return host.strip("[]") if port.isdigit() and host else text
    return os.environ.get("NODE_NAME") or c.hostname()


def main(argv: list) -> int:
    try:
        o = _parse(argv)
    except ValueError as e:
        log("ERROR", str(e))
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
    log("INFO", "Starting dcgm-exporter", Version=tag, simulated="true")
    o["hostname"] = hostname_label_value(o)
    try:
        with open(c.path(o["csv"]), encoding="utf-8") as f:
            counters = parse_csv(f.read(), o["csv"])
    except OSError as e:
        log(
            "ERROR", f"Could not read metrics file '{o['csv']}'; err: open {o['csv']}: {e.strerror}"
        )
        return 1
    except CsvError as e:  # counters.GetCounterSet fails: slog.Error, os.Exit(1) (app.go:942-945)
        log("ERROR", str(e))
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
            log("ERROR", f"Error connecting to nv-hostengine at {host}:{port}: {e}. Host engine "
                "connection invalid/disconnected")  # fmt: skip
            return 1
        driver = hello.get("driver", "")
        log("INFO", f"Attemping to connect to remote hostengine at {host}:{port}")
    else:
        try:
            driver = c.nvml_init()["version"]
        except c.NvmlError as e:
            log("ERROR", f"Error starting embedded DCGM: {e.message.splitlines()[0]}")
            return 1
    collector = Collector(counters, o, driver)
    try:
        family, host, port = parse_listen(o["listen"])
    except ValueError as e:
        log("ERROR", str(e))
        return 1

    web_config = o["web_config"]
    use_tls = False
    if web_config:
        # web.ListenAndServe: the config is validated at start (an error exits), TLS or not is
        # decided once (exporter-toolkit web/tls_config.go, v0.8.2 5b1eab3)
        try:
            use_tls = webconfig.tls_enabled(webconfig.load(web_config, c.path))
            if use_tls:
                webconfig.server_context(web_config, c.path)
        except (OSError, ValueError, webconfig.ssl.SSLError) as e:
            log("ERROR", "Failed to start webserver", error=str(e))
            return 1

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if web_config:
                try:
                    ok = webconfig.authorized(web_config, self.headers.get("Authorization"), c.path)
                except (OSError, ValueError) as e:  # handler.go: a config it cannot read is a 500
                    log("ERROR", "Unable to parse configuration", err=str(e))
                    self.send_error_text(500, "Internal Server Error")
                    return
                if not ok:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", "Basic")
                    body = b"Unauthorized\n"
                    self.send_header("Content-Type", "text/plain; charset=utf-8")
                    self.send_header("X-Content-Type-Options", "nosniff")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
            if path == "/metrics":
                try:
                    body = collector.render().encode()
                except HpcError as e:
                    # server.go:310-319: logged, the error returned; the handler answers 500
                    log("ERROR", "Failed to apply transformations on metrics", error=str(e),
                        transformation="hpcMapper")  # fmt: skip
                    self.send_error_text(500, "internal server error")
                    return
                ctype = "text/plain; version=0.0.4; charset=utf-8"
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

        def send_error_text(self, code: int, text: str) -> None:
            """Go's http.Error: the text and a newline, as text/plain."""
            body = f"{text}\n".encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    class Server(ThreadingHTTPServer):
        address_family = family
        allow_reuse_address = True
        daemon_threads = True

        def get_request(self):
            sock, addr = super().get_request()
            if use_tls:
                # the config and certificate as they are now, for this connection; the handshake
                # runs in the connection's own thread (on its first read)
                try:
                    ctx = webconfig.server_context(web_config, c.path)
                except (OSError, ValueError, webconfig.ssl.SSLError) as e:
                    log("ERROR", "TLS configuration error", error=str(e))
                    sock.close()
                    raise OSError("no TLS config") from e
                sock = ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            return sock, addr

        def handle_error(self, request, client_address) -> None:
            # Go's net/http logs a failed handshake, a client gone mid-handshake included
            # (server.go conn.serve: "http: TLS handshake error from %s: %v"), except plain
            # HTTP to the TLS port (answered "400 Bad Request", not logged); other errors of a
            # connection (a client gone mid-response) it does not log
            exc = sys.exc_info()[1]
            if isinstance(exc, webconfig.ssl.SSLError) and exc.reason != "HTTP_REQUEST":
                addr = f"{client_address[0]}:{client_address[1]}"
                log("ERROR", f"http: TLS handshake error from {addr}: {exc}")

    try:
        server = Server((host, port), Handler)
    except OSError as e:
        log("ERROR", f"Failed to listen on {o['listen']}: {e.strerror}")
        return 1
    import signal

    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    log("INFO", "Starting webserver", address=o["listen"])
    log("INFO", "TLS is enabled." if use_tls else "TLS is disabled.", address=o["listen"])
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
