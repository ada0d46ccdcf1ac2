"""bench.rollout's split of a run's wall time (the timing itself lives only in the bench)."""

from __future__ import annotations

from bench.rollout import judge, split, step_table


def s(kind, a, b, host=""):
    return {"kind": kind, "host": host, "start": a, "end": b}


def test_host_side_time_hides_the_controller_work_that_overlaps_it():
    parts = split(
        [s("step:installing", 1, 9, "g1"), s("remote", 2, 8, "g1"), s("plan", 1, 3)], 0, 10
    )
    assert parts["remote"] == 6
    assert parts["plan"] == 1  # 1..2, before the command started
    assert parts["steps"] == 1  # 8..9: inside the step, outside any command
    assert parts["start+exit"] == 2  # 0..1 and 9..10


def test_silencing_steps_count_as_the_controllers_silences():
    parts = split([s("step:silencing", 0, 2, "g1"), s("step:unsilencing", 5, 6, "g1")], 0, 6)
    assert parts["silence"] == 3 and parts["start+exit"] == 3


def test_parallel_hosts_count_each_instant_once():
    parts = split([s("remote", 0, 4, "g1"), s("remote", 2, 6, "g2")], 0, 6)
    assert parts["remote"] == 6
    assert sum(parts.values()) == 6


def test_the_controller_share_is_divided_by_the_hosts_rolled():
    got = judge({"remote": 50.0, "wait": 10.0, "load": 0.5, "steps": 1.5, "plan": 0.5}, 2)
    assert got["hosts_s"] == 60.0 and got["controller_s"] == 2.5
    assert got["controller_per_host_s"] == 1.0  # steps and planning, not the load


def test_start_up_and_loading_are_the_controllers_once_per_command_share():
    got = judge({"remote": 5.0, "load": 0.5, "start+exit": 1.5, "state_write": 4.0}, 4)
    assert got["controller_once_s"] == 2.0 and got["controller_per_host_s"] == 1.0


def test_each_hosts_steps_are_summed_by_name():
    got = step_table([s("step:installing", 0, 2, "g1"), s("step:installing", 5, 6, "g1")])
    assert got == {"g1": {"installing": 3.0}}
