"""One DeploySession per command: one variable rule for every scope, the per-host context passed
as an argument (never left on the planner between hosts)."""

from __future__ import annotations

from deployer.facts import HostFacts
from deployer.session import DeploySession, RunOptions
from tests.unit.gpufleet import write_inventory


def test_a_gpu_hosts_plan_variables_are_the_gpu_roles_scope_not_every_roles(tmp_path):
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}})
    session = DeploySession.load(RunOptions(inventory=inv))
    variables = session.host_variables("g1")
    assert variables["nvidia_driver_reboot"] == "never"  # nvidia_driver's default
    assert "dcgm_exporter_field_groups" in variables  # dcgm_exporter's: gpu_plan reads it
    assert "prometheus_port" not in variables  # another play's role: not in this scope
    assert "node_exporter_version" not in variables


def test_a_plays_tasks_and_the_gpu_plan_resolve_a_variable_by_the_same_rule(tmp_path):
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100", "nvidia_driver_reboot": "never"}})
    session = DeploySession.load(
        RunOptions(inventory=inv, extra_vars=["nvidia_driver_reboot=if_required"])
    )
    driver_play = next(p for p in session.plays if "nvidia_driver" in p.roles)
    in_play = session.planner.host_vars("g1", driver_play)
    assert in_play["nvidia_driver_reboot"] == session.host_variables("g1")["nvidia_driver_reboot"]
    assert in_play["nvidia_driver_reboot"] == "if_required"  # -e over host vars over defaults


def test_each_hosts_context_reaches_only_that_hosts_plan(tmp_path):
    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}, "g2": {"gpu_model": "H100"}})
    session = DeploySession.load(RunOptions(inventory=inv))
    play = next(p for p in session.plays if "nvidia_driver" in p.roles)
    facts = {h: HostFacts(host=h, os_id="debian", os_family="debian", os_version=v, arch="x86_64")
             for h, v in (("g1", "12"), ("g2", "11"))}  # fmt: skip
    seen = {
        h: session.planner.host_vars(h, play, {"facts": f.to_json()})["facts"]["os_version"]
        for h, f in facts.items()
    }
    assert seen == {"g1": "12", "g2": "11"}
    assert session.planner.host_vars("g1", play, {"facts": facts["g1"].to_json()})["facts"][
        "os_version"
    ] == "12"  # fmt: skip
    assert not hasattr(session.planner, "extra_context")


def test_an_inventory_without_a_monitoring_tier_gives_an_empty_one_by_data(tmp_path):
    from deployer.monitoring import tier as monitoring_tier

    inv = write_inventory(tmp_path, {"g1": {"gpu_model": "H100"}})
    session = DeploySession.load(RunOptions(inventory=inv), plan=False)
    tier = monitoring_tier.load(session)
    assert not tier.exists and tier.alertmanagers == [] and tier.replicas == []
