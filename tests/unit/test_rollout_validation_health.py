"""Upgrade validation asks DCGM's health watch only once the watches have a minute of samples.

Right after ``dcgmi health -s`` DCGM holds one sample per watched field, and every rate check of
``dcgmi health -c`` (PCIe replays, thermal and power violation time, NVLink errors) compares the
first and the last sample of the past minute: it reports Healthy without having looked
(NVIDIA/DCGM v4.6.0 ``modules/health/DcgmHealthWatch.cpp``, cited in ``deployer/rollout/hostops.py``).
So validation sets the watches first, runs its other checks meanwhile, waits out what is left of
the minute (bounded) and then checks. Driven here with a fake host and a fake clock.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from deployer import compat
from deployer.connection import CommandResult
from deployer.rollout import hostops, validation

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


class FakeRollout:
    """What ``validate`` reads of the controller: a host that answers and a clock only waits move."""

    def __init__(self, *, watch_rc: int = 0, watch_out: str = "Health monitor systems set") -> None:
        self.t = 1000.0
        self.ran: list[tuple[float, str]] = []
        self.waited: list[float] = []
        self.watch = (watch_rc, watch_out)
        self.targets = {
            "g1": SimpleNamespace(
                resolved=SimpleNamespace(
                    dcgm_version="4.5.3",
                    dcgm_packages=("datacenter-gpu-manager-4-cuda13",),
                    exporter_tag="4.5.3-4.8.2",
                ),
                gpu_count=2,
                facts=SimpleNamespace(gpus=[]),
                variables={},
            )
        }
        self.record = SimpleNamespace(
            target={"version": "595.45.04"},
            hosts={"g1": SimpleNamespace(before={"gpu_uuids": ["GPU-aaa", "GPU-bbb"]})},
        )
        self.settings = SimpleNamespace(diag_level=0)
        self.tier = SimpleNamespace(replicas=[])
        self.view = SimpleNamespace(detail=lambda host, text: None)

    def clock(self) -> float:
        return self.t

    def _wait(self, seconds: float) -> None:
        self.waited.append(seconds)
        self.t += seconds

    def _conn(self, host: str) -> object:
        return object()

    def _run_on(self, host: str, command: str, *, timeout: float | None = None) -> CommandResult:
        self.ran.append((self.t, command))
        if command == hostops.health_watch_script():
            rc, out = self.watch
            return CommandResult(command, rc, out, "")
        return CommandResult(command, 0, PROBE_OK, "")


@pytest.fixture
def quiet_host(monkeypatch):
    """Facts and versions as planned; the exporter check takes ``exporter_s`` of the clock."""
    monkeypatch.setattr(validation, "gather", lambda conn: None)
    monkeypatch.setattr(validation, "observed", lambda facts: None)
    monkeypatch.setattr(compat, "verify", lambda resolved, seen: [])
    took = {"exporter_s": 0.0}

    def exporter(ctl, host, want, label):
        ctl.t += took["exporter_s"]
        return None

    monkeypatch.setattr(validation, "_exporter", exporter)
    return took


def test_the_watches_are_set_first_and_checked_a_minute_later(quiet_host):
    ctl = FakeRollout()
    problems, _ = validation.validate(ctl, "g1")
    assert problems == []
    (set_at, first), *_ = ctl.ran
    assert first == hostops.health_watch_script()
    checked_at = next(t for t, c in ctl.ran if "dcgmi health -c" in c)
    assert checked_at - set_at >= hostops.HEALTH_SETTLE_S == 60


def test_the_probe_checks_health_without_setting_the_watches_again():
    script = hostops.probe_script(2)
    assert "dcgmi health -c" in script and "health -s" not in script
    assert script.index("dcgmi health -c") < script.index("dcgmi diag -r 2")


def test_the_other_checks_count_toward_the_minute(quiet_host):
    quiet_host["exporter_s"] = 45.0
    ctl = FakeRollout()
    validation.validate(ctl, "g1")
    assert ctl.waited == [15.0]


def test_no_wait_when_the_other_checks_took_the_minute(quiet_host):
    quiet_host["exporter_s"] = 75.0
    ctl = FakeRollout()
    validation.validate(ctl, "g1")
    assert ctl.waited == []


def test_watches_that_cannot_be_set_fail_validation_naming_dcgm_and_nothing_waits(quiet_host):
    ctl = FakeRollout(watch_rc=235, watch_out="Error: unable to establish a connection")
    problems, checks = validation.validate(ctl, "g1")
    failed = {c["check"]: c["detail"] for c in checks if not c["ok"]}
    assert "dcgmi health watches set" in failed
    assert "exit 235, DCGM_ST_CONNECTION_NOT_VALID" in failed["dcgmi health watches set"]
    assert "unable to establish a connection" in failed["dcgmi health watches set"]
    assert ctl.waited == []
    assert any(p.startswith("dcgmi health watches set:") for p in problems)
