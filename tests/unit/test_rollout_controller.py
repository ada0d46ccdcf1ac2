"""The rollout controller's state machine, with the steps replaced by recorders: the order of
steps, the state file after every transition, batches, --max-unavailable, --max-failures, the
canary, resume without repeating finished work, and a lost connection left for --resume."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from deployer.errors import HostUnreachable
from deployer.monitoring import tier as monitoring_tier
from deployer.rollout.controller import Rollout, StepFailed
from deployer.rollout.drain import NoDrain
from deployer.rollout.options import RolloutOptions
from deployer.rollout.state import STEPS, HostRecord, RunRecord, StateStore
from deployer.session import DeploySession, RunOptions

WORK_STEPS = STEPS[1:-1]  # draining .. unsilencing

INVENTORY = """\
all:
  children:
    gpu:
      hosts:
        g1: {ansible_host: 127.0.0.1}
        g2: {ansible_host: 127.0.0.1}
        g3: {ansible_host: 127.0.0.1}
        g4: {ansible_host: 127.0.0.1}
        g5: {ansible_host: 127.0.0.1}
"""


class Recorded(Rollout):
    """Every step records (host, step); ``fail`` maps host -> step that raises StepFailed;
    ``lose`` maps host -> step that loses the connection. Tracks hosts running at once."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.calls: list[tuple[str, str]] = []
        self.fail: dict[str, str] = {}
        self.lose: dict[str, str] = {}
        self.saved_states: list[dict[str, str]] = []
        self.saved_records: list[dict] = []
        self.slow: dict[str, float] = {}
        self.running: set[str] = set()
        self.most_running = 0
        self._calls_lock = threading.Lock()
        original = self.store.save

        def save(rec: RunRecord) -> None:
            original(rec)
            with self._calls_lock:
                self.saved_states.append({h: r.state for h, r in rec.hosts.items()})
                self.saved_records.append(rec.to_json())

        self.store.save = save  # type: ignore[method-assign]
        for step in WORK_STEPS:
            setattr(self, f"_step_{step}", self._make(step))

    def _make(self, step: str):
        def run(host: str) -> None:
            with self._calls_lock:
                self.calls.append((host, step))
                self.running.add(host)
                self.most_running = max(self.most_running, len(self.running))
            time.sleep(self.slow.get(host, 0.002) if step == "installing" else 0.002)
            if self.lose.get(host) == step:
                raise HostUnreachable(f"{host}: connection lost")
            if self.fail.get(host) == step:
                raise StepFailed(f"{step} broke")
            if step == "unsilencing":
                with self._calls_lock:
                    self.running.discard(host)

        return run


def make(tmp_path: Path, batches, *, max_unavailable=2, max_failures=1, canary=1, states=None):
    inv = tmp_path / "inventory.yml"
    inv.write_text(INVENTORY)
    hosts = {
        h: HostRecord(host=h, batch=i, state=(states or {}).get(h, "pending"))
        for i, b in enumerate(batches)
        for h in b
    }
    rec = RunRecord(
        run_id="r1",
        inventory=str(inv),
        target={"requested": "580", "branch": "580", "version": "580.126.20", "listed": True},
        options=RolloutOptions(
            max_unavailable_hosts=max_unavailable,
            max_failures=max_failures,
            canary=canary,
        ),
        batches=batches,
        hosts=hosts,
    )
    store = StateStore.create(rec, tmp_path / "runs")
    return Recorded(
        record=rec,
        store=store,
        targets={},
        hook=NoDrain(),
        tier=monitoring_tier.MonitoringTier(),
        session=DeploySession.load(RunOptions(inventory=inv), plan=False),
    )


def steps_of(r: Recorded, host: str) -> list[str]:
    return [s for h, s in r.calls if h == host]


def test_every_host_goes_through_every_step_in_order(tmp_path):
    r = make(tmp_path, [["g1"], ["g2", "g3"]])
    rec = r.run()
    assert rec.status == "finished"
    for h in ("g1", "g2", "g3"):
        assert steps_of(r, h) == list(WORK_STEPS)
        assert rec.hosts[h].state == "done"
        assert [s for s, _ in rec.hosts[h].history] == list(STEPS[1:])


def test_the_state_file_is_written_at_every_transition(tmp_path):
    r = make(tmp_path, [["g1"]])
    r.run()
    seen = [s["g1"] for s in r.saved_states]
    for step in STEPS[1:]:
        assert step in seen
    assert r.store.load().hosts["g1"].state == "done"


