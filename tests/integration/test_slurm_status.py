"""``gpumon-deploy status`` with Slurm, against the lab's real Slurm 22.05 (``lab slurm``: slurmctld
on mon01, slurmd on the GPU hosts) and the lab's monitoring tier, with real batch jobs:

- a job holding GPUs that stay idle in the metrics is listed on its node, by job and GPU index,
  and does not fail status;
- GPUs busy in the metrics (the simulation's ``gpu-jobs`` fault: a process with memory on the
  GPU) on a node where Slurm allocated nothing fail status, the MIG GPU of gpu05 once (not once
  per GPU instance);
- a node drained by a rollout is ok while the rollout runs, and a failure naming the run and how
  to resume it once its controller died (killed) leaving the node drained;
- an administrator's drain is shown with its reason and is not a failure.

The window over which GPUs count as busy or idle is 20 s here (``gpumon_slurm_gpu_window``;
10 minutes by default): the training tier is scraped every 5 s, the inference tier (gpu05) every
30 s, and the rules evaluate every 15 s, so a state shows within about a minute.

Set ``GPUMON_SLURM_LAB=<name>`` to run against a lab that is already up (development).
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployer.lab import Lab
from deployer.lab import slurm as labslurm
from tests.integration import labtools
from tests.integration.labtools import CLI, lab_named_by, run_cli

pytestmark = pytest.mark.lab

GPU_HOSTS = ("gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "gpu06")
WINDOW = "20s"
SLURM_VARS = (
    "-e", "gpumon_scheduler=slurm", "-e", "gpumon_slurm_host=mon01",
    "-e", f"gpumon_slurm_gpu_window={WINDOW}",
)  # fmt: skip
RUN_REASON = "gpumon-deploy upgrade-driver run "
HOLD = "/root/gpumon-status-hold.sh"
USE = "GPU use = Slurm allocation"

gpumon = functools.partial(run_cli, timeout=1800)
wait_until = functools.partial(labtools.wait_until, every=3.0)


def sh(lab: Lab, host: str, command: str) -> str:
    proc = lab.ssh(host, command, timeout=120)
    assert proc.returncode == 0, f"{host}: {command}: {proc.stderr[-500:]}"
    return proc.stdout


def slurm_nodes(lab: Lab) -> dict[str, dict[str, str]]:
    return labslurm.parse_sinfo_nodes(sh(lab, "mon01", labslurm.SINFO_NODES))


def submit(lab: Lab, seconds: int, *sbatch: str) -> str:
    out = sh(lab, "mon01", f"sbatch --parsable -o /dev/null {' '.join(sbatch)} {HOLD} {seconds}")
    job = out.strip().split(";")[0]
    wait_until(
        f"job {job} running",
        lambda: sh(lab, "mon01", f"squeue -h -j {job} -o %T").strip() == "RUNNING",
        60,
    )
    return job


def job_gpus(lab: Lab, job: str, node: str) -> set[int]:
    """The GPU indexes Slurm gave ``job`` on ``node`` (scontrol's job detail)."""
    line = sh(lab, "mon01", f"scontrol show job -d -o {job}")
    m = re.search(rf"Nodes={node} CPU_IDs=\S* Mem=\d+ GRES=gpu:[^(]*\(IDX:([0-9,-]+)\)", line)
    assert m, line
    out: set[int] = set()
    for part in m.group(1).split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


class Status:
    """``status --output json`` with the Slurm variables; the rows of component slurm."""

    def __init__(self, inventory: str, state_dir: Path) -> None:
        self.inventory, self.state_dir = inventory, state_dir
        self.last: subprocess.CompletedProcess[str] | None = None

    def run(self) -> dict[tuple[str, str], dict[str, Any]]:
        self.last = run_cli(
            "status", "-i", self.inventory, *SLURM_VARS, "--output", "json",
            timeout=300, env={"GPUMON_ROLLOUT_STATE_DIR": str(self.state_dir)},
        )  # fmt: skip
        assert self.last.returncode in (0, 1, 3), self.last.stderr[-3000:]
        data = json.loads(self.last.stdout)
        return {(c["host"], c["check"]): c for c in data["checks"] if c["component"] == "slurm"}

    def until(self, what: str, accept, timeout: float = 180) -> dict[tuple[str, str], dict]:
        """Run status until ``accept(rows)`` holds; those rows."""
        seen: dict[str, Any] = {}

        def probe():
            rows = self.run()
            seen["rows"] = rows
            return rows if accept(rows) else None

        return wait_until(what, probe, timeout)


@pytest.fixture(scope="module")
def slab(request) -> Lab:
    return lab_named_by("GPUMON_SLURM_LAB", request)


@pytest.fixture(scope="module")
def inventory(slab) -> str:
    """Every host converged (GPU roles and the monitoring tier) and the lab's Slurm up."""
    for h in GPU_HOSTS:
        slab.heal(h)
    inv = str(slab.inventory_path)
    proc = gpumon("up", "-i", inv, "--out-of-service")
    assert proc.returncode == 0, proc.stderr[-4000:]
    proc = run_cli("lab", "slurm", "--name", slab.name, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sh(slab, "mon01", f"printf '#!/bin/sh\\nsleep \"$1\"\\n' > {HOLD} && chmod 0755 {HOLD}")
    return inv


@pytest.fixture
def cluster(slab, inventory) -> Iterator[Lab]:
    """Every test starts and ends with no job, every node in service and no GPU fault."""
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


@pytest.fixture
def status(inventory, tmp_path) -> Status:
    return Status(inventory, tmp_path / "runs")


def test_a_job_holding_gpus_that_stay_idle_is_listed_and_is_not_a_failure(cluster, status):
    job = submit(cluster, 600, "-p train -w gpu01 --gres=gpu:2")
    held = job_gpus(cluster, job, "gpu01")
    assert len(held) == 2

    rows = status.until(
        f"gpu01's GPUs {sorted(held)} listed as held by job {job} but idle",
        lambda r: all(f"GPU {i} held by job {job} " in r[("gpu01", USE)]["detail"] for i in held),
    )
    row = rows[("gpu01", USE)]
    assert row["state"] == "ok", row
    assert f"{len(held)} allocated" in row["detail"]
    idle_listed = {int(i) for i in re.findall(r"GPU (\d+) held by job", row["detail"])}
    assert idle_listed == held  # the job's own GPUs, by Slurm's index, and no other
    assert rows[("gpu01", "in service")]["state"] == "ok"
    assert "FAILED slurm gpu01" not in status.last.stderr


def test_gpus_busy_where_slurm_allocated_none_fail_status_a_mig_gpu_counted_once(cluster, status):
    # a process with 1 GiB on GPU instance 9 (1g.10gb) of gpu05's MIG GPU 0, and one on
    # GPU 5 of gpu02; Slurm runs nothing on either node
    cluster.fault("gpu05", "gpu-jobs", gpu=0, gpu_instance=9, pid=4242)
    cluster.fault("gpu02", "gpu-jobs", gpu=5, pid=4343)

    rows = status.until(
        "gpu05 and gpu02 failing on GPUs busy with no Slurm job",
        lambda r: all(r[(h, USE)]["state"] == "failed" for h in ("gpu05", "gpu02")),
    )
    mig = rows[("gpu05", USE)]["detail"]
    assert re.findall(r"GPU (\d+) \(GPU-[^)]*\) busy with no Slurm job", mig) == ["0"]
    assert "GPU 1 " not in mig
    h200 = rows[("gpu02", USE)]["detail"]
    assert re.findall(r"GPU (\d+) \(GPU-[^)]*\) busy with no Slurm job", h200) == ["5"]
    assert status.last.returncode == 1
    assert "FAILED slurm gpu05: GPU use = Slurm allocation: GPU 0 " in status.last.stderr
    assert rows[("gpu05", "in service")]["detail"].startswith("idle")
    assert rows[("gpu01", USE)]["state"] == "ok"


def installed_driver(lab: Lab, host: str) -> str:
    return sh(lab, host, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").split()[0]


def test_a_node_left_drained_by_a_rollout_that_died_fails_naming_the_run_and_its_resume(
    cluster, status, inventory, tmp_path
):
    # a target other than the driver gpu03 runs: a rollout to the installed one has nothing to
    # do and never drains (test_slurm, before this module, leaves gpu03 on 595.45.04)
    target = "580.65.06" if installed_driver(cluster, "gpu03") == "580.126.20" else "580.126.20"
    submit(cluster, 600, "-p infer -w gpu03 --gres=gpu:1")
    env = {**os.environ, "GPUMON_ROLLOUT_STATE_DIR": str(status.state_dir)}
    with open(tmp_path / "rollout.err", "wb") as err:
        rollout = subprocess.Popen(
            [*CLI, "upgrade-driver", "-i", inventory, "--limit", "gpu03", "--to", target,
             "--drain", "slurm", "--drain-host", "mon01", "--job-timeout", "900"],
            env=env, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip

    def drained_by_the_rollout() -> bool:
        assert rollout.poll() is None, (
            f"the rollout exited ({rollout.returncode}) before draining gpu03: "
            + (tmp_path / "rollout.err").read_text()[-3000:]
        )
        return slurm_nodes(cluster)["gpu03"]["reason"].startswith(RUN_REASON)

    try:
        wait_until("gpu03 draining with the rollout's reason", drained_by_the_rollout, 420)
        run_id = slurm_nodes(cluster)["gpu03"]["reason"][len(RUN_REASON) :].split(":")[0]
        # the rollout waits for the job: its drain is in progress, not a finding
        row = status.run()[("gpu03", "drained by a rollout")]
        assert row["state"] == "ok", row
        assert f"by run {run_id}, in progress" in row["detail"]
    finally:
        rollout.kill()  # the controller dies: SIGKILL, nothing cleaned up
        rollout.wait(60)

    assert slurm_nodes(cluster)["gpu03"]["state"] in ("draining", "drained")
    row = status.run()[("gpu03", "drained by a rollout")]
    assert row["state"] == "failed", row
    assert f"by run {run_id}, which died mid-run" in row["detail"]
    assert f"--resume {run_id}" in row["detail"] and f"-i {inventory}" in row["detail"]
    assert status.last.returncode == 1
    assert "FAILED slurm gpu03: drained by a rollout" in status.last.stderr


def test_an_administrator_s_drain_is_shown_with_its_reason_and_is_not_a_failure(cluster, status):
    sh(cluster, "mon01", "scontrol update nodename=gpu04 state=drain reason='RMA 4711: fan'")
    rows = status.run()
    row = rows[("gpu04", "drained by an administrator")]
    assert row["state"] == "ok", row
    assert row["detail"].startswith("drained: 'RMA 4711: fan' (root, ")
    assert ("gpu04", "drained by a rollout") not in rows
    # gpu04's own rows only: gpu05 (the inference tier, scraped every 30 s) may still show, in
    # its 20 s window, the busy GPU of the fault an earlier test healed a minute ago (CI,
    # 2026-12-04: "FAILED slurm gpu05: GPU use = Slurm allocation: GPU 0 ... busy").
    assert "FAILED slurm gpu04" not in status.last.stderr
