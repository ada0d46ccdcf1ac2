"""Targets split across Prometheus shards by rendezvous hashing: deterministic, minimal movement,
balanced, a host's targets together, racks together where asked."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from deployer.errors import InputError
from deployer.monitoring import file_sd, shards
from tests.unit.test_file_sd import GROUPS, HOSTVARS, variables

HOSTS = [f"gpu{i:05d}" for i in range(2000)]
NO_VARS: dict[str, dict[str, Any]] = {h: {} for h in HOSTS}


def test_the_assignment_does_not_depend_on_the_order_of_hosts_or_shards():
    one = shards.host_shards(HOSTS, NO_VARS, ["a", "b", "c"])
    other = shards.host_shards(list(reversed(HOSTS)), NO_VARS, ["c", "a", "b"])
    assert one == other


def test_adding_two_hosts_moves_no_existing_host():
    before = shards.host_shards(HOSTS, NO_VARS, ["a", "b", "c"])
    more = [*HOSTS, "gpu-new-1", "gpu-new-2"]
    after = shards.host_shards(more, {**NO_VARS, "gpu-new-1": {}, "gpu-new-2": {}}, ["a", "b", "c"])
    assert {h: after[h] for h in HOSTS} == before


def test_removing_a_host_moves_no_other_host():
    before = shards.host_shards(HOSTS, NO_VARS, ["a", "b"])
    after = shards.host_shards(HOSTS[1:], NO_VARS, ["a", "b"])
    assert {h: before[h] for h in HOSTS[1:]} == after


def test_a_new_shard_takes_hosts_only_from_the_others_and_about_its_share():
    before = shards.host_shards(HOSTS, NO_VARS, ["a", "b"])
    after = shards.host_shards(HOSTS, NO_VARS, ["a", "b", "c"])
    moved = [h for h in HOSTS if before[h] != after[h]]
    assert all(after[h] == "c" for h in moved)
    assert abs(len(moved) - len(HOSTS) / 3) < 0.1 * len(HOSTS)


def test_a_removed_shard_gives_only_its_own_hosts_to_the_others():
    before = shards.host_shards(HOSTS, NO_VARS, ["a", "b", "c"])
    after = shards.host_shards(HOSTS, NO_VARS, ["a", "b"])
    moved = [h for h in HOSTS if before[h] != after[h]]
    assert moved == [h for h in HOSTS if before[h] == "c"]


def test_a_hosts_shard_is_the_same_whichever_jobs_host_list_asks_first():
    # one memo of the split serves the node job's list (more hosts) and the dcgm job's
    v = replica_vars("prom01")
    gpus = list(v["groups"]["gpu"])
    every = [*v["groups"]["prometheus"], *gpus]
    direct = shards.host_shards(every, v["hostvars"], ["a", "b"])
    for hosts in (every, gpus):
        for s in ("a", "b"):
            assert shards.members_of_shard(v, hosts, s) == [h for h in hosts if direct[h] == s]


def test_a_jobs_members_follow_a_group_that_changed_since_the_last_call():
    # members are remembered per groups object (every shard asks for the same), not past a change
    v = replica_vars("prom01")
    before = file_sd.members(v, ["gpu", "prometheus"])
    v["groups"]["gpu"].append("gpu-new")
    after = file_sd.members(v, ["gpu", "prometheus"])
    assert after == (*before[: len(v["groups"]["gpu"]) - 1], "gpu-new", *v["groups"]["prometheus"])
    # handed out as they are, never a copy: nobody can change what the next caller gets
    assert file_sd.members(v, ["gpu", "prometheus"]) is after and isinstance(after, tuple)


def test_hosts_are_balanced_across_shards():
    got = shards.host_shards(HOSTS, NO_VARS, ["s1", "s2", "s3", "s4"])
    counts = [list(got.values()).count(s) for s in ("s1", "s2", "s3", "s4")]
    assert all(abs(c - len(HOSTS) / 4) < 0.1 * len(HOSTS) / 4 for c in counts), counts


def test_by_rack_keeps_a_racks_hosts_in_one_shard():
    hv = {h: {"rack": f"r{i % 20}"} for i, h in enumerate(HOSTS)}
    got = shards.host_shards(HOSTS, hv, ["a", "b", "c"], by="rack")
    for rack in {v["rack"] for v in hv.values()}:
        assert len({got[h] for h in HOSTS if hv[h]["rack"] == rack}) == 1


def test_an_unknown_shard_key_kind_is_refused_naming_the_variable():
    with pytest.raises(InputError) as exc:
        shards.check_by("row")
    assert exc.value.key == "prometheus_shard_by"


# ---------------------------------------------------------------- in the targets files

SHARDED_GROUPS = {**GROUPS, "prometheus": ["prom01", "prom02", "prom03", "prom04"]}
SHARD_OF = {"prom01": "a", "prom02": "a", "prom03": "b", "prom04": "b"}


def replica_vars(replica: str, **overrides: Any) -> dict[str, Any]:
    hostvars = copy.deepcopy(HOSTVARS)
    for i in range(4, 40):
        hostvars[f"gpu{i:02d}"] = {"rack": f"r{i % 3}"}
    for r, s in SHARD_OF.items():
        hostvars.setdefault(r, {})["prometheus_shard"] = s
    groups = {
        **SHARDED_GROUPS,
        "gpu": ["gpu01", "gpu02", "gpu03"] + [f"gpu{i:02d}" for i in range(4, 40)],
    }
    v = variables(groups=groups, hostvars=hostvars, **overrides)
    v["prometheus_shard"] = SHARD_OF[replica]
    return v


def instances(v: dict[str, Any], job: str) -> set[str]:
    return {t for g in file_sd.job_targets(v, job) for t in g["targets"]}


@pytest.mark.parametrize("job", ["dcgm", "node"])
def test_every_target_of_a_sharded_job_is_in_exactly_one_shard(job: str):
    a, b = instances(replica_vars("prom01"), job), instances(replica_vars("prom03"), job)
    unsharded = instances(variables(groups=replica_vars("prom01")["groups"],
                                    hostvars=replica_vars("prom01")["hostvars"]), job)  # fmt: skip
    assert a and b and not a & b
    assert a | b == unsharded


def test_both_replicas_of_a_shard_scrape_the_same_targets():
    for job in ("dcgm", "node"):
        assert instances(replica_vars("prom01"), job) == instances(replica_vars("prom02"), job)


def test_a_hosts_gpu_and_node_targets_are_in_the_same_shard():
    v = replica_vars("prom01")
    gpu_nodes = {g["labels"]["node"] for g in file_sd.job_targets(v, "dcgm")}
    node_nodes = {g["labels"]["node"] for g in file_sd.job_targets(v, "node")}
    assert gpu_nodes <= node_nodes
    other = {g["labels"]["node"] for g in file_sd.job_targets(replica_vars("prom03"), "node")}
    assert not gpu_nodes & other


def test_the_stacks_own_daemons_are_scraped_by_every_shard():
    for job in ("prometheus", "alertmanager"):
        assert instances(replica_vars("prom01"), job) == instances(replica_vars("prom03"), job)


def test_a_replica_without_a_shard_beside_sharded_ones_is_refused_naming_it():
    v = replica_vars("prom01")
    del v["hostvars"]["prom04"]["prometheus_shard"]
    with pytest.raises(InputError) as exc:
        file_sd.job_targets(v, "dcgm")
    assert exc.value.key == "prometheus_shard" and "prom04" in exc.value.message


# ---------------------------------------------------------------- what the role renders

SHARDED_INVENTORY = """\
all:
  hosts:
    gpu01: {ansible_host: 192.0.2.11}
    gpu02: {ansible_host: 192.0.2.12}
    gpu03: {ansible_host: 192.0.2.13}
    prom01: {ansible_host: 192.0.2.21, prometheus_shard: a}
    prom02: {ansible_host: 192.0.2.22, prometheus_shard: a}
    prom03: {ansible_host: 192.0.2.23, prometheus_shard: b}
    prom04: {ansible_host: 192.0.2.24, prometheus_shard: b}
  children:
    gpu:
      hosts: {gpu01: {}, gpu02: {}, gpu03: {}}
    prometheus:
      hosts: {prom01: {}, prom02: {}, prom03: {}, prom04: {}}
