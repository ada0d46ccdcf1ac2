"""Upgrade validation asks DCGM's health watch only once the watches have a minute of samples.

Right after ``dcgmi health -s`` DCGM holds one sample per watched field, and every rate check of
``dcgmi health -c`` (PCIe replays, thermal and power violation time, NVLink errors) compares the
first and the last sample of the past minute: it reports Healthy without having looked
(NVIDIA/DCGM v4.6.0 ``modules/health/DcgmHealthWatch.cpp``, cited in ``deployer/rollout/hostops.py``).
So validation sets the watches first, runs its other checks meanwhile, waits out what is left of
the minute (bounded) and then checks. Driven here with a fake host and its fake clock.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from deployer.connection import CommandResult
from deployer.gpu import verify
from deployer.monitoring import tier as monitoring_tier
from deployer.rollout import hostops, validation
from deployer.rollout.options import Timeouts

PROBE_OK = """\
@@loaded
595.45.04
@@smi
595.45.04, GPU-aaa
595.45.04, GPU-bbb
@@smi_rc=0
@@health
Health Monitor Report
+---------------------------+----------------------------------------------------------+
| Overall Health            | Healthy                                                  |
+===========================+==========================================================+
@@health_rc=0
@@diag
@@diag_rc=skipped
"""


class FakeHost:
    """What ``validate`` reads of the host (``HostAccess``): it answers, and its clock moves only
    with waits and with what a check takes."""

    def __init__(self, *, watch_rc: int = 0, watch_out: str = "Health monitor systems set") -> None:
        self.host = "g1"
        self.t = 1000.0
        self.ran: list[tuple[float, str]] = []
        self.waited: list[float] = []
        self.watch = (watch_rc, watch_out)

    def clock(self) -> float:
        return self.t

    def wait(self, seconds: float) -> None:
        self.waited.append(seconds)
        self.t += seconds

    def connection(self) -> object:
        return object()

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        self.ran.append((self.t, command))
        if command == hostops.health_watch_script():
            rc, out = self.watch
            return CommandResult(command, rc, out, "")
        return CommandResult(command, 0, PROBE_OK, "")


TARGET = SimpleNamespace(
    resolved=SimpleNamespace(
        dcgm_version="4.5.3",
        dcgm_packages=("datacenter-gpu-manager-4-cuda13",),
        exporter_tag="4.5.3-4.8.2",
    ),
    gpu_count=2,
    variables={},
)


def validate(host: FakeHost) -> tuple[list[str], list[dict]]:
    return validation.validate(
        host,  # type: ignore[arg-type]
        TARGET,  # type: ignore[arg-type]
        want="595.45.04",
        expected_uuids={"GPU-aaa", "GPU-bbb"},
        diag_level=0,
        tier=monitoring_tier.MonitoringTier(),
        fetch=lambda url: None,  # type: ignore[arg-type,return-value]
        timeouts=Timeouts(),
        detail=lambda text: None,
    )


@pytest.fixture
def quiet_host(monkeypatch):
    """Facts and versions as planned; the exporter check takes ``exporter_s`` of the clock."""
    monkeypatch.setattr(validation, "gather", lambda conn: None)
    monkeypatch.setattr(validation, "observed", lambda facts: None)
    monkeypatch.setattr(verify, "verify", lambda resolved, seen: [])
    took = {"exporter_s": 0.0}

    def exporter(host, target, want, label, timeout_s):
        host.t += took["exporter_s"]
        return None

    monkeypatch.setattr(validation, "_exporter", exporter)
    return took


def test_the_watches_are_set_first_and_checked_a_minute_later(quiet_host):
    host = FakeHost()
    problems, _ = validate(host)
    assert problems == []
    (set_at, first), *_ = host.ran
    assert first == hostops.health_watch_script()
    checked_at = next(t for t, c in host.ran if "dcgmi health -c" in c)
    assert checked_at - set_at >= hostops.HEALTH_SETTLE_S == 60


def test_the_probe_checks_health_without_setting_the_watches_again():
    script = hostops.probe_script(2)
    assert "dcgmi health -c" in script and "health -s" not in script
    assert script.index("dcgmi health -c") < script.index("dcgmi diag -r 2")


def test_the_other_checks_count_toward_the_minute(quiet_host):
    quiet_host["exporter_s"] = 45.0
    host = FakeHost()
    validate(host)
    assert host.waited == [15.0]


def test_no_wait_when_the_other_checks_took_the_minute(quiet_host):
    quiet_host["exporter_s"] = 75.0
    host = FakeHost()
    validate(host)
    assert host.waited == []


def test_watches_that_cannot_be_set_fail_validation_naming_dcgm_and_nothing_waits(quiet_host):
    host = FakeHost(watch_rc=235, watch_out="Error: unable to establish a connection")
    problems, checks = validate(host)
    failed = {c["check"]: c["detail"] for c in checks if not c["ok"]}
    assert "dcgmi health watches set" in failed
    assert "exit 235, DCGM_ST_CONNECTION_NOT_VALID" in failed["dcgmi health watches set"]
    assert "unable to establish a connection" in failed["dcgmi health watches set"]
    assert host.waited == []
    assert any(p.startswith("dcgmi health watches set:") for p in problems)
