"""Does each daemon run what is on disk on its host, and do the replicas run the same rules?

Compared with the files on the daemon's own host (read over SSH, read-only), not with what the
product would render now: a restart loads what is on disk, so "loaded older than disk" is exactly
a reload owed (a handler lost by a failed run, a hand edit), while "disk differs from what the
inventory says" is drift, which ``up --check`` reports.

Prometheus (prometheus/prometheus v2.42.0 = 225c611, ``cmd/prometheus/main.go:1194-1206``): every reload reads prometheus.yml
and every rule file again, and only a reload that applied them all sets
``prometheus_config_last_reload_successful`` to 1 and
``prometheus_config_last_reload_success_timestamp_seconds`` to the time it finished (both on its
own ``/metrics``). So a config or rule file modified after that time, or a failed last reload,
means the replica evaluates something older than its disk. Prometheus exposes no hash of what it
loaded (``/api/v1/status/config`` is the parsed config marshalled again, defaults filled and
secrets masked: ``web/api/v1/api.go:1364-1369``), hence the modification times, taken on the
same host and clock as the reload time.

Alertmanager (prometheus/alertmanager v0.25.0 = 258fab7, ``config/coordinator.go:109-156``,
``config/config.go:189``): a successful reload sets ``alertmanager_config_hash`` to the first 6
bytes of the MD5 of the file's raw content, read as a little-endian integer; so the file on disk
is compared by content (checked on the lab's Alertmanager 0.25.0: tests/unit/
test_monitoring_status.py). Template files, loaded by the
same reload, are compared by modification time against
``alertmanager_config_last_reload_success_timestamp_seconds``.

Across replicas, the rule groups each one evaluates (``GET /api/v1/rules``: groups with ``name``,
``file``, ``interval`` and rules with ``name``, ``query``, ``duration``, ``labels``,
``annotations``: ``web/api/v1/api.go:1227-1270``) must be the same: two replicas alerting on
different rules are not a redundant pair.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from deployer.monitoring.check import FAILED, OK, Check, clock, parse_time
from deployer.monitoring.http import Fetch, api_data

PROM_RELOAD_OK = "prometheus_config_last_reload_successful"
PROM_RELOAD_TS = "prometheus_config_last_reload_success_timestamp_seconds"
AM_HASH = "alertmanager_config_hash"
AM_RELOAD_OK = "alertmanager_config_last_reload_successful"
AM_RELOAD_TS = "alertmanager_config_last_reload_success_timestamp_seconds"
START = "process_start_time_seconds"
PROMETHEUS_GAUGES = (PROM_RELOAD_OK, PROM_RELOAD_TS, START)
ALERTMANAGER_GAUGES = (AM_HASH, AM_RELOAD_OK, AM_RELOAD_TS, START)
CHECK = "loaded config = on disk"

_GLOB_SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./-*?")


def replica_started(fetch: Fetch, url: str, gauges: Mapping[str, float] | None) -> float | None:
    """When the replica's process started, as a bound every sample its predecessor wrote is
    older than: ``startTime`` of ``/api/v1/status/runtimeinfo``, the web handler's ``time.Now()``
    taken before the TSDB opens and before the first scrape (prometheus v2.42.0
    ``web/web.go:294,709``, ``cmd/prometheus/main.go:684`` vs ``:894``, 225c611).

    Not ``process_start_time_seconds``: client_golang derives it from ``/proc/stat`` ``btime``,
    whole seconds (proc(5)), so it is up to one second early (0.88 s on the lab's kernel), and a
    sample the stopped replica took just before its stop passed for one of the new process's.
    That gauge, plus that second, is the fallback when runtimeinfo does not answer."""
    data, err = api_data(fetch, f"{url}/api/v1/status/runtimeinfo")
    if err is None and isinstance(data, dict):
        birth = parse_time(str(data.get("startTime") or ""))
        if birth is not None:
            return birth
    start = gauges.get(START) if gauges is not None else None
    return None if start is None else start + 1.0


def _path_arg(path: str) -> str:
    """A path for the shell: a plain glob stays a glob, anything else is quoted."""
    return path if set(path) <= _GLOB_SAFE else shlex.quote(path)


def mtimes_command(paths: Sequence[str]) -> str:
    """``<mtime epoch>\\t<path>`` per existing file among ``paths`` (globs expanded); read-only."""
    args = " ".join(_path_arg(p) for p in paths)
    return f"find {args} -maxdepth 0 -type f -printf '%T@\\t%p\\n' 2>/dev/null; true"


def alertmanager_command(config_file: str, templates: Sequence[str]) -> str:
    cmd = f"echo @@md5; md5sum -- {shlex.quote(config_file)} 2>&1; echo @@files; "
    return cmd + (mtimes_command(templates) if templates else "true")


def parse_mtimes(text: str) -> list[tuple[float, str]]:
    out = []
    for line in text.splitlines():
        stamp, _, path = line.partition("\t")
        try:
            out.append((float(stamp), path))
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class AlertmanagerDisk:
    md5: str | None  # hex digest of the config file's content; None: unreadable
    error: str  # why md5 is None
    templates: list[tuple[float, str]] = field(default_factory=list)


def parse_alertmanager(text: str) -> AlertmanagerDisk:
    md5_part, _, files = text.partition("@@files")
    lines = [ln for ln in md5_part.replace("@@md5", "").strip().splitlines() if ln.strip()]
    first = lines[0].split() if lines else []
    if first and len(first[0]) == 32 and all(c in "0123456789abcdef" for c in first[0]):
        return AlertmanagerDisk(first[0], "", parse_mtimes(files))
    return AlertmanagerDisk(None, " ".join(lines) or "md5sum printed nothing", parse_mtimes(files))


def md5_metric_value(hexdigest: str) -> float:
    """``alertmanager_config_hash`` for content with this MD5 (coordinator.go
    ``md5HashAsMetricValue``: 6 bytes, little-endian, into a float64)."""
    return float(int.from_bytes(bytes.fromhex(hexdigest)[:6], "little"))


def md5_of(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


def _reload_state(
    comp: str, host: str, reload_ok: float | None, reload_ts: float | None
) -> Check | None:
    if reload_ok is None or reload_ts is None:
        return Check(comp, host, CHECK, FAILED, "no reload gauges on its /metrics")
    if reload_ok == 0:
        return Check(
            comp,
            host,
            CHECK,
            FAILED,
            f"the last reload failed: runs the config loaded {clock(reload_ts)}, older than "
            f"what is on disk (see journalctl -u {comp} on {host})",
        )
    return None


def prometheus_check(
    host: str,
    gauges: Mapping[str, float],
    loaded_files: set[str],
    disk: list[tuple[float, str]] | None,
    ssh_error: str | None,
    config_file: str,
) -> Check:
    """Replica ``host``: what its last successful reload loaded against its files on disk."""
    comp = "prometheus"
    bad = _reload_state(comp, host, gauges.get(PROM_RELOAD_OK), gauges.get(PROM_RELOAD_TS))
    if bad is not None:
        return bad
    loaded_at = gauges[PROM_RELOAD_TS]
    if disk is None:
        return Check(comp, host, CHECK, FAILED, f"cannot read its files over SSH: {ssh_error}")
    on_disk = {p for _, p in disk}
    if config_file not in on_disk:
        return Check(comp, host, CHECK, FAILED, f"{config_file} missing on disk")
    newer = sorted(p for m, p in disk if m > loaded_at)
    gone = sorted(loaded_files - on_disk)
    problems = []
    if newer:
        problems.append(
            f"{', '.join(newer)} changed on disk after the config it runs was loaded "
            f"({clock(loaded_at)})"
        )
    if gone:
        problems.append(f"evaluates {', '.join(gone)}, no longer on disk")
    if problems:
        return Check(comp, host, CHECK, FAILED, "reload owed: " + "; ".join(problems))
    rules = len(on_disk) - 1
    return Check(
        comp, host, CHECK, OK, f"prometheus.yml and {rules} rule file(s) loaded {clock(loaded_at)}"
    )


def alertmanager_check(
    host: str,
    gauges: Mapping[str, float],
    disk: AlertmanagerDisk | None,
    ssh_error: str | None,
    config_file: str,
) -> Check:
    comp = "alertmanager"
    bad = _reload_state(comp, host, gauges.get(AM_RELOAD_OK), gauges.get(AM_RELOAD_TS))
    if bad is not None:
        return bad
    loaded_at = gauges[AM_RELOAD_TS]
    if disk is None:
        return Check(comp, host, CHECK, FAILED, f"cannot read its files over SSH: {ssh_error}")
    if disk.md5 is None:
        return Check(comp, host, CHECK, FAILED, f"cannot read {config_file}: {disk.error}")
    problems = []
    if AM_HASH not in gauges:
        problems.append(f"no {AM_HASH} on its /metrics")
    elif md5_metric_value(disk.md5) != gauges[AM_HASH]:
        problems.append(
            f"{config_file} on disk differs from the config it runs (loaded {clock(loaded_at)})"
        )
    newer = sorted(p for m, p in disk.templates if m > loaded_at)
    if newer:
        problems.append(f"templates {', '.join(newer)} changed on disk after {clock(loaded_at)}")
    if problems:
        return Check(comp, host, CHECK, FAILED, "reload owed: " + "; ".join(problems))
    return Check(comp, host, CHECK, OK, f"{config_file} as on disk, loaded {clock(loaded_at)}")


# ---------------------------------------------------------------- the same rules on every replica


def rule_set(groups: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], Any]:
    """What a replica evaluates, by (rule file name, group name): comparable between replicas
    (evaluation state, health and timings left out)."""
    out: dict[tuple[str, str], Any] = {}
    for g in groups:
        rules = tuple(
            (
                r.get("type"),
                r.get("name"),
                r.get("query"),
                r.get("duration"),
                tuple(sorted((r.get("labels") or {}).items())),
                tuple(sorted((r.get("annotations") or {}).items())),
            )
            for r in g.get("rules") or []
        )
        out[(PurePosixPath(str(g.get("file", ""))).name, str(g.get("name")))] = (
            g.get("interval"),
            rules,
        )
    return out


def same_rules_check(sets: Mapping[str, dict[tuple[str, str], Any]]) -> Check:
    """Every replica that answered evaluates the rule groups of the first one, rule for rule."""
    comp, check = "prometheus", "replicas evaluate the same rules"
    hosts = list(sets)
    if len(hosts) < 2:
        return Check(comp, "*", check, OK, f"{len(hosts)} replica(s) answered: nothing to compare")
    ref_host = hosts[0]
    ref = sets[ref_host]
    problems = []
    for host in hosts[1:]:
        other = sets[host]
        only_ref = sorted(f"{f}:{g}" for f, g in ref.keys() - other.keys())
        only_other = sorted(f"{f}:{g}" for f, g in other.keys() - ref.keys())
        differ = []
        for key in sorted(ref.keys() & other.keys()):
            if ref[key] != other[key]:
                names = _differing_rules(ref[key], other[key])
                differ.append(f"{key[0]}:{key[1]} ({', '.join(names)})")
        parts = []
        if only_ref:
            parts.append(f"only {ref_host} has {', '.join(only_ref)}")
        if only_other:
            parts.append(f"only {host} has {', '.join(only_other)}")
        if differ:
            parts.append(f"differ: {'; '.join(differ)}")
        if parts:
            problems.append(f"{ref_host} and {host} evaluate different rules: {'; '.join(parts)}")
    if problems:
        return Check(comp, "*", check, FAILED, " | ".join(problems))
    n = sum(len(rules) for _, rules in ref.values())
    return Check(comp, "*", check, OK, f"{len(hosts)} replicas, {len(ref)} groups, {n} rules")


def _differing_rules(a: Any, b: Any) -> list[str]:
    if a[0] != b[0]:
        return [f"interval {a[0]} vs {b[0]}"]
    ra = {r[1]: r for r in a[1]}
    rb = {r[1]: r for r in b[1]}
    names = sorted(n for n in ra.keys() | rb.keys() if ra.get(n) != rb.get(n))
    return [str(n) for n in names] or ["rule order"]


def same_alertmanager_config_check(hashes: Mapping[str, float]) -> Check:
    """Clustered Alertmanagers deduplicate notifications only if they route alike."""
    comp, check = "alertmanager", "peers run the same config"
    groups: dict[float, list[str]] = {}
    for host, h in hashes.items():
        groups.setdefault(h, []).append(host)
    if len(groups) <= 1:
        return Check(comp, "*", check, OK, f"{len(hashes)} peer(s), one config")
    detail = " vs ".join("+".join(hosts) for hosts in groups.values())
    return Check(comp, "*", check, FAILED, f"different configs loaded: {detail}")
