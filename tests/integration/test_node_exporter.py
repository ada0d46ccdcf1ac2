"""The node_exporter role on every lab host: archive install from the mirror, hardened unit, scrape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

CLI = [sys.executable, "-m", "deployer.cli"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("site") / "site.yml"
    path.write_text("- hosts: all\n  roles: [node_exporter]\n")
    return path


def up(lab, site: Path, *args: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [*CLI, "up", "-i", str(lab.inventory_path), "--site", str(site), "--output", "json", *args],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def converged(lab, site):
    rc, report = up(lab, site)
    assert rc == 0, json.dumps(report, indent=1)[:4000]
    return report


def test_second_run_reports_zero_changes(lab, site, converged):
    rc, report = up(lab, site)
    assert rc == 0
    assert report["totals"]["changed"] == 0, json.dumps(report["hosts"], indent=1)[:3000]


def test_runs_as_its_own_unprivileged_user_with_a_hardened_unit(lab, converged):
    out = lab.ssh(
        "prom01",
        "systemctl show -p User,NoNewPrivileges,ProtectSystem,ActiveState node_exporter.service",
    ).stdout
    assert "User=node-exporter" in out
    assert "NoNewPrivileges=yes" in out and "ProtectSystem=strict" in out
    assert "ActiveState=active" in out


def test_gpu_hosts_export_their_expected_gpu_count(lab, converged):
    for host in lab.hosts:
        metrics = lab.ssh(host.name, "curl -fsS http://127.0.0.1:9100/metrics").stdout
        assert "node_exporter_build_info" in metrics
        if host.is_gpu:  # the topology's count (2 on gpu05/gpu06, 4 on gpu03, 8 on the others)
            assert f"gpumon_expected_gpus {host.gpu_count}" in metrics, host.name


def test_the_archive_was_verified_and_unpacked_from_the_mirror(lab, converged):
    out = lab.ssh(
        "gpu01",
        "readlink -f /usr/local/bin/node_exporter; cat /opt/node_exporter/*/.gpumon-archive",
    )
    assert "/opt/node_exporter/1.5.0/node_exporter" in out.stdout
    assert "sha256" in out.stdout
