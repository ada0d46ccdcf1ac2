"""``upgrade-driver`` as a command over a scripted fleet: ``--check`` exits as the run would."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from deployer.cli import cli
from tests.unit.gpufleet import FakeFleet, gpu_facts, write_inventory


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    monkeypatch.setenv("GPUMON_ROLLOUT_STATE_DIR", str(runs))
    return runs


def upgrade(inv, *args):
    return CliRunner().invoke(cli, ["upgrade-driver", "-i", str(inv), *args])


def test_check_exits_1_when_its_only_host_cannot_be_read(tmp_path, monkeypatch, state_dir):
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}})
    FakeFleet(refused={"g1"}).install(monkeypatch)
    result = upgrade(inv, "--to", "580", "--check")
    assert result.exit_code == 1, result.output
    assert "UNREACHABLE g1" in result.output and "host key changed" in result.output
    assert not state_dir.exists() or list(state_dir.iterdir()) == []


def test_check_exits_1_when_one_of_several_hosts_cannot_be_read(tmp_path, monkeypatch, state_dir):
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}, "g2": {"gpu_model": "H100"}})
    FakeFleet(facts={"g1": gpu_facts("g1")}, refused={"g2"}).install(monkeypatch)
    result = upgrade(inv, "--to", "580", "--check", "--output", "json")
    assert result.exit_code == 1, result.output
    assert "UNREACHABLE g2" in result.output


def test_check_exits_2_when_its_only_host_is_refused_by_the_matrix(
    tmp_path, monkeypatch, state_dir
):
    inv = write_inventory(tmp_path, {"g4": {"gpu_model": "V100"}})
    FakeFleet(facts={"g4": gpu_facts("g4", model="V100")}).install(monkeypatch)
    result = upgrade(inv, "--to", "595", "--check")
    assert result.exit_code == 2, result.output
    assert "REFUSED g4" in result.output and "arch-last-branch" in result.output


def test_check_of_a_readable_fleet_exits_0_with_the_plan(tmp_path, monkeypatch, state_dir):
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}})
    FakeFleet(facts={"g1": gpu_facts("g1")}).install(monkeypatch)
    result = upgrade(inv, "--to", "580", "--check", "--output", "json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output[result.output.index("{") :])
    assert plan["batches"] == [["g1"]]
    assert not state_dir.exists() or list(state_dir.iterdir()) == []


def test_the_run_keeps_what_the_inventory_says_beside_the_target(tmp_path, monkeypatch):
    from deployer.rollout.preflight import run_preflight

    inv = write_inventory(
        tmp_path, {"g1": {"gpu_model": "H100", "nvidia_driver_version": "580.65.06"}}
    )
    FakeFleet(facts={"g1": gpu_facts("g1")}).install(monkeypatch)
    pre = run_preflight(inv, None, [], "580")
    try:
        g1 = pre.hosts["g1"]
        assert g1.inventory_driver == {"version": "580.65.06", "branch": None}
        assert g1.after["driver_version"] == "580.126.20"
    finally:
        pre.session.pool.close_all()