def test_batches_run_one_after_another_hosts_of_a_batch_together(tmp_path):
    r = make(tmp_path, [["g1"], ["g2", "g3"], ["g4", "g5"]], max_unavailable=2)
    r.run()
    first_of = {h: r.calls.index((h, "draining")) for h in ("g1", "g2", "g3", "g4", "g5")}
    last_of = {h: r.calls.index((h, "unsilencing")) for h in ("g1", "g2", "g3", "g4", "g5")}
    assert last_of["g1"] < min(first_of["g2"], first_of["g3"])
    assert max(last_of["g2"], last_of["g3"]) < min(first_of["g4"], first_of["g5"])
    assert r.most_running == 2


def test_max_unavailable_counts_hosts_drained_before_the_run(tmp_path):
    r = make(tmp_path, [["g1", "g2", "g3"]], max_unavailable=2)
    r.record.unavailable_before = {"g5": "drained before the run (slurm)"}
    rec = r.run()
    assert rec.status == "finished"
    assert r.most_running == 1  # g5 takes one of the two places


def test_a_host_drained_before_the_run_is_driven_without_taking_a_place(tmp_path):
    # --max-unavailable 1, g1 drained by an earlier run this one takes over: upgrading g1 takes
    # no host out of service that was in service, so it starts; g2 waits for the one place
    r = make(tmp_path, [["g1"], ["g2"]], max_unavailable=1)
    r.record.unavailable_before = {"g1": "drained by run R0, which did not finish"}
    draining = r._step_draining

    def take_over(host: str) -> None:  # as the draining step records taking the drain over
        draining(host)
        r.record.hosts[host].drained_by_run = True

    r._step_draining = take_over  # type: ignore[method-assign]
    rec = r.run()
    assert rec.status == "finished", rec.stop_reason
    assert rec.hosts["g1"].state == rec.hosts["g2"].state == "done"
    # g1 back in service once validated: its place is free for g2 (it once held it for good)
    assert steps_of(r, "g2") == list(WORK_STEPS)
    assert rec.out_of_service() == set()


def test_a_host_an_administrator_drained_keeps_its_place_after_the_run_drives_it(tmp_path):
    r = make(tmp_path, [["g1"], ["g2"]], max_unavailable=1)
    r.record.unavailable_before = {"g1": "drained before the run (slurm)"}
    r.record.hosts["g1"].was_drained = True
    rec = r.run()
    # g1 driven (it needed no place), left drained: no room for g2 in service
    assert rec.hosts["g1"].state == "done" and steps_of(r, "g2") == []
    assert rec.status == "stopped" and "--max-unavailable 1" in rec.stop_reason


def test_no_room_at_all_stops_the_run_naming_the_limit(tmp_path):
    r = make(tmp_path, [["g1"]], max_unavailable=1)
    r.record.unavailable_before = {"g5": "unreachable"}
    rec = r.run()
    assert rec.status == "stopped"
    assert "--max-unavailable 1" in rec.stop_reason
    assert r.calls == []


def test_a_failure_leaves_the_host_where_it_failed_and_no_new_batch_starts(tmp_path):
    r = make(tmp_path, [["g1"], ["g2", "g3"], ["g4"]], max_failures=1)
    r.fail = {"g2": "validating"}
    rec = r.run()
    assert rec.status == "stopped" and "--max-failures 1" in rec.stop_reason
    assert rec.hosts["g2"].state == "failed"
    assert rec.hosts["g2"].failed_step == "validating"
    assert rec.hosts["g2"].reason == "validating broke"
    assert "undraining" not in steps_of(r, "g2") and "unsilencing" not in steps_of(r, "g2")
    assert rec.hosts["g3"].state == "done"  # same batch: already running
    assert rec.hosts["g4"].state == "pending" and steps_of(r, "g4") == []


def test_max_failures_counts_over_the_whole_run(tmp_path):
    r = make(tmp_path, [["g1"], ["g2"], ["g3"], ["g4"]], max_failures=2, canary=0)
    r.fail = {"g1": "installing", "g3": "starting"}
    rec = r.run()
    assert [rec.hosts[h].state for h in ("g1", "g2", "g3", "g4")] == [
        "failed", "done", "failed", "pending",
    ]  # fmt: skip


def test_a_failed_canary_stops_the_run_even_below_max_failures(tmp_path):
    r = make(tmp_path, [["g1"], ["g2"]], max_failures=5, canary=1)
    r.fail = {"g1": "validating"}
    rec = r.run()
    assert rec.status == "stopped" and "canary" in rec.stop_reason
    assert steps_of(r, "g2") == []


