"""The rollout's persisted run state: the step order, what counts as out of service, and a state
file that survives a crash at any instant (atomic replace) and keeps a second controller off."""

from __future__ import annotations

import json
import os
import stat

import pytest

from deployer.errors import InputError
from deployer.rollout import state as st
from deployer.rollout.options import RolloutOptions
from deployer.rollout.state import HostRecord, RunRecord, StateStore


def record(**hosts: str) -> RunRecord:
    return RunRecord(
        run_id="r1",
        inventory="/inv.yml",
        target={"requested": "580", "branch": "580", "version": "580.126.20", "listed": True},
        options=RolloutOptions(max_unavailable_hosts=2, max_failures=1, canary=1),
        batches=[list(hosts)],
        hosts={h: HostRecord(host=h, batch=0, state=s) for h, s in hosts.items()},
    )


def test_steps_follow_the_order_of_the_issue():
    assert st.STEPS == (
        "pending", "draining", "waiting_jobs", "silencing", "stopping", "installing",
        "rebooting", "starting", "validating", "recording", "undraining", "unsilencing", "done",
    )  # fmt: skip
    assert st.next_step("silencing") == "stopping"
    with pytest.raises(ValueError):
        st.next_step("done")


@pytest.mark.parametrize(
    ("state", "failed_step", "out"),
    [
        ("pending", None, False),
        ("draining", None, True),
        ("installing", None, True),
        ("validating", None, True),
        ("recording", None, True),
        ("undraining", None, True),  # out until the scheduler has it back
        ("unsilencing", None, False),
        ("done", None, False),
        ("skipped", None, False),
        ("failed", "validating", True),  # a failed host stays drained
        ("failed", "draining", True),
    ],
)
def test_out_of_service_states(state, failed_step, out):
    assert HostRecord(host="h", batch=0, state=state, failed_step=failed_step).out_of_service is out


def test_hosts_down_or_drained_before_the_run_count_as_out_of_service():
    rec = record(a="installing", b="pending", c="done")
    rec.unavailable_before = {"c": "drained before the run (slurm)", "x": "unreachable"}
    assert rec.out_of_service() == {"a", "c", "x"}


def test_a_host_drained_before_the_run_counts_by_its_own_step_once_the_run_owns_its_drain():
    # b: drained by an earlier run this one took over; done and resumed, it is back in service
    rec = record(a="installing", b="pending")
    rec.unavailable_before = {"b": "drained by run R0, which did not finish"}
    assert rec.out_of_service() == {"a", "b"}
    rec.hosts["b"].drained_by_run = True
    rec.hosts["b"].state = "rebooting"
    assert rec.out_of_service() == {"a", "b"}
    rec.hosts["b"].state = "done"
    assert rec.out_of_service() == {"a"}


def test_the_record_round_trips_through_json():
    rec = record(a="rebooting", b="pending")
    rec.hosts["a"].silence_ids = ["s1", "s2"]
    rec.hosts["a"].history = [["draining", 1.0]]
    again = RunRecord.from_json(json.loads(json.dumps(rec.to_json())))
    assert again == rec


def test_a_state_file_of_another_schema_is_refused(tmp_path):
    data = record(a="pending").to_json()
    data["schema"] = 99
    with pytest.raises(InputError, match="schema"):
        RunRecord.from_json(data)


def test_save_writes_the_file_0600_and_leaves_no_temporary(tmp_path):
    store = StateStore.create(record(a="pending"), tmp_path)
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    assert [p.name for p in store.dir.iterdir()] == ["state.json"]
    assert store.load().hosts["a"].state == "pending"


def test_a_crash_while_saving_leaves_the_previous_state_whole(tmp_path, monkeypatch):
    rec = record(a="pending")
    store = StateStore.create(rec, tmp_path)
    rec.hosts["a"].state = "installing"

    def crash(src, dst):
        raise OSError("power cut")

    monkeypatch.setattr(st.os, "replace", crash)
    with pytest.raises(OSError, match="power cut"):
        store.save(rec)
    monkeypatch.undo()
    assert store.load().hosts["a"].state == "pending"
    assert [p.name for p in store.dir.iterdir()] == ["state.json"]  # temporary removed


def test_every_save_is_a_new_complete_file(tmp_path):
    rec = record(a="pending")
    store = StateStore.create(rec, tmp_path)
    before = os.stat(store.path).st_ino
    rec.hosts["a"].state = "draining"
    store.save(rec)
    assert os.stat(store.path).st_ino != before  # renamed over, never rewritten in place
    assert store.load().hosts["a"].state == "draining"


def test_a_run_is_found_by_id_or_by_directory(tmp_path):
    store = StateStore.create(record(a="pending"), tmp_path)
    assert StateStore.find("r1", tmp_path).path == store.path
    assert StateStore.find(str(store.dir)).path == store.path
    with pytest.raises(InputError) as exc:
        StateStore.find("nope", tmp_path)
    assert exc.value.key == "--resume"


def test_the_state_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(st.STATE_DIR_ENV, str(tmp_path / "runs"))
    assert st.state_root() == tmp_path / "runs"
    monkeypatch.delenv(st.STATE_DIR_ENV)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert st.state_root() == tmp_path / "xdg" / "gpumon-deploy" / "runs"


def test_a_second_controller_on_the_same_run_is_refused(tmp_path):
    store = StateStore.create(record(a="pending"), tmp_path)
    other = StateStore(store.dir)
    with store.locked(), pytest.raises(InputError, match="another controller"), other.locked():
        pass
    with other.locked():  # released when the first one ends
        pass


def test_the_runs_lock_names_its_controller_by_pid_while_held_and_nobody_after(tmp_path):
    # status reads the pid where /proc/locks cannot be read (deployer/monitoring/rollouts.py)
    store = StateStore.create(record(a="pending"), tmp_path)
    lock = store.dir / st.LOCK_FILE
    with store.locked():
        assert lock.read_text() == str(os.getpid())
        assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    assert lock.read_text() == ""  # no pid left to be reused by another process


def test_run_ids_name_the_target_and_sort_by_time():
    a = st.new_run_id("580.126.20", now=1_800_000_000)
    b = st.new_run_id("580.126.20", now=1_800_000_060)
    assert "580.126.20" in a and a < b


def test_the_runs_options_are_read_back_from_the_state_file_as_they_were_written(tmp_path):
    options = RolloutOptions(
        limit="gpu:!gpu04", extra_vars=("dcgm_version=4.5.3",), canary=2, batch_size="25%",
        max_unavailable="2", max_failures=3, drain="command", drain_command="d {host} {action}",
        drain_host="mon01", job_timeout=900, reboot="never", silence_minutes=60, diag_level=3,
    ).for_hosts(8)  # fmt: skip
    rec = record(g1="pending")
    rec.options = options
    store = StateStore.create(rec, tmp_path)
    assert store.load().options == options
    saved = json.loads(store.path.read_text())["options"]
    assert saved["batch_size_hosts"] == 2 and saved["max_unavailable_hosts"] == 2
    assert saved["extra_vars"] == ["dcgm_version=4.5.3"]
