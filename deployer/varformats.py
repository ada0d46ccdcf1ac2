"""The formats of values the product passes to daemons as flags, checked before any host is touched.

A role lists its flag variables in ``meta/argument_specs.yml`` (Ansible's layout, with a
``format`` per option; see deployer/roles.py); the planner checks every host's value against the
daemon's own parser, re-implemented here from its source, so that a value the daemon would refuse
at start (and crash-loop on) fails the run with exit 2, naming the variable and the host.

Each checker returns None when the value is accepted, else why not (in words).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

_INT64_MAX = (1 << 63) - 1
_NS = {"ns": 1, "us": 10**3, "µs": 10**3, "μs": 10**3, "ms": 10**6, "s": 10**9}
_NS |= {"m": 60 * 10**9, "h": 3600 * 10**9}

# prometheus/common model.ParseDuration as Prometheus 2.42 uses it (go.mod: prometheus/common
# v0.39.0), model/time.go lines 186-230 at 296ec92f02fd5e3c15443437e98b573d968eaa14: "0", or
# integers with the units y w d h m s ms, each at most once, biggest first; the total must fit
# a time.Duration (int64 nanoseconds). Later versions keep that grammar (model/time.go
# ParseDuration at d2417e2cbb82c4c81e4d28d55f354058169a9f08 parses the same by hand).
_PROM_DURATION = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$"
)
_PROM_UNITS_MS = (
    365 * 86_400_000,
    7 * 86_400_000,
    86_400_000,
    3_600_000,
    60_000,
    1000,
    1,
)


def prometheus_seconds(value: str) -> float:
    """A Prometheus duration (``15s``, ``1m30s``, ``2h``) in seconds; ValueError when it is none
    (``prometheus_duration`` says why)."""
    m = _PROM_DURATION.match(str(value).strip())
    if m is None or not any(m.groups()):
        raise ValueError(f"not a Prometheus duration: {value!r}")
    ms = sum(int(n) * unit for n, unit in zip(m.groups(), _PROM_UNITS_MS, strict=True) if n)
    return ms / 1000


def prometheus_duration(value: str) -> str | None:
    if value == "0":
        return None
    if value == "":
        return "empty (a Prometheus duration such as 15d, 12h or 1w2d)"
    m = _PROM_DURATION.match(value)
    if m is None:
        return (
            "not a Prometheus duration: whole numbers with the units y, w, d, h, m, s, ms, "
            "each at most once and biggest first (15d, 1w2d, 90m)"
        )
    total_ns = sum(
        int(n) * unit * 10**6 for n, unit in zip(m.groups(), _PROM_UNITS_MS, strict=True) if n
    )
    if total_ns > _INT64_MAX:
        return "out of range (at most about 292 years)"
    return None


# Go's time.ParseDuration, which kingpin's Duration() flags call (alecthomas/kingpin v2.2.6,
# values.go lines 122-126 at 947dcec5ba9c011838740e680966fd7087a71d0d; Alertmanager 0.25's
# --data.retention and --cluster.* durations, cmd/alertmanager/main.go lines 204-226 at
# 258fab7cdd551f2cf251ed0348f0ad7289aee789): "a possibly signed sequence of decimal numbers,
# each with optional fraction and a unit suffix ... ns, us (or µs), ms, s, m, h"
# (https://pkg.go.dev/time#ParseDuration); "0" needs no unit; the total fits int64 nanoseconds.
_GO_ELEMENT = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def go_duration(value: str) -> str | None:
    s = value[1:] if value[:1] in ("+", "-") else value
    if s == "0":
        return None
    why = "not a Go duration: numbers with the units ns, us, ms, s, m, h (120h, 1h30m, 15s)"
    if not s:
        return why
    pos, total = 0, 0.0
    while pos < len(s):
        m = _GO_ELEMENT.match(s, pos)
        if m is None:
            return why
        total += float(m.group(1)) * _NS[m.group(2)]
        pos = m.end()
    if total > _INT64_MAX:
        return "out of range (at most about 292 years)"
    return None


# alecthomas/units ParseBase2Bytes, the type of --storage.tsdb.retention.size (Prometheus 2.42,
# cmd/prometheus/main.go lines 321-322 at 225c61122d88b01d1f0eaaee0e05b6f3e0567ac0; go.mod:
# alecthomas/units b94a6e3cc137): bytes.go tries the units B KiB MiB GiB TiB PiB EiB, then
# B KB MB GB TB PB EB (both base 2); util.go ParseUnit: "0", or an optional sign then numbers
# (fractions allowed) each followed by a unit of that one set.
_BYTES_IEC = {"B": 1, **{f"{p}iB": 1024 ** (i + 1) for i, p in enumerate("KMGTPE")}}
_BYTES_OLD = {"B": 1, **{f"{p}B": 1024 ** (i + 1) for i, p in enumerate("KMGTPE")}}
_BYTES_ELEMENT = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([^\d.]*)")


def base2_bytes(value: str) -> str | None:
    s = value[1:] if value[:1] in ("+", "-") else value
    if s == "0":
        return None
    why = "not a size: a number and one of B, KB, MB, GB, TB, PB, EB (powers of 2; 512MB, 1TB)"
    for units in (_BYTES_IEC, _BYTES_OLD):
        pos, total, ok = 0, 0.0, bool(s)
        while ok and pos < len(s):
            m = _BYTES_ELEMENT.match(s, pos)
            if m is None or m.group(2) not in units:
                ok = False
                break
            total += float(m.group(1)) * units[m.group(2)]
            pos = m.end()
        if ok:
            return None if total <= _INT64_MAX else "out of range"
    return why


_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?(\.[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?)*\.?$"
)


def host(value: str) -> str | None:
    """A host name or an IP address (no port)."""
    if _HOSTNAME.match(value):
        return None
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        return "not a host name or IP address"


def listen_address(value: str) -> str | None:
    """``host:port`` as Go's net.Listen("tcp", ...) takes it (net.SplitHostPort): the host may
    be empty (every address) and an IPv6 address is bracketed. gpumon-deploy accepts numeric
    ports only (Go would also look a service name up in /etc/services)."""
    why = "not a listen address host:port (0.0.0.0:9090, [::1]:9090, :9090)"
    head, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        return why
    if head.startswith("["):
        if not head.endswith("]"):
            return why
        try:
            ipaddress.IPv6Address(head[1:-1])
        except ValueError:
            return why
        return None
    if ":" in head:
        return why + ": bracket an IPv6 address"
    return None if head == "" or host(head) is None else why


def port(value: str) -> str | None:
    return None if value.isdigit() and 1 <= int(value) <= 65535 else "not a port (1-65535)"


# kingpin long flags: --name or --name=value (app.go/parser.go: "--" then the flag's name).
_CLI_FLAG = re.compile(r"^--[A-Za-z0-9][A-Za-z0-9._-]*(=.*)?$", re.DOTALL)


def cli_flag(value: str) -> str | None:
    if "\n" in value:
        return "a flag must be one line"
    return None if _CLI_FLAG.match(value) else "not a long flag (--name or --name=value)"


FORMATS: dict[str, Callable[[str], str | None]] = {
    "prometheus_duration": prometheus_duration,
    "go_duration": go_duration,
    "base2_bytes": base2_bytes,
    "host": host,
    "listen_address": listen_address,
    "port": port,
    "cli_flag": cli_flag,
}
