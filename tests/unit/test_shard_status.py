"""``status`` on a sharded tier: each replica judged on its own shard's targets, and one row per
sharded job proving every target is scraped by exactly one shard, by both of its replicas."""

from __future__ import annotations

from deployer.monitoring.check import FAILED, OK, PENDING
from deployer.monitoring.checks_shards import shard_checks
from deployer.monitoring.file_sd import Target

SHARDS = {"p1": "a", "p2": "a", "p3": "b", "p4": "b"}
GPU1 = Target("dcgm", "10.0.0.1:9400", "gpu1")
GPU2 = Target("dcgm", "10.0.0.2:9400", "gpu2")
EXPECTED = {"p1": [GPU1], "p2": [GPU1], "p3": [GPU2], "p4": [GPU2]}


def seen(**by_replica: list[Target]) -> dict[str, set[tuple[str, str]] | None]:
    out: dict[str, set[tuple[str, str]] | None] = {r: set() for r in SHARDS}
    for r, targets in by_replica.items():
        out[r] = {(t.job, t.instance) for t in targets}
    return out


def dcgm_row(observed):
    return shard_checks(SHARDS, EXPECTED, observed, jobs=("dcgm",))[0]


def test_each_target_scraped_by_both_replicas_of_its_shard_only_is_ok():
    row = dcgm_row(seen(p1=[GPU1], p2=[GPU1], p3=[GPU2], p4=[GPU2]))
    assert (row.state, row.detail) == (OK, "2 targets, 2 shards")


def test_a_target_scraped_by_two_shards_fails_naming_both():
    row = dcgm_row(seen(p1=[GPU1], p2=[GPU1], p3=[GPU2, GPU1], p4=[GPU2]))
    assert row.state == FAILED
    assert "gpu1 (10.0.0.1:9400) scraped by shards a, b" in row.detail


def test_a_target_no_shard_has_discovered_is_pending_naming_it():
    row = dcgm_row(seen(p1=[GPU1], p2=[GPU1]))
    assert row.state == PENDING and "gpu2" in row.detail and "no shard" in row.detail


def test_a_target_one_replica_of_its_shard_lacks_is_named_with_the_replica():
    row = dcgm_row(seen(p1=[GPU1], p3=[GPU2], p4=[GPU2]))
    assert row.state == PENDING and "not scraped by p2 of shard a" in row.detail


def test_a_replica_whose_targets_were_not_read_is_left_out():
    observed = seen(p1=[GPU1], p3=[GPU2], p4=[GPU2])
    observed["p2"] = None
    assert dcgm_row(observed).state == OK


def test_the_expectation_gives_each_replica_its_own_shards_targets():
    from deployer.monitoring.expect import expect
    from tests.unit.test_shards import replica_vars

    pvars = {
        r: {**replica_vars(r), "prometheus_replica": r}
        for r in ("prom01", "prom02", "prom03", "prom04")
    }
    for v in pvars.values():
        v.update(
            prometheus_cluster="c",
            prometheus_config_dir="/etc/prometheus",
            prometheus_rule_files_dir="/etc/prometheus/rules",
        )
    exp = expect(pvars, {}, {})
    a = {t.instance for t in exp.replica_targets["prom01"] if t.job == "dcgm"}
    b = {t.instance for t in exp.replica_targets["prom03"] if t.job == "dcgm"}
    assert a and b and not a & b
    assert {t.instance for t in exp.targets if t.job == "dcgm"} == a | b
    assert {exp.node_shards[n] for n in ("gpu01", "gpu02", "gpu03")} <= {"a", "b"}


def test_the_re_shard_row_says_whether_the_run_holding_the_lock_is_the_up_handing_over():
    from deployer.monitoring.checks_shards import reshard_check

    change = "rec.json: shards a (by host) of p1, p2 recorded, the inventory asks for ..."
    up = reshard_check(change, "up, pid 42, since 2026-12-05 14:00:00 UTC")
    assert up.state == "failed" and up.detail.startswith(change)
    assert (
        "(up, pid 42, since 2026-12-05 14:00:00 UTC): the `up` hands the moved hosts" in up.detail
    )
    other = reshard_check(change, "upgrade-driver, pid 43, since 2026-12-05 13:00:00 UTC")
    assert "Another run (upgrade-driver, pid 43" in other.detail
    assert "a whole `up` hands the moved hosts over" in other.detail
    none = reshard_check(change, None)
    assert "No `up` runs: a whole `up` hands the moved hosts over" in none.detail
