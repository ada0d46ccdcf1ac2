"""Single steps of the rollout against scripted hosts: drain remembers a node drained before the
run (and never resumes it; the drain's owner: test_rollout_slurm_drain.py), the GPU-job wait is bounded, silences are not duplicated when a step
is repeated, the reboot step reboots only when the loaded module is not the target, and the
validated target is recorded on the host."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest

from deployer.connection import ConnectionPool, ScriptedConnection
from deployer.gpu import driver_record
from deployer.hostaccess import HostAccess
from deployer.monitoring import tier as monitoring_tier
from deployer.monitoring.http import Response
from deployer.monitoring.silences import Silences
from deployer.results import RunReport, Status, TaskResult
from deployer.rollout.controller import LOADED_CHECK_TAG, Rollout, StepFailed
from deployer.rollout.drain import SlurmDrain
from deployer.rollout.options import RolloutOptions
from deployer.rollout.state import HostRecord, RunRecord, StateStore
from deployer.session import DeploySession, RunOptions
from tests.unit.slurmfake import FakeSlurm

INVENTORY = "all:\n  children:\n    gpu:\n      hosts:\n        g1: {ansible_host: 10.0.0.1}\n"


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def rollout(tmp_path, *, host_conn=None, drain_conn=None, silences=None, reboot="auto"):
    inv = tmp_path / "inventory.yml"
    inv.write_text(INVENTORY)
    rec = RunRecord(
        run_id="R1",
        inventory=str(inv),
        target={"requested": "580", "branch": "580", "version": "580.126.20", "listed": True},
        options=RolloutOptions(
            max_unavailable_hosts=1, max_failures=1, canary=1, reboot=reboot, job_timeout=30
        ),
        batches=[["g1"]],
        hosts={"g1": HostRecord(host="g1", batch=0, before={"driver_installed": "570.133.20"})},
    )
    clock = Clock()

    def wait(seconds: float) -> None:
        clock.t += seconds

    r = Rollout(
        record=rec,
        store=StateStore.create(rec, tmp_path / "runs"),
        targets={
            "g1": SimpleNamespace(
                variables={}, before={"driver_installed": "570.133.20"}, address="10.0.0.1"
            )
        },
        hook=SlurmDrain(),
        tier=monitoring_tier.MonitoringTier(),
        session=DeploySession.load(RunOptions(inventory=inv), plan=False),
        drain_connection=lambda: drain_conn,
        silences=silences,
        clock=clock,
        sleep=wait,
        access=lambda host: HostAccess(
            host, ConnectionPool(lambda h: host_conn), clock=clock, sleep=wait
        ),
    )
    return r


def test_a_node_drained_before_the_run_is_not_drained_again_nor_resumed(tmp_path):
    slurm = FakeSlurm("g1")
    slurm.admin_drain("g1", "fan replaced, burn-in pending")
    r = rollout(tmp_path, drain_conn=slurm)
    r._step_draining("g1")
    r._step_undraining("g1")
    assert r.record.hosts["g1"].was_drained is True
    assert slurm.scontrol() == []
    assert "left drained: it was drained before the run" in r.record.hosts["g1"].notes


def test_a_node_the_run_drained_is_resumed_and_the_reason_names_the_run(tmp_path):
    slurm = FakeSlurm("g1")
    r = rollout(tmp_path, drain_conn=slurm)
    r._step_draining("g1")
    r._step_undraining("g1")
    rec = r.store.load().hosts["g1"]
    assert (rec.was_drained, rec.drained_by_run) == (False, True)
    assert slurm.scontrol() == [
        "scontrol update nodename=g1 state=drain "
        "reason='gpumon-deploy upgrade-driver run R1: driver 570.133.20 -> 580.126.20'",
        "scontrol update nodename=g1 state=resume",
    ]
    assert slurm.nodes["g1"].state == "idle"


def test_a_failing_drain_fails_the_host_with_the_scheduler_s_words(tmp_path):
    drain = (
        ScriptedConnection()
        .on("sinfo", 0, "idle|none\n")
        .on("scontrol", 1, "", "Invalid node name g1")
    )
    with pytest.raises(StepFailed, match="Invalid node name g1"):
        rollout(tmp_path, drain_conn=drain)._step_draining("g1")


def test_the_gpu_job_wait_ends_when_the_jobs_end(tmp_path):
    answers = iter([(3, "4242, python3, 1024 MiB\n"), (3, "4242, python3, 1024 MiB\n"), (0, "")])

    class Jobs(ScriptedConnection):
        def run(self, command, *, stdin=None, timeout=None):
            self.commands.append(command)
            rc, out = next(answers)
            return SimpleNamespace(rc=rc, stdout=out, stderr="")

    host = Jobs()
    rollout(tmp_path, host_conn=host)._step_waiting_jobs("g1")
    assert len(host.commands) == 3


def test_the_gpu_job_wait_is_bounded_and_names_the_processes(tmp_path):
    host = ScriptedConnection(default=(3, "4242, python3, 1024 MiB\n", ""))
    with pytest.raises(StepFailed, match=r"still running after 30s: 4242, python3"):
        rollout(tmp_path, host_conn=host)._step_waiting_jobs("g1")


class AM:
    def __init__(self) -> None:
        self.posts = 0
        self.silences: list[dict] = []

    def __call__(self, method, url, body):
        if method == "POST":
            self.posts += 1
            sil = {**json.loads(body), "id": f"s{self.posts}", "status": {"state": "active"}}
            self.silences.append(sil)
            return Response(200, json.dumps({"silenceID": sil["id"]}))
        if method == "GET" and url.endswith("/silences"):
            return Response(200, json.dumps(self.silences))
        return Response(200, "")


def test_silencing_twice_creates_each_silence_once(tmp_path):
    am = AM()
    r = rollout(tmp_path, silences=Silences(["http://am1:9093"], am))
    r._step_silencing("g1")
    r._step_silencing("g1")  # a resumed run repeating the step
    assert am.posts == 2  # node= and instance=~, once each
    assert r.store.load().hosts["g1"].silence_ids == ["s1", "s2"]
    assert {m["name"] for s in am.silences for m in s["matchers"]} == {"node", "instance"}
    assert all("run R1" in s["comment"] for s in am.silences)


def test_no_reboot_when_the_target_module_is_already_loaded(tmp_path):
    host = ScriptedConnection().on("boot_id", 0, "boot-1\n").on("nvidia/version", 0, "580.126.20\n")
    rollout(tmp_path, host_conn=host)._step_rebooting("g1")
    assert not any("systemctl reboot" in c for c in host.commands)


def test_reboot_never_reloads_the_modules_and_fails_when_that_cannot_load_the_target(tmp_path):
    host = (
        ScriptedConnection()
        .on("rmmod", 1, "", "module nvidia_uvm is in use (refcnt 2): reboot instead")
        .on("boot_id", 0, "boot-1\n")
        .on("nvidia/version", 0, "570.133.20\n")
    )
    with pytest.raises(StepFailed, match="reboot the host or use --reboot auto"):
        rollout(tmp_path, host_conn=host, reboot="never")._step_rebooting("g1")
    assert not any("systemctl reboot" in c for c in host.commands)


def test_reboot_always_does_not_reboot_twice_when_resumed_after_the_reboot(tmp_path):
    host = ScriptedConnection().on("boot_id", 0, "boot-2\n").on("nvidia/version", 0, "580.126.20\n")
    r = rollout(tmp_path, host_conn=host, reboot="always")
    r.record.hosts["g1"].notes.append("boot before reboot: boot-1")
    r._step_rebooting("g1")
    assert not any("systemctl reboot" in c for c in host.commands)


def test_recording_writes_the_validated_target_and_what_the_inventory_said(tmp_path):
    host = ScriptedConnection()
    r = rollout(tmp_path, host_conn=host)
    r.record.hosts["g1"].inventory_driver = {"version": "570.133.20", "branch": None}
    r._step_recording("g1")
    (command,) = host.commands
    # the command itself, run by a real shell into a scratch directory, leaves a readable record
    scratch = tmp_path / "host"
    subprocess.run(["bash", "-c", command.replace("/var/lib/gpumon", str(scratch))], check=True)
    record = driver_record.parse((scratch / "nvidia-driver.json").read_text())
    assert record is not None
    assert (record.version, record.branch, record.run_id) == ("580.126.20", "580", "R1")
    assert record.inventory == {"version": "570.133.20", "branch": None}
    assert record.describes({"nvidia_driver_version": "570.133.20"})
    assert not list(scratch.glob("*.tmp"))


def test_a_record_that_cannot_be_written_fails_the_host(tmp_path):
    host = ScriptedConnection(default=(1, "", "mkdir: cannot create directory: Read-only"))
    with pytest.raises(StepFailed, match="recording the driver on the host failed: mkdir"):
        rollout(tmp_path, host_conn=host)._step_recording("g1")


class Rebooting(ScriptedConnection):
    """A host whose boot id changes once the reboot command ran (after one unanswered probe)."""

    def __init__(self) -> None:
        super().__init__(name="g1")
        self.rebooted = False
        self.probes = 0

    def run(self, command, *, stdin=None, timeout=None):
        self.commands.append(command)
        if "systemctl reboot" in command:
            self.rebooted = True
        if "nvidia/version" in command:
            return SimpleNamespace(rc=0, stdout="570.133.20\n", stderr="")
        if "boot_id" in command:
            if self.rebooted:
                self.probes += 1
            boot = "boot-2" if self.rebooted and self.probes > 1 else "boot-1"
            state = "\nrunning" if "is-system-running" in command else ""
            return SimpleNamespace(rc=0, stdout=f"{boot}{state}\n", stderr="")
        return SimpleNamespace(rc=0, stdout="", stderr="")


def test_the_reboot_step_reboots_and_waits_for_the_new_boot(tmp_path):
    host = Rebooting()
    r = rollout(tmp_path, host_conn=host)
    r._step_rebooting("g1")
    assert sum("systemctl reboot" in c for c in host.commands) == 1
    assert host.probes >= 2
    assert "boot before reboot: boot-1" in r.record.hosts["g1"].notes


def test_a_host_that_does_not_come_back_fails_the_reboot_step_within_its_timeout(tmp_path):
    host = (
        ScriptedConnection()
        .on("is-system-running", 0, "boot-1\nrunning\n")
        .on("boot_id", 0, "boot-1\n")
        .on("nvidia/version", 0, "570.133.20\n")
    )
    r = rollout(tmp_path, host_conn=host)
    r.targets["g1"].variables["nvidia_driver_reboot_timeout"] = 20
    with pytest.raises(StepFailed, match=r"not back within 20s: still running the old boot"):
        r._step_rebooting("g1")


def converged(*failed: tuple[str, frozenset[str]]) -> RunReport:
    report = RunReport()
    for name, tags in failed:
        report.host("g1").tasks.append(
            TaskResult("g1", "nvidia_driver", name, "command", Status.FAILED, error="x", tags=tags)
        )
    return report


def test_installing_accepts_the_one_failure_of_the_task_tagged_as_the_loaded_driver_check(tmp_path):
    r = rollout(tmp_path)
    r._converge = lambda host: converged(("any name at all", frozenset({LOADED_CHECK_TAG})))
    r._step_installing("g1")  # the reboot step comes next


def test_installing_fails_on_a_failure_of_any_other_task_whatever_its_name(tmp_path):
    r = rollout(tmp_path)
    r._converge = lambda host: converged(
        ("the loaded kernel module is driver 580.126.20", frozenset({"nvidia_driver"}))
    )
    with pytest.raises(StepFailed, match="converge failed at nvidia_driver"):
        r._step_installing("g1")
