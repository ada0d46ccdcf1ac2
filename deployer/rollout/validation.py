"""Validation of an upgraded host, before it goes back into service (checklist item 7 of the
reference README; nvidia-driver.md §6, dcgm.md §6):

- facts agree with the target plan (``verify.verify``): installed == loaded == nvidia-smi ==
  target, Fabric Manager at the driver's version, DCGM version and CUDA variant, exporter;
- nvidia-smi sees every GPU: ``gpu_count`` of them, every UUID the preflight saw;
- ``dcgmi health -c`` reports Overall Health ``Healthy`` and ``dcgmi diag -r LEVEL`` no failed
  test (level 0 skips the diag), judged by what they print (``deployer.gpu.dcgmi``): real dcgmi
  exits 0 on an unhealthy GPU. The health watches are set first and checked only once they have
  a minute of samples (``hostops.HEALTH_SETTLE_S``: DCGM's rate checks compare the first and the
  last sample of the past minute, so a check right after ``-s`` is Healthy without having
  looked); the checks below run meanwhile, and the diag runs after the health check;
- the exporter serves metrics of every GPU with the driver-version label (field
  ``driver_version`` of ``deployer.dcgm_fields``) = target (bounded wait: it samples on its own
  interval);
- every Prometheus replica scrapes the host (``up == 1``) and has its GPUs' series with the new
  driver label (bounded wait: a scrape interval or two), when the inventory has Prometheus.

Returns the problems (empty: valid) and the list of checks for the report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deployer.errors import FactsUnread
from deployer.facts import gather
from deployer.gpu import dcgmi, verify
from deployer.hostaccess import HostAccess
from deployer.monitoring import tier as monitoring_tier
from deployer.monitoring.http import Fetch
from deployer.rollout import hostops
from deployer.rollout.host_targets import HostTarget, observed
from deployer.rollout.options import Timeouts


def _check(checks: list[dict[str, Any]], name: str, problem: str | None, detail: str = "") -> None:
    checks.append({"check": name, "ok": problem is None, "detail": problem or detail})


def validate(
    host: HostAccess,
    target: HostTarget,
    *,
    want: str,
    expected_uuids: set[str],
    diag_level: int,
    tier: monitoring_tier.MonitoringTier,
    fetch: Fetch,
    timeouts: Timeouts,
    detail: Callable[[str], None],
) -> tuple[list[str], list[dict[str, Any]]]:
    """Validate ``host`` (upgraded to ``want``): the problems (empty: valid) and every check.
    ``expected_uuids`` are the GPUs seen before the run; ``detail`` shows progress."""
    checks: list[dict[str, Any]] = []

    # DCGM's health watches before anything else: the check needs them a minute old.
    watch = host.run(hostops.health_watch_script(), timeout=120)
    watched_at = host.clock()
    if watch.rc != 0:
        output = (watch.stdout or watch.stderr or "").strip()[:300]
        name = dcgmi.exit_status_name(watch.rc)
        why = f"{hostops.HEALTH_WATCH} failed (exit {watch.rc}, {name}): {output}"
        _check(checks, "dcgmi health watches set", why)

    try:
        facts = gather(host.connection())
        versions = "; ".join(m.message for m in verify.verify(target.resolved, observed(facts)))
    except FactsUnread as exc:  # a failed check, not a rollout stopped by an exception
        versions = f"its facts could not be read: {exc}"
    _check(
        checks,
        "versions as planned",
        versions or None,
        f"driver {want}, DCGM {target.resolved.dcgm_version} "
        f"({', '.join(target.resolved.dcgm_packages)}), exporter {target.resolved.exporter_tag}",
    )

    label = hostops.driver_label(target.resolved.exporter_tag)
    exporter = _exporter(host, target, want, label, timeouts.exporter_s)
    replicas = (
        _prometheus(host, target, want, tier, fetch, timeouts.prometheus_s, detail)
        if tier.replicas
        else None
    )
    if watch.rc == 0:
        _settle(host, watched_at, detail)
    probe = hostops.parse_probe(host.run(hostops.probe_script(diag_level), timeout=900).stdout)
    checks.extend(
        judge_probe(
            probe,
            want=want,
            gpu_count=target.gpu_count,
            expected_uuids=expected_uuids,
            diag_level=diag_level,
        )
    )

    _check(checks, "exporter serves the new driver label", exporter, want)
    if tier.replicas:
        _check(
            checks,
            "Prometheus replicas see the host",
            replicas,
            ", ".join(h for h, _ in tier.replicas_of(host.host)),
        )
    problems = [f"{c['check']}: {c['detail']}" for c in checks if not c["ok"]]
    return problems, checks


def judge_probe(
    probe: hostops.ValidationProbe,
    *,
    want: str,
    gpu_count: int,
    expected_uuids: set[str],
    diag_level: int,
) -> list[dict[str, Any]]:
    """The checks of what the host itself says after the upgrade (pure: the probe's parsed
    output in, the checks out; tests/contract/test_validation.py feeds it real output)."""
    checks: list[dict[str, Any]] = []
    _check(
        checks,
        "loaded driver",
        None if probe.loaded == want else f"loaded kernel module {probe.loaded or 'none'}",
        want,
    )
    smi_problem = None
    if probe.smi_rc != 0:
        smi_problem = f"nvidia-smi fails: {probe.smi_error[:200]}"
    elif set(probe.smi_versions) != {want}:
        smi_problem = f"nvidia-smi reports {', '.join(sorted(set(probe.smi_versions)))}"
    elif len(probe.smi_uuids) != gpu_count:
        smi_problem = f"nvidia-smi sees {len(probe.smi_uuids)} GPUs, expected {gpu_count}"
    elif not expected_uuids <= set(probe.smi_uuids):
        smi_problem = "GPUs missing: " + ", ".join(sorted(expected_uuids - set(probe.smi_uuids)))
    _check(checks, "nvidia-smi sees every GPU", smi_problem, f"{gpu_count} GPUs at {want}")
    health = dcgmi.health_verdict(probe.health_output, probe.health_rc)
    _check(checks, "dcgmi health", None if health.ok else _short(health), health.summary)
    if probe.diag_rc is not None:
        diag = dcgmi.diag_verdict(probe.diag_output, probe.diag_rc)
        _check(
            checks, f"dcgmi diag -r {diag_level}", None if diag.ok else _short(diag), diag.summary
        )
    return checks


def _short(verdict: dcgmi.Verdict, limit: int = 600) -> str:
    text = str(verdict)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _settle(host: HostAccess, watched_at: float, detail: Callable[[str], None]) -> None:
    """Wait until the health watches set at ``watched_at`` have a minute of samples (bounded:
    ``hostops.HEALTH_SETTLE_S`` at most; an interruption ends it, like every wait of the run)."""
    left = watched_at + hostops.HEALTH_SETTLE_S - host.clock()
    if left > 0:
        detail(f"waiting {left:.0f}s: DCGM's health checks need a minute of samples")
        host.wait(left)


def _exporter(
    host: HostAccess, target: HostTarget, want: str, label: str, timeout_s: int
) -> str | None:
    v = target.variables
    url = str(v.get("dcgm_exporter_verify_url") or "http://127.0.0.1:9400/metrics")
    basic = bool(v.get("dcgm_exporter_basic_auth_users"))
    stdin = None
    if basic:
        user, password = (
            v.get("dcgm_exporter_scrape_user", ""),
            v.get("dcgm_exporter_scrape_password", ""),
        )
        stdin = f'user = "{user}:{password}"\n'.encode()
    deadline = host.clock() + timeout_s
    last = "not scraped"
    while True:
        result = host.connection().run(hostops.scrape_script(url, basic), stdin=stdin, timeout=30)
        if result.rc == 0:
            drivers, uuids = hostops.exporter_driver_labels(result.stdout, label)
            if drivers == {want} and len(uuids) >= target.gpu_count:
                return None
            last = f"{label} {', '.join(sorted(drivers)) or 'absent'} on {len(uuids)} GPUs"
        else:
            last = f"scraping {url} failed: {(result.stderr or result.stdout).strip()[-200:]}"
        if host.clock() >= deadline:
            return last
        host.wait(3.0)


def _prometheus(
    host: HostAccess,
    target: HostTarget,
    want: str,
    tier: monitoring_tier.MonitoringTier,
    fetch: Fetch,
    timeout_s: int,
    detail: Callable[[str], None],
) -> str | None:
    deadline = host.clock() + timeout_s
    while True:
        problems = []
        for name, base in tier.replicas_of(host.host):
            why = monitoring_tier.replica_sees(
                fetch, base, host.host, tier.gpu_metric, want, target.gpu_count
            )
            if why is not None:
                problems.append(f"{name}: {why}")
        if not problems:
            return None
        if host.clock() >= deadline:
            return "; ".join(problems)
        detail("waiting for Prometheus: " + problems[0])
        host.wait(5.0)
