"""Slurm's client commands read as Slurm 22.05.8 prints them: the real output captured from the
lab's slurmctld (tests/fixtures/slurm/, origin in its SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.monitoring import slurm_state
from deployer.monitoring.slurm_state import (
    SlurmParseError,
    expand_hostlist,
    parse_elapsed,
    parse_gres,
    parse_index_list,
    parse_job_gpus,
    parse_nodes,
    parse_sinfo,
    parse_squeue,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
ROLLOUT_REASON = (
    "gpumon-deploy upgrade-driver run 20261201T113000Z-580.126.20-ab12: "
    "driver 580.65.06 -> 580.126.20"
)


def capture(scenario: str, command: str) -> str:
    return (FIXTURES / f"{scenario}.{command}.txt").read_text()


def captured_view(scenario: str) -> slurm_state.SlurmView:
    return slurm_state.view(*(capture(scenario, c) for c in ("sinfo", "nodes", "squeue", "jobs")))


# ---------------------------------------------------------------- sinfo


def test_sinfo_gives_every_node_its_long_state_and_no_reason_when_in_service():
    nodes = parse_sinfo(capture("idle", "sinfo"))
    assert sorted(nodes) == [f"gpu0{i}" for i in range(1, 7)]
    assert {n.state for n in nodes.values()} == {"idle"}
    assert all(n.reason == n.reason_user == n.reason_time == "" for n in nodes.values())


def test_sinfo_keeps_a_rollout_s_reason_whole_with_who_set_it_and_when():
    gpu04 = parse_sinfo(capture("busy", "sinfo"))["gpu04"]
    assert gpu04.state == "draining"  # drained while a job still runs there
    assert gpu04.reason == ROLLOUT_REASON
    assert (gpu04.reason_user, gpu04.reason_time) == ("root", "2026-12-01T11:38:53")


def test_sinfo_shows_an_administrator_s_drain_and_a_down_node_with_their_reasons():
    nodes = parse_sinfo(capture("ending", "sinfo"))
    assert (nodes["gpu06"].state, nodes["gpu06"].reason) == ("draining", "XID 79 in burn-in")
    assert (nodes["gpu03"].state, nodes["gpu03"].reason) == ("down", "cable swap")


def test_sinfo_keeps_a_reason_holding_the_separator():
    line = "gpu01|drained|root|2026-12-01T11:38:53|RMA 4711 | fan | vendor ticket\n"
    assert parse_sinfo(line)["gpu01"].reason == "RMA 4711 | fan | vendor ticket"


def test_sinfo_takes_a_node_in_two_partitions_once():
    text = "gpu01|idle|Unknown|Unknown|none\ngpu01|idle|Unknown|Unknown|none\n"
    assert list(parse_sinfo(text)) == ["gpu01"]


def test_sinfo_output_of_another_format_is_an_error_naming_the_line():
    with pytest.raises(SlurmParseError, match="gpu01 idle"):
        parse_sinfo("gpu01 idle\n")


# ---------------------------------------------------------------- scontrol show node


def test_nodes_give_each_node_its_gpus_and_none_allocated_when_idle():
    gpus = parse_nodes(capture("idle", "nodes"))
    assert {n: (g.total, g.types, g.allocated, g.allocated_indexes) for n, g in gpus.items()} == {
        "gpu01": (8, ("h100",), 0, frozenset()),
        "gpu02": (8, ("h200",), 0, frozenset()),
        "gpu03": (4, ("a100",), 0, frozenset()),
        "gpu04": (8, ("v100",), 0, frozenset()),
        "gpu05": (2, ("h100",), 0, frozenset()),
        "gpu06": (2, ("l40s",), 0, frozenset()),
    }


def test_nodes_give_the_indexes_of_the_allocated_gpus():
    gpus = parse_nodes(capture("busy", "nodes"))
    assert gpus["gpu01"].allocated_indexes == {2}  # job 2's GPU; job 1's 0-1 were freed
    assert gpus["gpu02"].allocated_indexes == {0, 1, 2}
    assert (gpus["gpu06"].allocated, gpus["gpu06"].allocated_indexes) == (2, {0, 1})


def test_nodes_are_read_although_free_text_fields_hold_blanks():
    # the captured OS= field is "Linux 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0", and a
    # drained node's Reason= (last) is free text with blanks and a colon
    gpus = parse_nodes(capture("busy", "nodes"))
    assert gpus["gpu04"].allocated_indexes == {0, 1}
    assert len(gpus) == 6


def test_a_node_without_gres_topology_reports_counts_only():
    line = (
        "NodeName=gpu09 Arch=x86_64 Gres=gpu:a100:4 GresDrain=N/A GresUsed=gpu:a100:2 State=MIXED\n"
    )
    gpu09 = parse_nodes(line)["gpu09"]
    assert (gpu09.total, gpu09.allocated, gpu09.allocated_indexes) == (4, 2, None)


def test_a_node_with_two_gpu_types_has_one_index_space():
    line = (
        "NodeName=gpu09 Gres=gpu:a100:2(S:0),gpu:h100:2(S:1) "
        "GresUsed=gpu:a100:1(IDX:1),gpu:h100:2(IDX:2-3) State=MIXED\n"
    )
    gpu09 = parse_nodes(line)["gpu09"]
    assert (gpu09.total, gpu09.types, gpu09.allocated) == (4, ("a100", "h100"), 3)
    assert gpu09.allocated_indexes == {1, 2, 3}


def test_a_node_whose_gres_are_mig_instances_says_so():
    line = "NodeName=tux1 Gres=gpu:a100:1,gpu:a100_3g.20gb:2 GresUsed=gpu:a100:0(IDX:N/A),gpu:a100_3g.20gb:0(IDX:N/A)\n"
    assert parse_nodes(line)["tux1"].mig_typed
    assert not parse_nodes(capture("idle", "nodes"))["gpu05"].mig_typed


def test_gres_other_than_gpus_are_not_gpus():
    line = "NodeName=n1 Gres=gpu:2,mps:200 GresUsed=gpu:1(IDX:0),mps:0 State=MIXED\n"
    n1 = parse_nodes(line)["n1"]
    assert (n1.total, n1.types, n1.allocated, n1.allocated_indexes) == (2, (), 1, {0})


# ---------------------------------------------------------------- squeue and scontrol show job


def test_squeue_lists_the_jobs_holding_nodes_with_their_run_time():
    jobs = parse_squeue(capture("busy", "squeue"))
    assert sorted(jobs) == ["2", "3", "7", "8", "9"]
    assert jobs["7"].nodes == ("gpu03", "gpu05")  # squeue printed gpu[03,05]
    assert (jobs["2"].user, jobs["2"].state, jobs["2"].elapsed_s) == ("root", "RUNNING", 74)


def test_job_detail_gives_the_gpus_a_job_holds_on_each_node():
    gpus = parse_job_gpus(capture("busy", "jobs"))
    assert gpus["2"] == {"gpu01": {2}}
    assert gpus["3"] == {"gpu02": {0, 1, 2}}
    assert gpus["7"] == {"gpu03": {0}, "gpu05": {0}}  # two Nodes= groups
    assert "1" not in gpus  # cancelled: its detail says GRES=
    assert "10" not in gpus  # pending: no detail


def test_job_detail_of_ended_jobs_holds_no_gpu():
    assert parse_job_gpus(capture("idle", "jobs")) == {}


def test_no_jobs_at_all_is_no_job():
    assert parse_job_gpus(capture("nojobs", "jobs")) == {}


def test_a_job_name_with_blanks_does_not_shift_the_detail():
    assert "train llama 70b" in capture("busy", "jobs")
    assert parse_job_gpus(capture("busy", "jobs"))["2"] == {"gpu01": {2}}


def test_the_view_joins_squeue_s_jobs_and_their_gpus():
    v = captured_view("ending")
    assert {j.id: j.gpus for j in v.jobs_on("gpu02")} == {"10": {"gpu02": set(range(8))}}
    assert v.gpus["gpu02"].allocated_indexes == set(range(8))
    assert v.nodes["gpu03"].state == "down" and v.gpus["gpu03"].allocated == 0


# ---------------------------------------------------------------- small grammars


@pytest.mark.parametrize(
    ("expr", "hosts"),
    [
        ("gpu01", ["gpu01"]),
        ("gpu[03,05]", ["gpu03", "gpu05"]),
        ("gpu[08-10],mon01", ["gpu08", "gpu09", "gpu10", "mon01"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ],
)
def test_hostlists_expand_as_slurm_writes_them(expr, hosts):
    assert expand_hostlist(expr) == hosts


def test_a_broken_hostlist_is_an_error():
    with pytest.raises(SlurmParseError):
        expand_hostlist("gpu[01-")


@pytest.mark.parametrize(
    ("text", "indexes"),
    [("N/A", set()), ("0", {0}), ("0-2", {0, 1, 2}), ("0,2-3,7", {0, 2, 3, 7})],
)
def test_index_lists_read_as_bit_fmt_writes_them(text, indexes):
    assert parse_index_list(text) == indexes


def test_gres_items_split_at_commas_outside_their_index_lists():
    items = parse_gres("gpu:h100:3(IDX:0,2-3),gpu:a100:1(IDX:4)")
    assert [(g.type, g.count, g.indexes) for g in items] == [
        ("h100", 3, {0, 2, 3}),
        ("a100", 1, {4}),
    ]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0:00", 0), ("1:11", 71), ("12:34:56", 45296), ("2-03:04:05", 183845), ("INVALID", None)],
)
def test_squeue_run_times_read_as_seconds(text, seconds):
    assert parse_elapsed(text) == seconds
