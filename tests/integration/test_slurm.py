"""``upgrade-driver --drain slurm`` against the lab's real Slurm 22.05 (``lab slurm``: slurmctld on
mon01, slurmd on the GPU hosts), with real batch jobs holding the hosts' (simulated) GPUs.

The module converges gpu01-gpu03 at driver 580.65.06 and the monitoring tier, brings Slurm up,
then:

- a job holding two GPUs of gpu01 delays it: the run drains it (Slurm says "draining" with the
  run's reason while the job runs), a job asking for gpu01 stays pending while a job for the
  partition lands on gpu02, and the host's services stop and it reboots only after the job
  ended (boot count +1, a new boot id); the pending job runs once the run resumed the node;
- a job outliving ``--job-timeout`` fails its host (exit 1): never stopped nor rebooted, the
  driver unchanged, the node given back to Slurm with the job still running;
- an administrator's drain survives a rollout: one set before the run (gpu02) and one set while
  the run held the node (gpu01) are both still there, with their reasons, after the upgrade;
- with no scheduler hook at all (``--drain none``), the GPU-process guard alone keeps gpu03 from
  rebooting under a Slurm job whose process nvidia-smi lists (the simulation's ``gpu-jobs``
  fault, given the job's real pid; the simulation lists a pid until it is cleared, so the test
  clears it when Slurm says the job ended, as the driver would drop the process);
- two controllers (each its own run records and run lock): the second refuses gpu03, which the
  first's run drained, while that run waits on a job and after its controller was killed (exit 2,
  naming the run and ``--take-over``, the node and driver untouched); with ``--take-over RUN``
  it upgrades gpu03 under ``--max-unavailable 1`` (the drained node needs no place of its own)
  and gives the node back.

Set ``GPUMON_SLURM_LAB=<name>`` to run against a lab that is already up (development).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deployer.lab import Lab
from deployer.lab import slurm as labslurm
from tests.integration import labtools
from tests.integration.labtools import CLI, lab_named_by, run_cli

pytestmark = pytest.mark.lab

BASELINE = "580.65.06"
GPU_HOSTS = ("gpu01", "gpu02", "gpu03")
DRAIN = ("--drain", "slurm", "--drain-host", "mon01")
RUN_REASON = "gpumon-deploy upgrade-driver run "
HOLD = "/root/gpumon-test-hold.sh"
# A batch job that holds its GPUs for $1 seconds and says when (the machine's clock: the lab's
# hosts and the controller share it).
HOLD_SCRIPT = """#!/bin/sh
echo "start $(date +%s.%N) pid=$$ gpus=$SLURM_JOB_GPUS"
sleep "$1"
echo "end $(date +%s.%N)"
"""

# squeue's states of a job that still holds its node (the others: it ended, or it left the queue)
HOLDING = ("RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING", "STOPPED", "SIGNALING", "PENDING")

gpumon = functools.partial(run_cli, timeout=1500)
wait_until = functools.partial(labtools.wait_until, every=1.0)


def sh(lab: Lab, host: str, command: str) -> str:
    proc = lab.ssh(host, command, timeout=120)
    assert proc.returncode == 0, f"{host}: {command}: {proc.stderr[-500:]}"
    return proc.stdout


def slurm_nodes(lab: Lab) -> dict[str, dict[str, str]]:
    return labslurm.parse_sinfo_nodes(sh(lab, "mon01", labslurm.SINFO_NODES))


def boots(lab: Lab, host: str) -> int:
    return lab.status()["hosts"][host]["boots"]


def boot_id(lab: Lab, host: str) -> str:
    return sh(lab, host, "cat /proc/sys/kernel/random/boot_id").strip()


def loaded(lab: Lab, host: str) -> str:
    return sh(lab, host, "grep -m1 NVRM /proc/driver/nvidia/version | "
              "grep -oE '[0-9]+\\.[0-9]+\\.[0-9]+' | head -1").strip()  # fmt: skip


class Job:
    """A batch job submitted on mon01 (the login node) that holds GPUs for a while."""

    def __init__(self, lab: Lab, seconds: int, *sbatch: str) -> None:
        self.lab = lab
        out = sh(lab, "mon01", f"sbatch --parsable -o /var/tmp/gpumon-test-%j.out "
                 f"{' '.join(sbatch)} {HOLD} {seconds}")  # fmt: skip
        self.id = out.strip().split(";")[0]
        words = " ".join(sbatch).split()
        self.node = words[words.index("-w") + 1] if "-w" in words else ""  # else: from squeue

    def state(self) -> tuple[str, str]:
        """(state, reason) as squeue says; ("", "") once the job left the queue."""
        out = sh(self.lab, "mon01", f"squeue -h -j {self.id} -o '%T|%r|%N' 2>/dev/null || true")
        state, _, rest = out.strip().partition("|")
        reason, _, node = rest.partition("|")
        if node:
            self.node = node
        return state, reason

    def wait_state(self, state: str, timeout: float = 60) -> None:
        wait_until(f"job {self.id} {state}", lambda: self.state()[0] == state, timeout)

    def wait_running(self, timeout: float = 60) -> None:
        """Running, and its script has started (its output names its pid)."""
        self.wait_state("RUNNING", timeout)
        wait_until(f"job {self.id}'s output", lambda: "pid" in self._output_or_none(), 30)

    def ended(self) -> bool:
        return self.state()[0] not in HOLDING

    def wait_gone(self, timeout: float) -> None:
        wait_until(f"job {self.id} to end", self.ended, timeout)

    def _output_or_none(self) -> dict[str, str]:
        try:
            return self.output()
        except AssertionError:
            return {}

    def output(self) -> dict[str, str]:
        """start, end (unix times), pid, gpus of the job, from its output file on its node."""
        text = sh(self.lab, self.node, f"cat /var/tmp/gpumon-test-{self.id}.out")
        fields: dict[str, str] = {}
        for line in text.splitlines():
            word, *rest = line.split()
            fields[word] = rest[0] if rest else ""
            for kv in rest[1:]:
                k, _, v = kv.partition("=")
                fields[k] = v
        return fields

    def cancel(self) -> None:
        self.lab.ssh("mon01", f"scancel {self.id}", timeout=30)


class GpuProcesses(threading.Thread):
    """The job's process on its GPUs as nvidia-smi lists it (the simulation's gpu-jobs fault
    with the job's real pid), cleared as soon as Slurm says the job ended. ``cleared_at``: when
    the clearing began, so nothing can have seen the GPUs free before it (``heal`` removes the
    fault first, then waits for the host: a rollout polling the GPUs moves on in between)."""

    def __init__(self, lab: Lab, job: Job) -> None:
        super().__init__(daemon=True)
        self.lab, self.job = lab, job
        info = job.output()
        for gpu in info["gpus"].split(","):
            lab.fault(job.node, "gpu-jobs", gpu=int(gpu), value=int(info["pid"]))
        self.cleared_at: float | None = None
        self.start()

    def run(self) -> None:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and not self.job.ended():
            time.sleep(1.0)
        self.cleared_at = time.time()
        self.lab.heal(self.job.node)


class Rollout:
    """``upgrade-driver`` running in the background, its JSON report when it ends."""

    def __init__(
        self, inventory: str, state_dir: Path, *args: str, controller: bool = False
    ) -> None:
        """``controller``: a controller of its own, its run lock beside its run records in
        ``state_dir`` (another machine's, to the lab)."""
        self.out = state_dir / "stdout.json"
        self.err = state_dir / "stderr.txt"
        env = {**os.environ, "GPUMON_ROLLOUT_STATE_DIR": str(state_dir / "runs")}
        if controller:
            env["GPUMON_LOCK_DIR"] = str(state_dir / "locks")
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [*CLI, "upgrade-driver", "-i", inventory, "--output", "json", *args],
                env=env,
                stdout=out,
                stderr=err,
            )

    def finish(self, timeout: float = 900) -> tuple[int, dict, str]:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        stderr = self.err.read_text()
        text = self.out.read_text()
        return rc, (json.loads(text) if text.strip() else {}), stderr


