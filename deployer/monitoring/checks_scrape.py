"""Is every expected target scraped by a replica? Judged from the replica's own targets API.

``GET /api/v1/targets?state=active`` answers, per target, ``labels`` (``job``, ``instance``, the
file_sd labels), ``health`` (``up``, ``down`` or ``unknown``: never scraped since the replica
started or the target appeared), ``lastScrape`` (RFC 3339; Go's zero time when never scraped),
``lastError`` and ``scrapeInterval`` (prometheus/prometheus v2.42.0 = 225c611,
``web/api/v1/api.go:818-835`` and ``:927-990``; ``scrape/target.go:42-44``).
It is the replica's present view of each target, unlike an ``up`` query, which reads samples of
up to five minutes ago: a replica stopped does not write staleness markers (the scrape loops end
on the parent context, ``scrape/scrape.go:1218-1279``), so after a restart the replayed WAL
answers ``up`` with the samples from before the stop, and after a stop longer than the lookback
(or on an empty TSDB) with nothing at all ("not scraped").

What cannot have been scraped yet is *pending*, not failed:
- a target the replica has not scraped since it started (``health: unknown``);
- an expected target not yet among the replica's targets while the replica is younger than the
  discovery grace (file_sd is read at start, then handed to the scrape loops within seconds);
- a target that is itself a daemon of the stack (a Prometheus, an Alertmanager or the long-term
  store) that answers now and restarted after this replica's last attempt failed, or so shortly
  before it (``DAEMON_STARTUP_S``) that it was still starting: its "down" dates from before it
  listened;
- a target down on a host a driver rollout a controller drives has out of service now
  (``maintenance``: deployer/monitoring/rollouts.py ``out_of_service_now``).
Everything else that is not "up" fails, with the replica's own last error.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deployer.monitoring.check import FAILED, OK, PENDING, Check, clock, parse_time, worst
from deployer.monitoring.file_sd import Target

DEFAULT_INTERVAL_S = 15.0
MIN_DISCOVERY_GRACE_S = 60.0
# A daemon of the stack that answers now may have refused scrapes for a while after its process
# started (the Go runtime, flags, then the listener: seconds on a loaded host).
DAEMON_STARTUP_S = 30.0
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_HEALTH_RANK = {"up": 0, "unknown": 1, "down": 2}


def duration_s(text: str) -> float | None:
    """A Prometheus duration (``15s``, ``1m30s``) in seconds; None if it is not one."""
    parts = _DURATION.findall(text or "")
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(int(n) * _UNIT_S[u] for n, u in parts)


@dataclass(frozen=True)
class ActiveTarget:
    job: str
    instance: str
    health: str  # up | down | unknown
    last_scrape: float | None  # epoch seconds; None: never scraped
    last_error: str
    interval_s: float


def active_targets(data: Mapping[str, Any]) -> list[ActiveTarget]:
    """The ``data`` of ``/api/v1/targets?state=active`` as ``ActiveTarget`` rows."""
    out = []
    for t in data.get("activeTargets") or []:
        labels = t.get("labels") or {}
        out.append(
            ActiveTarget(
                job=str(labels.get("job", "")),
                instance=str(labels.get("instance", "")),
                health=str(t.get("health", "unknown")),
                last_scrape=parse_time(str(t.get("lastScrape", ""))),
                last_error=str(t.get("lastError") or ""),
                interval_s=duration_s(str(t.get("scrapeInterval", ""))) or DEFAULT_INTERVAL_S,
            )
        )
    return out


def discovery_grace_s(seen: Iterable[ActiveTarget]) -> float:
    return max([MIN_DISCOVERY_GRACE_S, *(2 * t.interval_s for t in seen)])


@dataclass(frozen=True)
class Verdict:
    state: str
    text: str


def judge(
    target: Target,
    seen: Sequence[ActiveTarget],
    *,
    replica_start: float | None,
    daemon_starts: Mapping[str, float],
    now: float,
    grace_s: float,
    maintenance: Mapping[str, str] | None = None,
) -> Verdict:
    """One expected target as one replica sees it (``seen``: that replica's active targets with
    the same job and instance; more than one when two inventory hosts share an address)."""
    name = f"{target.node} ({target.instance})"
    if not seen:
        if replica_start is not None and now - replica_start < grace_s:
            return Verdict(
                PENDING, f"{name} not discovered yet (replica started {clock(replica_start)})"
            )
        return Verdict(FAILED, f"{name} not among the replica's targets (file_sd)")
    t = min(seen, key=lambda s: _HEALTH_RANK.get(s.health, 2))
    if t.health == "up":
        return Verdict(OK, "")
    if t.health == "unknown":
        since = f" since the replica started {clock(replica_start)}" if replica_start else ""
        return Verdict(PENDING, f"{name} not scraped yet{since}")
    started = daemon_starts.get(target.instance)
    if started is not None and (
        t.last_scrape is None or t.last_scrape < started + DAEMON_STARTUP_S
    ):
        return Verdict(
            PENDING,
            f"{name} restarted {clock(started)}, not scraped since it came up ({t.last_error})",
        )
    why = (maintenance or {}).get(target.node)
    if why is not None:
        return Verdict(PENDING, f"{name} down, {why}: {t.last_error or 'no error given'}")
    return Verdict(FAILED, f"{name} down: {t.last_error or 'no error given'}")


def scrape_checks(
    host: str,
    expected: Sequence[Target],
    seen: Sequence[ActiveTarget],
    *,
    replica_start: float | None,
    daemon_starts: Mapping[str, float],
    now: float,
    maintenance: Mapping[str, str] | None = None,
) -> tuple[list[Check], dict[tuple[str, str], str]]:
    """One row per job for replica ``host``, and every expected target's state by (job, node);
    ``maintenance``: node -> why it is out of service (its down targets pending)."""
    by_key: dict[tuple[str, str], list[ActiveTarget]] = {}
    for t in seen:
        by_key.setdefault((t.job, t.instance), []).append(t)
    grace = discovery_grace_s(seen)
    by_job: dict[str, list[Verdict]] = {}
    states: dict[tuple[str, str], str] = {}
    for target in expected:
        v = judge(
            target,
            by_key.get((target.job, target.instance), []),
            replica_start=replica_start,
            daemon_starts=daemon_starts,
            now=now,
            grace_s=grace,
            maintenance=maintenance,
        )
        by_job.setdefault(target.job, []).append(v)
        states[(target.job, target.node)] = v.state
    checks = []
    for job, verdicts in by_job.items():
        up = sum(1 for v in verdicts if v.state == OK)
        problems = [v.text for v in verdicts if v.state == FAILED] + [
            v.text for v in verdicts if v.state == PENDING
        ]
        state = worst([v.state for v in verdicts])
        detail = "; ".join(problems) if problems else f"{up}/{len(verdicts)} up"
        if problems and up:
            detail += f" ({up}/{len(verdicts)} up)"
        checks.append(Check("prometheus", host, f"scraping job {job}", state, detail))
    return checks, states
