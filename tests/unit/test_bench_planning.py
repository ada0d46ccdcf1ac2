"""bench.planning's verdicts: issue 20's planning targets, judged on the 100,000-host size."""

from __future__ import annotations

from bench.planning import capacity_verdict, verdicts


def _result(hosts: int, total_s: float, peak: float) -> dict:
    return {"hosts": hosts, "stages": {}, "total_s": total_s, "peak_rss_mib": peak}


def test_only_the_100000_host_size_is_judged_on_time_and_memory():
    lines = verdicts([_result(1_003, 0.1, 50), _result(100_003, 2.5, 480)])
    assert lines == [
        "planning 100,003 hosts: 2.50 s (target < 3 s: met), peak 480 MiB (target < 500 MiB: met)"
    ]


def test_each_target_is_missed_on_its_own():
    assert verdicts([_result(100_003, 7.9, 480)]) == [
        "planning 100,003 hosts: 7.90 s (target < 3 s: MISSED), peak 480 MiB (target < 500 MiB: met)"
    ]
    assert "500 MiB: MISSED" in verdicts([_result(100_003, 2.0, 627)])[0]


def test_a_failed_size_says_so_with_both_targets():
    assert verdicts([{"hosts": 100_003, "error": "timed out"}]) == [
        "planning 100,003 hosts: failed (target < 3 s and < 500 MiB)"
    ]


def test_the_sharded_planning_is_judged_on_every_stage_it_timed():
    r = {"hosts": 100_000, "shards": 56, "replicas": 112, "total_s": 2.5, "peak_rss_mib": 367.0,
         "stages": {"inventory_load": {"s": 1.0}, "capacity": {"s": 0.5},
                    "file_sd_every_replica": {"s": 1.0}}}  # fmt: skip
    line = capacity_verdict(r)
    assert "56 shards' (112 replicas') file_sd" in line
    assert "inventory load 1.00 + capacity 0.50 + file sd every replica 1.00 = 2.50 s" in line
    assert "(target < 3 s: met)" in line and "(target < 500 MiB: met)" in line
    assert "(target < 3 s: MISSED)" in capacity_verdict({**r, "total_s": 6.6})