def entered(host_report: dict, step: str) -> float:
    return next(t for s, t in host_report["history"] if s == step)


@pytest.fixture(scope="module")
def slab(request) -> Lab:
    return lab_named_by("GPUMON_SLURM_LAB", request)


@pytest.fixture(scope="module")
def baseline(slab) -> str:
    """GPU hosts at 580.65.06, the monitoring tier converged, the lab's Slurm up."""
    for h in GPU_HOSTS:
        slab.heal(h)
    inv = str(slab.inventory_path)
    proc = gpumon(
        "up", "-i", inv, "--limit", ":".join(GPU_HOSTS), "-e", f"nvidia_driver_version={BASELINE}",
        "-e", "nvidia_driver_reboot=if_required", "--out-of-service",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    proc = gpumon("up", "-i", inv, "--limit", "prometheus:alertmanager:thanos_query")
    assert proc.returncode == 0, proc.stderr[-4000:]
    proc = run_cli("lab", "slurm", "--name", slab.name, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sh(slab, "mon01", f"cat > {HOLD} <<'EOF'\n{HOLD_SCRIPT}EOF\nchmod 0755 {HOLD}")
    return inv


@pytest.fixture
def cluster(slab, baseline) -> Iterator[Lab]:
    """Every test starts and ends with no job and every node in service."""
    yield slab
    slab.ssh("mon01", "scancel --user=root; sleep 1", timeout=60)
    for h in GPU_HOSTS:
        slab.ssh("mon01", f"scontrol update nodename={h} state=resume", timeout=30)
        slab.heal(h)
    wait_until(
        "every node idle",
        lambda: all(slurm_nodes(slab)[h]["state"] == "idle" for h in GPU_HOSTS),
        120,
    )


def test_lab_status_shows_the_nodes_slurm_states(cluster):
    proc = run_cli("lab", "status", "--name", cluster.name, "--json", timeout=120)
    info = json.loads(proc.stdout)["slurm"]
    assert info["controller"] == "mon01"
    assert {h: n["state"] for h, n in info["nodes"].items() if h in GPU_HOSTS} == {
        h: "idle" for h in GPU_HOSTS
    }
    gres = sh(cluster, "mon01", "sinfo -h -N -n gpu01 -o '%G'").split()[0]
    assert gres == "gpu:h100:8"


def test_a_job_on_a_host_delays_it_until_the_job_ends_and_no_new_job_lands_there(
    cluster, baseline, tmp_path
):
    job = Job(cluster, 45, "-w gpu01 --gres=gpu:2")
    job.wait_running()
    GpuProcesses(cluster, job)
    boots_before, boot_before = boots(cluster, "gpu01"), boot_id(cluster, "gpu01")
    run = Rollout(baseline, tmp_path, "--to", "580.126.20", "--limit", "gpu01", *DRAIN,
                  "--job-timeout", "300")  # fmt: skip

    wait_until(
        "gpu01 draining with the run's reason",
        lambda: (
            (s := slurm_nodes(cluster)["gpu01"])["state"] == "draining"
            and s["reason"].startswith(RUN_REASON)
        ),
        60,
    )
    assert job.state()[0] == "RUNNING"
    waiting = Job(cluster, 1, "-w gpu01 --gres=gpu:1")
    elsewhere = Job(cluster, 30, "-p train --gres=gpu:1")
    elsewhere.wait_state("RUNNING")
    assert elsewhere.node == "gpu02"
    state, why = waiting.state()
    assert state == "PENDING" and "ReqNodeNotAvail" in why
    assert boots(cluster, "gpu01") == boots_before  # not rebooted under the job

    rc, report, stderr = run.finish()
    assert rc == 0, stderr[-3000:]
    gpu01 = report["hosts"]["gpu01"]
    assert gpu01["state"] == "done"
    ended = float(job.output()["end"])
    assert entered(gpu01, "draining") < ended < entered(gpu01, "waiting_jobs")
    assert ended < entered(gpu01, "stopping") < entered(gpu01, "rebooting")
    assert boots(cluster, "gpu01") == boots_before + 1 and boot_id(cluster, "gpu01") != boot_before
    assert loaded(cluster, "gpu01") == "580.126.20"
    assert slurm_nodes(cluster)["gpu01"]["reason"] == ""
    waiting.wait_gone(60)
    assert float(waiting.output()["start"]) >= entered(gpu01, "undraining")


def test_a_job_outliving_the_job_timeout_fails_its_host_which_is_never_touched(
    cluster, baseline, tmp_path
):
    job = Job(cluster, 600, "-w gpu01 --gres=gpu:1")
    job.wait_running()
    boots_before, driver_before = boots(cluster, "gpu01"), loaded(cluster, "gpu01")
    run = Rollout(baseline, tmp_path, "--to", "595", "--limit", "gpu01", *DRAIN,
                  "--job-timeout", "20")  # fmt: skip
    rc, report, stderr = run.finish(300)
    assert rc == 1, stderr[-3000:]
    gpu01 = report["hosts"]["gpu01"]
    assert (gpu01["state"], gpu01["failed_step"]) == ("failed", "draining")
    assert f"job {job.id} (root, RUNNING)" in gpu01["reason"] and "--job-timeout" in gpu01["reason"]
    assert [s for s, _ in gpu01["history"]] == ["draining", "failed"]
    assert "FAILED gpu01" in stderr and "returned to the scheduler" in stderr
    assert boots(cluster, "gpu01") == boots_before
    assert loaded(cluster, "gpu01") == driver_before
    node = slurm_nodes(cluster)["gpu01"]
    # back in service (a trailing * is Slurm's "not responding" flag: slurmd late with its
    # heartbeat on a loaded machine, not a state the run set)
    assert node["state"].rstrip("*") in ("mixed", "allocated") and node["reason"] == ""
    assert job.state()[0] == "RUNNING"


def test_an_administrator_s_drain_before_or_during_the_run_survives_it(cluster, baseline, tmp_path):
    cluster.ssh("mon01", "scontrol update nodename=gpu02 state=drain reason='RMA 4711: fan'")
    # gpu02 is out of service before the run: --max-unavailable 2 lets gpu01 go too
    run = Rollout(baseline, tmp_path, "--to", "595", "--limit", "gpu01:gpu02", *DRAIN,
                  "--max-unavailable", "2")  # fmt: skip
    wait_until(
        "gpu01 drained by the run",
        lambda: slurm_nodes(cluster)["gpu01"]["reason"].startswith(RUN_REASON),
        120,
    )
    sh(cluster, "mon01", "scontrol update nodename=gpu01 state=drain reason='XID 79 in burn-in'")
    rc, report, stderr = run.finish()
    assert rc == 0, stderr[-3000:]
    assert {h: report["hosts"][h]["state"] for h in ("gpu01", "gpu02")} == {
        "gpu01": "done", "gpu02": "done",
    }  # fmt: skip
    assert loaded(cluster, "gpu01") == loaded(cluster, "gpu02") == "595.45.04"
    nodes = slurm_nodes(cluster)
    assert (nodes["gpu02"]["state"], nodes["gpu02"]["reason"]) == ("drained", "RMA 4711: fan")
    assert (nodes["gpu01"]["state"], nodes["gpu01"]["reason"]) == ("drained", "XID 79 in burn-in")
    assert "left drained: it was drained before the run" in report["hosts"]["gpu02"]["notes"]
    assert any("drained again during the run by someone else" in n
               for n in report["hosts"]["gpu01"]["notes"])  # fmt: skip


def test_without_a_drain_hook_the_gpu_process_guard_waits_for_a_slurm_job(
    cluster, baseline, tmp_path
):
    job = Job(cluster, 30, "-p infer -w gpu03 --gres=gpu:1")
    job.wait_running()
    guard = GpuProcesses(cluster, job)
    pid = job.output()["pid"]
    smi = sh(cluster, "gpu03", "nvidia-smi --query-compute-apps=pid --format=csv,noheader")
    assert pid in smi.split()
    boots_before = boots(cluster, "gpu03")
    run = Rollout(baseline, tmp_path, "--to", "580.126.20", "--limit", "gpu03",
                  "--drain", "none", "--job-timeout", "300")  # fmt: skip
    rc, report, stderr = run.finish()
    assert rc == 0, stderr[-3000:]
    gpu03 = report["hosts"]["gpu03"]
    guard.join(30)
    assert guard.cleared_at is not None
    assert float(job.output()["end"]) < guard.cleared_at < entered(gpu03, "silencing")
    assert entered(gpu03, "waiting_jobs") < float(job.output()["end"])
    assert guard.cleared_at < entered(gpu03, "rebooting")
    assert boots(cluster, "gpu03") == boots_before + 1


def test_a_node_another_controller_s_run_drained_is_left_to_it_until_that_run_is_named(
    cluster, baseline, tmp_path
):
    """Two controllers, each with its own run records and run lock (``GPUMON_ROLLOUT_STATE_DIR``,
    ``GPUMON_LOCK_DIR``):
    the second finds gpu03 drained by the first's run, which it has no record of, and refuses,
    while that run drives it and after its controller died; named with ``--take-over``, the run
    is taken over and the node upgraded and given back."""
    job = Job(cluster, 900, "-p infer -w gpu03 --gres=gpu:1")
    job.wait_running()
    boots_before, driver_before = boots(cluster, "gpu03"), loaded(cluster, "gpu03")
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first_dir.mkdir()
    second_dir.mkdir()
    upgrade = ("--to", "595", "--limit", "gpu03", *DRAIN)
    first = Rollout(baseline, first_dir, *upgrade, "--job-timeout", "900", controller=True)
    wait_until(
        "gpu03 draining with the first controller's run",
        lambda: slurm_nodes(cluster)["gpu03"]["reason"].startswith(RUN_REASON),
        120,
    )
    reason = slurm_nodes(cluster)["gpu03"]["reason"]
    run_id = reason.removeprefix(RUN_REASON).partition(":")[0]

    def second(*more: str, timeout: float = 300) -> tuple[int, dict, str]:
        return Rollout(baseline, second_dir, *upgrade, *more, controller=True).finish(timeout)

    rc, _, stderr = second()
    assert rc == 2, stderr[-3000:]
    assert (
        f"gpu03: node 'gpu03' is drained by upgrade-driver run {run_id}, which this controller "
        "has no record of" in stderr
    )
    assert f"--take-over {run_id}" in stderr and "the hosts were only read" in stderr
    assert first.proc.poll() is None  # the first run still waits on the job, undisturbed
    assert slurm_nodes(cluster)["gpu03"]["reason"] == reason

    first.proc.kill()  # its controller gone
    first.proc.wait(30)
    sh(cluster, "mon01", f"scancel {job.id}")
    job.wait_gone(60)
    rc, _, stderr = second()  # dead or alive, the second controller cannot tell
    assert rc == 2 and f"--take-over {run_id}" in stderr, stderr[-3000:]
    assert slurm_nodes(cluster)["gpu03"]["reason"] == reason
    assert (boots(cluster, "gpu03"), loaded(cluster, "gpu03")) == (boots_before, driver_before)

    rc, report, stderr = second("--take-over", run_id, timeout=900)
    assert rc == 0, stderr[-3000:]
    gpu03 = report["hosts"]["gpu03"]
    assert gpu03["state"] == "done"
    assert any(f"drained by run {run_id}" in n for n in gpu03["notes"]), gpu03["notes"]
    assert boots(cluster, "gpu03") == boots_before + 1
    assert loaded(cluster, "gpu03") == "595.45.04"
    node = slurm_nodes(cluster)["gpu03"]
    assert (node["state"].rstrip("*"), node["reason"]) == ("idle", "")