"""


def planned(tmp_path, inventory: str):
    from deployer.session import DeploySession, RunOptions
    from tests.unit.test_file_sd import SITE

    (tmp_path / "inventory.yml").write_text(inventory)
    (tmp_path / "site.yml").write_text(SITE)
    return DeploySession.load(
        RunOptions(inventory=tmp_path / "inventory.yml", site=tmp_path / "site.yml")
    )


def test_a_replicas_ha_peers_are_its_own_shards_replicas(tmp_path):
    session = planned(tmp_path, SHARDED_INVENTORY)
    play = session.plays[0]
    assert list(session.planner.host_vars("prom01", play)["prometheus_ha_peers"]) == [
        "prom01",
        "prom02",
    ]
    assert list(session.planner.host_vars("prom04", play)["prometheus_ha_peers"]) == [
        "prom03",
        "prom04",
    ]


def test_an_unsharded_replicas_ha_peers_are_every_replica(tmp_path):
    session = planned(tmp_path, SHARDED_INVENTORY.replace(", prometheus_shard: a", "").replace(
        ", prometheus_shard: b", ""))  # fmt: skip
    peers = session.planner.host_vars("prom01", session.plays[0])["prometheus_ha_peers"]
    assert list(peers) == ["prom01", "prom02", "prom03", "prom04"]


def test_each_replicas_config_carries_its_shard_as_an_external_label(tmp_path):
    session = planned(tmp_path, SHARDED_INVENTORY)
    for plan in session.plans:
        config = next(
            t.args["content"]
            for t in plan.plays[0].tasks
            if str(t.args.get("dest", "")).endswith("prometheus.yml")
        )
        labels = yaml.safe_load(config)["global"]["external_labels"]
        assert labels["shard"] == ("a" if plan.host in ("prom01", "prom02") else "b")


def test_planning_every_replica_assigns_each_host_and_reads_its_variables_once(
    tmp_path, monkeypatch
):
    # Every replica's targets files read the same hostvars: 112 replicas of 100,000 hosts would
    # otherwise hash and resolve every host once per replica (minutes of planning).
    from deployer.templating import TemplatedVars

    hashed: list[str] = []
    real_assign, real_init = shards.assign, TemplatedVars.__init__

    def assign(keys, names):
        keys = list(keys)
        hashed.extend(keys)
        return real_assign(keys, names)

    resolved: list[str] = []

    def init(self, raw, renderer, source="variables"):
        resolved.append(source)
        real_init(self, raw, renderer, source)

    monkeypatch.setattr(shards, "assign", assign)
    monkeypatch.setattr(TemplatedVars, "__init__", init)
    session = planned(tmp_path, SHARDED_INVENTORY)
    assert [p.host for p in session.plans] == ["prom01", "prom02", "prom03", "prom04"]
    assert sorted(hashed) == sorted(set(hashed))  # each key once, for all four replicas
    assert {"host:gpu01", "host:gpu02", "host:gpu03"} <= set(hashed)
    # at most once: plain values (these hosts' labels, addresses) are read without building
    # the host's entry at all (LazyHostVars.values_of)
    assert resolved.count("variables of gpu01") <= 1
    planner = session.planner
    one, other = (planner.host_vars(h, session.plays[0]) for h in ("prom01", "prom03"))
    assert one["hostvars"] is other["hostvars"]


def test_overrides_changed_in_place_make_a_new_hostvars(tmp_path):
    # one hostvars per (role defaults, overrides): kept by identity, it must not outlive a
    # change made to the same overrides dict
    session = planned(tmp_path, SHARDED_INVENTORY)
    overrides = {"cluster": "east"}
    before = session.planner.host_vars("prom01", session.plays[0], overrides=overrides)
    assert before["hostvars"]["gpu01"]["cluster"] == "east"
    overrides["cluster"] = "west"
    after = session.planner.host_vars("prom01", session.plays[0], overrides=overrides)
    assert after["hostvars"] is not before["hostvars"]
    assert after["hostvars"]["gpu01"]["cluster"] == "west"
