"""``gpumon-deploy targets``: the Prometheus play's hosts that ``--limit`` selects, by set
intersection (any limit pattern Ansible takes), over a scripted fleet."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from deployer.cli import cli
from deployer.facts import HostFacts
from tests.unit.gpufleet import FakeFleet

HOSTS = ("prom01", "prom02", "prom03")


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    inv = tmp_path / "inventory.yml"
    inv.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "prometheus": {"hosts": {h: {"ansible_host": "192.0.2.1"} for h in HOSTS}},
                        "gpu": {"hosts": {"gpu01": {"ansible_host": "192.0.2.2",
                                                    "gpu_model": "H100", "gpu_count": 8}}},
                    }
                }
            }
        )
    )  # fmt: skip
    facts = {
        h: HostFacts(host=h, os_id="debian", os_family="debian", os_version="12", arch="x86_64")
        for h in (*HOSTS, "gpu01")
    }
    return inv, FakeFleet(facts=facts).install(monkeypatch)


# The Prometheus play is serial: a scripted replica fails its first task, so the play stops
# there; the first replica selected is the one contacted.


def test_a_limit_of_two_replicas_pushes_to_those_two_only(fleet):
    inv, f = fleet
    result = CliRunner().invoke(cli, ["targets", "-i", str(inv), "--limit", "prom02,prom03"])
    assert result.exit_code != 2, result.output
    assert "matches no host" not in result.output
    assert f.commands("prom02")
    assert f.commands("prom01") == [] and f.commands("gpu01") == []


def test_a_limit_with_no_replica_is_refused_naming_the_limit_and_touches_nothing(fleet):
    inv, f = fleet
    result = CliRunner().invoke(cli, ["targets", "-i", str(inv), "--limit", "gpu01"])
    assert result.exit_code == 2, result.output
    assert "--limit" in result.output and "Prometheus" in result.output
    assert all(f.commands(h) == [] for h in (*HOSTS, "gpu01"))


def test_a_limit_of_a_group_selects_its_replicas(fleet):
    inv, f = fleet
    result = CliRunner().invoke(cli, ["targets", "-i", str(inv), "--limit", "all:!prom01"])
    assert result.exit_code != 2, result.output
    assert f.commands("prom02") and f.commands("prom01") == [] and f.commands("gpu01") == []