def test_resume_repeats_only_the_interrupted_step_and_never_a_finished_host(tmp_path):
    r = make(
        tmp_path,
        [["g1"], ["g2", "g3"]],
        states={"g1": "done", "g2": "rebooting", "g3": "pending"},
    )
    rec = r.run()
    assert rec.status == "finished"
    assert steps_of(r, "g1") == []
    assert steps_of(r, "g2") == list(WORK_STEPS[WORK_STEPS.index("rebooting") :])
    assert steps_of(r, "g3") == list(WORK_STEPS)


def test_a_lost_connection_interrupts_the_run_and_keeps_the_step_for_resume(tmp_path):
    r = make(tmp_path, [["g1"], ["g2"]])
    r.lose = {"g1": "rebooting"}
    rec = r.run()
    assert rec.status == "interrupted" and "--resume" in rec.stop_reason
    assert rec.hosts["g1"].state == "rebooting"
    assert steps_of(r, "g2") == []
    (tmp_path / "again").mkdir()
    again = make(tmp_path / "again", [["g1"], ["g2"]], states={"g1": "rebooting"})
    again.record.hosts["g1"] = r.store.load().hosts["g1"]
    rec = again.run()
    assert rec.status == "finished"
    assert steps_of(again, "g1")[0] == "rebooting"


@pytest.mark.parametrize("state", ["done", "skipped", "failed"])
def test_hosts_in_a_final_state_are_left_alone(tmp_path, state):
    r = make(tmp_path, [["g1"], ["g2"]], states={"g1": state}, max_failures=3, canary=0)
    r.run()
    assert steps_of(r, "g1") == []
    assert r.record.hosts["g2"].state == "done"


def test_resume_with_max_unavailable_below_the_batch_finishes_the_batch_in_one_go(tmp_path):
    # Killed with g1 done, g2 installing and g3 pending, --max-unavailable 1 and a batch of 2:
    # the resumed g2 holds the one place; once it is back, g3 takes it (it used to stop the run
    # with "--max-unavailable 1 reached", judged before g2 had come back).
    r = make(
        tmp_path,
        [["g1"], ["g2", "g3"]],
        max_unavailable=1,
        states={"g1": "done", "g2": "installing", "g3": "pending"},
    )
    rec = r.run()
    assert rec.status == "finished" and rec.stop_reason is None
    assert {h: x.state for h, x in rec.hosts.items()} == {"g1": "done", "g2": "done", "g3": "done"}
    assert r.most_running == 1
    assert r.calls.index(("g2", "unsilencing")) < r.calls.index(("g3", "draining"))
    assert max(len(RunRecord.from_json(s).out_of_service()) for s in r.saved_records) <= 1


def test_a_place_freed_in_a_batch_goes_to_the_next_host_without_waiting_for_the_others(tmp_path):
    r = make(tmp_path, [["g1", "g2", "g3"]], max_unavailable=2, canary=0)
    r.slow = {"g1": 0.3}  # g2 comes back long before g1
    rec = r.run()
    assert rec.status == "finished"
    assert r.most_running == 2
    assert r.calls.index(("g3", "draining")) < r.calls.index(("g1", "unsilencing"))
    assert max(len(RunRecord.from_json(s).out_of_service()) for s in r.saved_records) <= 2


def test_a_failure_within_the_batch_lets_the_running_hosts_finish_then_stops(tmp_path):
    r = make(tmp_path, [["g1", "g2", "g3"]], max_unavailable=2, canary=0, max_failures=1)
    r.fail = {"g1": "installing"}
    r.slow = {"g2": 0.2}
    rec = r.run()
    assert rec.status == "stopped" and "--max-failures 1" in rec.stop_reason
    assert rec.hosts["g2"].state == "done"  # already running: finished
    assert rec.hosts["g3"].state == "pending" and steps_of(r, "g3") == []


def test_a_limit_held_by_hosts_nothing_brings_back_still_stops_the_run(tmp_path):
    r = make(tmp_path, [["g1", "g2"]], max_unavailable=1, canary=0, max_failures=5)
    r.fail = {"g1": "rebooting"}  # failed after draining: left out of service
    rec = r.run()
    assert rec.status == "stopped"
    assert "--max-unavailable 1 reached" in rec.stop_reason and "g1" in rec.stop_reason
    assert steps_of(r, "g2") == []
