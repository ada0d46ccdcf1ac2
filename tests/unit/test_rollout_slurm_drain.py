"""Who drained a Slurm node decides whether the run resumes it: the reason string tells an
administrator's drain from the run's, before, during and after the run (the GPU Operator's
uncordon bug, NVIDIA/gpu-operator#304); a host whose jobs outlive --job-timeout fails, is never
touched further and goes back to the scheduler as the run found it."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from deployer.errors import InputError
from deployer.rollout.command import _already_out
from deployer.rollout.controller import StepFailed
from deployer.rollout.drain import (
    EARLIER_RUN,
    NOBODY,
    SOMEONE_ELSE,
    THIS_RUN,
    UNKNOWN,
    KubernetesDrain,
    NodeState,
    SlurmDrain,
    owner,
    reason_run,
    run_reason,
)
from deployer.rollout.state import FAILED, LOCK_FILE, STATE_FILE
from tests.unit.slurmfake import FakeSlurm
from tests.unit.test_rollout_steps import rollout

OURS = "gpumon-deploy upgrade-driver run R1: driver 570.133.20 -> 580.126.20"
EARLIER = "gpumon-deploy upgrade-driver run R0: driver 570.133.20 -> 580.65.06"


def test_the_run_reason_names_the_run_and_the_driver_change():
    assert run_reason("R1", "570.133.20", "580.126.20") == OURS
    assert run_reason("R1", None, "580.126.20").endswith("driver none -> 580.126.20")
    assert reason_run(OURS) == "R1"
    assert reason_run("gpumon-deploy upgrade-driver is what broke it") is None


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (NodeState(drained=False, reason=""), NOBODY),
        (NodeState(drained=True, reason=OURS), THIS_RUN),
        (NodeState(drained=True, reason=EARLIER), EARLIER_RUN),
        (NodeState(drained=True, reason="bad DIMM, ticket 4711"), SOMEONE_ELSE),
        (NodeState(drained=True, reason="Not responding"), SOMEONE_ELSE),
        (NodeState(drained=True, reason=None), UNKNOWN),  # kubernetes: no reason to tell by
    ],
)
def test_the_owner_of_a_drain_is_read_from_its_reason(state, expected):
    assert owner(state, "R1") == expected


@pytest.mark.parametrize(
    ("line", "drained", "state"),
    [
        ("idle|none", False, "idle"),
        ("mixed|none", False, "mixed"),
        ("draining|" + OURS, True, "draining"),
        ("drained|" + OURS, True, "drained"),
        ("drained*|Not responding", True, "drained*"),
        ("drained@|reboot requested", True, "drained@"),
        ("down*|Not responding", True, "down*"),
        ("fail|bad gpu", True, "fail"),
    ],
)
def test_sinfo_states_that_take_no_new_work_count_as_drained(line, drained, state):
    got = SlurmDrain().parse_state("gpu01", 0, line + "\n" + line + "\n", "")
    assert (got.drained, got.state) == (drained, state)


def test_sinfo_keeps_the_whole_reason_and_none_means_no_reason():
    assert SlurmDrain().parse_state("g", 0, "drained|a | b: c\n", "").reason == "a | b: c"
    assert SlurmDrain().parse_state("g", 0, "idle|none\n", "").reason == ""


def test_a_node_slurm_does_not_know_fails_the_step_naming_the_host_var(tmp_path):
    with pytest.raises(StepFailed, match="Slurm has no node 'g1' \\(set slurm_node_name"):
        rollout(tmp_path, drain_conn=FakeSlurm("gpu-other"))._step_draining("g1")


def test_an_administrator_drain_during_the_run_is_never_resumed(tmp_path):
    slurm = FakeSlurm("g1")
    r = rollout(tmp_path, drain_conn=slurm)
    r._step_draining("g1")
    slurm.admin_drain("g1", "XID 79 seen during burn-in, RMA")
    r._step_undraining("g1")
    assert slurm.nodes["g1"].drain and slurm.nodes["g1"].reason.startswith("XID 79")
    assert not any("state=resume" in c for c in slurm.commands)
    assert any(
        "drained again during the run by someone else" in n for n in r.record.hosts["g1"].notes
    )


def test_a_node_someone_resumed_during_the_run_is_left_in_service(tmp_path):
    slurm = FakeSlurm("g1")
    r = rollout(tmp_path, drain_conn=slurm)
    r._step_draining("g1")
    slurm.nodes["g1"].drain = False
    r._step_undraining("g1")
    assert not any("state=resume" in c for c in slurm.commands)
    assert any("resumed by someone else" in n for n in r.record.hosts["g1"].notes)


def test_a_resumed_run_does_not_overwrite_an_administrator_s_later_drain(tmp_path):
    slurm = FakeSlurm("g1")
    r = rollout(tmp_path, drain_conn=slurm)
    r._step_draining("g1")
    slurm.admin_drain("g1", "PSU alarm")  # while the controller was down
    r._step_draining("g1")  # --resume repeats the interrupted step
    r._step_undraining("g1")
    assert slurm.nodes["g1"].reason == "PSU alarm"
    assert [c for c in slurm.scontrol() if "state=drain" in c] == [slurm.scontrol()[0]]
    assert r.record.hosts["g1"].drained_by_run is False


def dead_run(root: Path, run_id: str = "R0") -> Path:
    """The record a controller left of a run it no longer drives (killed mid-run)."""
    (root / run_id).mkdir(parents=True)
    (root / run_id / STATE_FILE).write_text(
        json.dumps({"run_id": run_id, "status": "running", "inventory": "/inv", "hosts": {}})
    )
    return root / run_id


def test_a_drain_left_by_an_unfinished_run_is_taken_over_and_resumed(tmp_path):
    slurm = FakeSlurm("g1")
    slurm.admin_drain("g1", EARLIER)
    dead_run(tmp_path / "runs")
    r = rollout(tmp_path, drain_conn=slurm)
    r._step_draining("g1")
    assert slurm.nodes["g1"].reason == OURS
    r._step_undraining("g1")
    assert slurm.nodes["g1"].state == "idle"
    assert any("run R0, which did not finish" in n for n in r.record.hosts["g1"].notes)


def test_a_drain_by_a_run_this_controller_does_not_know_fails_the_host_and_is_left(tmp_path):
    # Drained since the preflight by a run with no record here: another controller's, perhaps
    # under way. The host fails at draining; the node stays as that run left it.
    slurm = FakeSlurm("g1")
    slurm.admin_drain("g1", EARLIER)
    r = rollout(tmp_path, drain_conn=slurm)
    with pytest.raises(StepFailed, match="run R0, which this controller has no record of"):
        r._step_draining("g1")
    r._release("g1")
    assert slurm.nodes["g1"].reason == EARLIER and slurm.scontrol() == []


def test_a_drain_by_a_run_the_operator_names_dead_is_taken_over(tmp_path):
    slurm = FakeSlurm("g1")
    slurm.admin_drain("g1", EARLIER)
    r = rollout(tmp_path, drain_conn=slurm)
    r.record.options = dataclasses.replace(r.options, take_over=("R0",))
    r._step_draining("g1")
    assert slurm.nodes["g1"].reason == OURS


def test_a_node_drained_at_the_start_but_resumed_since_is_drained_before_it_changes(tmp_path):
    slurm = FakeSlurm("g1")
    r = rollout(tmp_path, drain_conn=slurm)
    r.record.hosts["g1"].was_drained = True  # the preflight saw an administrator's drain
    r._step_draining("g1")
    assert slurm.nodes["g1"].reason == OURS
    assert r.record.hosts["g1"].drained_by_run is True


def test_the_drain_waits_until_slurm_has_no_job_on_the_node(tmp_path):
    slurm = FakeSlurm("g1")
    slurm.nodes["g1"].jobs = ["41"]
    polls = []

    def job_ends(command: str) -> None:
        if "squeue" in command:
            polls.append(command)
            if len(polls) == 3:
                slurm.nodes["g1"].jobs = []

    slurm.before = job_ends
    r = rollout(tmp_path, drain_conn=slurm)
    r._step_draining("g1")
    assert len(polls) == 3
    assert slurm.nodes["g1"].state == "drained"


def test_jobs_past_the_timeout_fail_the_host_and_give_it_back_unchanged(tmp_path):
    slurm = FakeSlurm("g1")
    slurm.nodes["g1"].jobs = ["41"]
    r = rollout(tmp_path, drain_conn=slurm)  # --job-timeout 30
    r._enter("g1", "draining")
    r._drive("g1")
    rec = r.store.load().hosts["g1"]
    assert rec.state == FAILED and rec.failed_step == "draining"
    assert "after 30s (--job-timeout): job 41 (alice, RUNNING): train.sh" in rec.reason
    assert rec.returned and not rec.out_of_service
    assert slurm.nodes["g1"].state == "mixed"  # resumed, the job still runs
    assert [h[0] for h in rec.history] == ["draining", FAILED]  # never stopped nor rebooted


def test_a_timed_out_host_drained_by_an_administrator_stays_drained(tmp_path):
    slurm = FakeSlurm("g1")
    slurm.admin_drain("g1", "maintenance window 14:00")
    slurm.nodes["g1"].jobs = ["41"]
    r = rollout(tmp_path, drain_conn=slurm)
    r._enter("g1", "draining")
    r._drive("g1")
    assert slurm.nodes["g1"].state == "draining"
    assert not any("state=resume" in c for c in slurm.commands)
    assert not r.record.hosts["g1"].returned


def test_kubernetes_nodes_the_run_cordoned_are_uncordoned_without_a_reason():
    # no reason is kept: a node drained by the run is resumed, one drained before never is
    assert owner(KubernetesDrain().parse_state("n1", 0, "", ""), "R1") == UNKNOWN
    assert owner(KubernetesDrain().parse_state("n1", 1, "", ""), "R1") == NOBODY


def _preflight(*hosts: str):
    return SimpleNamespace(hosts={h: SimpleNamespace(variables={}) for h in hosts}, unreachable={})


def test_the_preflight_refuses_a_host_slurm_does_not_know_before_touching_anything():
    slurm = FakeSlurm("gpu01")
    with pytest.raises(InputError, match="g1: the slurm drain hook cannot read node 'g1'") as exc:
        _already_out(_preflight("g1"), SlurmDrain(), lambda: slurm)
    assert exc.value.key == "slurm_node_name"
    assert slurm.scontrol() == []


def test_the_preflight_tells_an_administrator_drain_from_an_unfinished_run_s(tmp_path):
    slurm = FakeSlurm("g1", "g2", "g3")
    slurm.admin_drain("g1", "bad DIMM")
    slurm.admin_drain("g2", EARLIER)
    dead_run(tmp_path)
    before = _already_out(_preflight("g1", "g2", "g3"), SlurmDrain(), lambda: slurm, tmp_path)
    assert before.drained_by_others == {"g1"}
    assert before.out["g1"] == "drained before the run (slurm) (drained: 'bad DIMM')"
    assert "run R0, which did not finish: this run takes it over" in before.out["g2"]
    assert "g3" not in before.out


def test_the_preflight_refuses_a_node_of_a_run_that_may_be_alive_before_touching_anything(
    tmp_path,
):
    slurm = FakeSlurm("g1", "g2")
    slurm.admin_drain("g2", EARLIER)
    # no record of R0 here: another controller may be driving it
    with pytest.raises(InputError, match="g2: node 'g2' is drained by upgrade-driver run R0, "
                       "which this controller has no record of") as err:  # fmt: skip
        _already_out(_preflight("g1", "g2"), SlurmDrain(), lambda: slurm, tmp_path)
    assert err.value.key == "--take-over" and "--take-over R0" in str(err.value)
    assert err.value.hosts_read  # the CLI says: nothing changed, the hosts only read
    # a record of R0 whose controller holds its lock: it is under way here
    run_dir = dead_run(tmp_path)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(InputError, match="which a controller drives now"):
            _already_out(_preflight("g1", "g2"), SlurmDrain(), lambda: slurm, tmp_path)
        # named by the operator, but alive here: refused all the same (a mixed-up run id)
        with pytest.raises(
            InputError, match=r"drives now .*\(--take-over names it, but it is alive\)"
        ):
            _already_out(_preflight("g2"), SlurmDrain(), lambda: slurm, tmp_path, ("R0",))
    finally:
        os.close(fd)
    # its controller gone: named, it is taken over
    before = _already_out(_preflight("g2"), SlurmDrain(), lambda: slurm, tmp_path, ("R0",))
    assert "this run takes it over" in before.out["g2"]
    assert slurm.scontrol() == []
