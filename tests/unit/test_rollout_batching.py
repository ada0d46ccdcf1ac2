"""Batch arithmetic: canary then batches, N or P% amounts, and when --max-unavailable and
--max-failures let the next host start, make it wait, or stop the run."""

from __future__ import annotations

import pytest

from deployer.errors import InputError
from deployer.rollout.batching import Amount, Step, next_hosts, plan_batches, room

H = ["h1", "h2", "h3", "h4", "h5"]


@pytest.mark.parametrize(
    ("canary", "size", "batches"),
    [
        (1, 2, [["h1"], ["h2", "h3"], ["h4", "h5"]]),
        (1, 1, [["h1"], ["h2"], ["h3"], ["h4"], ["h5"]]),
        (0, 2, [["h1", "h2"], ["h3", "h4"], ["h5"]]),
        (2, 3, [["h1", "h2"], ["h3", "h4", "h5"]]),
        (9, 2, [H]),
        (1, 10, [["h1"], ["h2", "h3", "h4", "h5"]]),
    ],
)
def test_canary_then_batches(canary, size, batches):
    assert plan_batches(H, canary, size) == batches


def test_no_hosts_no_batches():
    assert plan_batches([], 1, 2) == []


@pytest.mark.parametrize(
    ("text", "total", "hosts"),
    [("2", 10, 2), ("25%", 4, 1), ("25%", 3, 1), ("50%", 5, 3), ("100%", 7, 7), ("1%", 3, 1)],
)
def test_amounts(text, total, hosts):
    assert Amount.parse(text, "--batch-size").of(total) == hosts


@pytest.mark.parametrize("text", ["0", "-1", "x", "150%", "2.5", "%"])
def test_bad_amounts_name_the_option(text):
    with pytest.raises(InputError) as exc:
        Amount.parse(text, "--max-unavailable")
    assert exc.value.key == "--max-unavailable"


@pytest.mark.parametrize(
    ("limit", "down", "free"),
    [(2, [], 2), (2, ["a"], 1), (2, ["a", "b"], 0), (2, ["a", "b", "c"], 0), (1, ["a", "a"], 0)],
)
def test_room(limit, down, free):
    assert room(limit, down) == free


@pytest.mark.parametrize(
    ("interrupted", "fresh", "running", "down", "max_unavailable", "failures", "start", "stopped"),
    [
        # a fresh batch of 2 with room for 2
        ([], ["a", "b"], [], [], 2, 0, ["a", "b"], False),
        # a host drained before the run takes one place
        ([], ["a", "b"], [], ["x"], 2, 0, ["a"], False),
        # a host of the run drained before it needs no place of its own: it is out already
        ([], ["a", "b"], [], ["a"], 1, 0, ["a"], False),
        ([], ["b", "a"], [], ["a"], 2, 0, ["a", "b"], False),
        # ... but none starts once --max-failures is reached
        ([], ["a"], [], ["a"], 1, 1, [], True),
        # no room and nothing of the run being driven: nothing starts, and the run says why
        ([], ["a", "b"], [], ["x", "y"], 2, 0, [], True),
        # interrupted hosts always continue (they are out of service already)
        (["a"], ["b", "c"], [], ["a"], 2, 0, ["a", "b"], False),
        # the places are held by hosts being driven: wait for one to come back, do not stop
        (["a", "b"], ["c"], [], ["a", "b"], 2, 0, ["a", "b"], False),
        (["a"], ["b"], [], ["a"], 1, 0, ["a"], False),
        ([], ["b"], ["a"], ["a"], 1, 0, [], False),
        # a host just started counts before its state file says so
        ([], ["b"], ["a"], [], 1, 0, [], False),
        # the running host came back: its place goes to the next one
        ([], ["b"], [], [], 1, 0, ["b"], False),
        # max failures reached: running and interrupted hosts finish, no fresh one starts
        (["a"], ["b"], [], ["a", "f"], 5, 1, ["a"], False),
        ([], ["b"], ["a"], ["a", "f"], 5, 1, [], False),
        ([], ["b"], [], ["f"], 5, 1, [], True),
        # failures below the limit do not stop
        ([], ["b"], [], ["f"], 5, 1 - 1, ["b"], False),
    ],
)
def test_next_hosts(interrupted, fresh, running, down, max_unavailable, failures, start, stopped):
    step = next_hosts(
        interrupted,
        fresh,
        running=running,
        out_of_service=down,
        max_unavailable=max_unavailable,
        failures=failures,
        max_failures=1,
    )
    assert step.start == start
    assert (step.stop_reason is not None) is stopped


def test_a_limit_held_by_a_resumed_host_is_a_wait_not_a_stop():
    # Killed with one host installing and one pending, --max-unavailable 1: the resumed host
    # takes the one place; the pending host waits for it instead of stopping the run.
    step = next_hosts(
        ["g2"], ["g3"], out_of_service=["g2"], max_unavailable=1, failures=0, max_failures=1
    )
    assert step == Step(["g2"])
    step = next_hosts([], ["g3"], out_of_service=[], max_unavailable=1, failures=0, max_failures=1)
    assert step == Step(["g3"])


def test_the_stop_reason_names_the_limit_and_the_hosts():
    step = next_hosts(
        [], ["a"], out_of_service=["x", "y"], max_unavailable=2, failures=0, max_failures=1
    )
    assert "--max-unavailable 2" in step.stop_reason and "x, y" in step.stop_reason
    step = next_hosts([], ["a"], out_of_service=[], max_unavailable=2, failures=2, max_failures=2)
    assert "--max-failures 2" in step.stop_reason
