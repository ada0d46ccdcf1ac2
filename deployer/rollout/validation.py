"""Validation of an upgraded host, before it goes back into service (checklist item 7 of the
reference README; nvidia-driver.md §6, dcgm.md §6):

- facts agree with the target plan (``compat.verify``): installed == loaded == nvidia-smi ==
  target, Fabric Manager at the driver's version, DCGM version and CUDA variant, exporter;
- nvidia-smi sees every GPU: ``gpu_count`` of them, every UUID the preflight saw;
- ``dcgmi health -c`` reports Overall Health ``Healthy`` and ``dcgmi diag -r LEVEL`` no failed
  test (level 0 skips the diag), judged by what they print (``deployer.dcgmi``): real dcgmi exits
  0 on an unhealthy GPU. The health watches are set first and checked only once they have a
  minute of samples (``hostops.HEALTH_SETTLE_S``: DCGM's rate checks compare the first and the
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

from typing import TYPE_CHECKING, Any

from deployer import compat, dcgmi
from deployer.facts import gather
from deployer.rollout import hostops, monitoring
from deployer.rollout.preflight import observed

if TYPE_CHECKING:
    from deployer.rollout.controller import Rollout


def _check(checks: list[dict[str, Any]], name: str, problem: str | None, detail: str = "") -> None:
    checks.append({"check": name, "ok": problem is None, "detail": problem or detail})


def validate(ctl: Rollout, host: str) -> tuple[list[str], list[dict[str, Any]]]:
    target = ctl.targets[host]
    want = ctl.record.target["version"]
    checks: list[dict[str, Any]] = []

    # DCGM's health watches before anything else: the check needs them a minute old.
    watch = ctl._run_on(host, hostops.health_watch_script(), timeout=120)
    watched_at = ctl.clock()
    if watch.rc != 0:
        output = (watch.stdout or watch.stderr or "").strip()[:300]
        name = dcgmi.exit_status_name(watch.rc)
        why = f"{hostops.HEALTH_WATCH} failed (exit {watch.rc}, {name}): {output}"
        _check(checks, "dcgmi health watches set", why)

    facts = gather(ctl._conn(host))
    mismatches = compat.verify(target.resolved, observed(facts))
    _check(
        checks,
        "versions as planned",
        "; ".join(m.message for m in mismatches) or None,
        f"driver {want}, DCGM {target.resolved.dcgm_version} "
        f"({', '.join(target.resolved.dcgm_packages)}), exporter {target.resolved.exporter_tag}",
    )

    exporter = _exporter(ctl, host, want, hostops.driver_label(target.resolved.exporter_tag))
    replicas = _prometheus(ctl, host, want) if ctl.tier.replicas else None
    if watch.rc == 0:
        _settle(ctl, host, watched_at)
    probe = hostops.parse_probe(
        ctl._run_on(host, hostops.probe_script(ctl.settings.diag_level), timeout=900).stdout
    )
    # the GPUs seen before the run (kept in the state file, so a resumed run checks the same ones)
    before = ctl.record.hosts[host].before
    expected_uuids = set(before.get("gpu_uuids") or [g.uuid for g in target.facts.gpus])
    checks.extend(
        judge_probe(
            probe,
            want=want,
            gpu_count=target.gpu_count,
            expected_uuids=expected_uuids,
            diag_level=ctl.settings.diag_level,
        )
    )

    _check(checks, "exporter serves the new driver label", exporter, want)
    if ctl.tier.replicas:
        _check(
            checks,
            "Prometheus replicas see the host",
            replicas,
            ", ".join(h for h, _ in ctl.tier.replicas),
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


def _settle(ctl: Rollout, host: str, watched_at: float) -> None:
    """Wait until the health watches set at ``watched_at`` have a minute of samples (bounded:
    ``hostops.HEALTH_SETTLE_S`` at most; an interruption ends it, like every wait of the run)."""
    left = watched_at + hostops.HEALTH_SETTLE_S - ctl.clock()
    if left > 0:
        ctl.view.detail(host, f"waiting {left:.0f}s: DCGM's health checks need a minute of samples")
        ctl._wait(left)


def _exporter(ctl: Rollout, host: str, want: str, label: str) -> str | None:
    v = ctl.targets[host].variables
    url = str(v.get("dcgm_exporter_verify_url") or "http://127.0.0.1:9400/metrics")
    basic = bool(v.get("dcgm_exporter_basic_auth_users"))
    stdin = None
    if basic:
        user, password = (
            v.get("dcgm_exporter_scrape_user", ""),
            v.get("dcgm_exporter_scrape_password", ""),
        )
        stdin = f'user = "{user}:{password}"\n'.encode()
    deadline = ctl.clock() + ctl.settings.exporter_timeout_s
    last = "not scraped"
    while True:
        conn = ctl._conn(host)
        result = conn.run(hostops.scrape_script(url, basic), stdin=stdin, timeout=30)
        if result.rc == 0:
            drivers, uuids = hostops.exporter_driver_labels(result.stdout, label)
            if drivers == {want} and len(uuids) >= ctl.targets[host].gpu_count:
                return None
            last = f"{label} {', '.join(sorted(drivers)) or 'absent'} on {len(uuids)} GPUs"
        else:
            last = f"scraping {url} failed: {(result.stderr or result.stdout).strip()[-200:]}"
        if ctl.clock() >= deadline:
            return last
        ctl._wait(3.0)


def _prometheus(ctl: Rollout, host: str, want: str) -> str | None:
    deadline = ctl.clock() + ctl.settings.prometheus_timeout_s
    gpus = ctl.targets[host].gpu_count
    while True:
        problems = []
        for name, base in ctl.tier.replicas:
            why = monitoring.replica_sees(
                ctl.http_fetch, base, host, ctl.tier.gpu_metric, want, gpus
            )
            if why is not None:
                problems.append(f"{name}: {why}")
        if not problems:
            return None
        if ctl.clock() >= deadline:
            return "; ".join(problems)
        ctl.view.detail(host, "waiting for Prometheus: " + problems[0])
        ctl._wait(5.0)
