"""Job-aware GPU metrics end to end on the lab: a real Slurm 22.05 job on gpu01's (simulated) GPUs,
dcgm-exporter's ``--hpc-job-mapping-dir`` as the dcgm_exporter role sets it up
(``dcgm_exporter_hpc_job_mapping: slurm``), both Prometheus replicas and the rule pack.

The lab's Slurm (``lab slurm``) keeps its Prolog and Epilog as directories of scripts, each with a
script of the lab "site" (``Prolog=/etc/slurm/prolog.d/*``); the module brings it up first, then
converges gpu01 with the option on and the site's directories named, as a site that already runs
Slurm would, and the monitoring tier. A job holding two GPUs of gpu01 runs; while it does:

- the role's hook sits beside the site's in both directories, slurm.conf untouched, and both run;
- the job's GPU files hold its id; the exporter labels every series of those GPUs, and of no
  other, with ``hpc_job=<id>``; both replicas store them;
- ``hpc_job:gpus:sum`` says 2 GPUs and ``hpc_job:gpu_hours:integral`` grows, on both replicas;
- an XID on one of its GPUs fires GPUXidCritical carrying the job's id, on both replicas;
- a job given gpu05's two GPUs, GPU 0 in MIG mode, has each GPU instance's series labelled (the
  Prolog maps ``0.<GPU_I_ID>`` too) and ``gpu_hpc_job:gpus:sum`` counts that GPU once;

and once it ended (cancelled): the files are emptied, not removed, and neither the exporter nor
either replica has a series with its id any more, its GPU hours kept as the record's last value.
Turned off again, the role takes its hooks out of the site's directories and the flag off the
exporter, and jobs still run (the site's own scripts still match the globs).

Set ``GPUMON_SLURM_JOBS_LAB=<name>`` to run against a lab that is already up (development).
"""

from __future__ import annotations

import functools
import json
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from deployer.lab import Lab
from deployer.lab import slurm as labslurm
from deployer.monitoring.http import http_fetch
from tests.integration import labtools
from tests.integration.labtools import lab_named_by, run_cli

pytestmark = pytest.mark.lab

HOST = "gpu01"
MAP_DIR = "/run/gpumon/dcgm-job-map"
HOOK = "50-gpumon-dcgm-job-map"
JOB_VARS = {
    "dcgm_exporter_hpc_job_mapping": "slurm",
    "dcgm_exporter_slurm_prolog_dir": labslurm.PROLOG_DIR,
    "dcgm_exporter_slurm_epilog_dir": labslurm.EPILOG_DIR,
}
# GPU 0 in MIG mode (3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb), GPU 1 whole; scraped every 30 s
MIG_HOST = "gpu05"
HOLD = "/root/gpumon-test-hold-jobs.sh"
HOLD_SCRIPT = """#!/bin/sh
echo "start pid=$$ gpus=$SLURM_JOB_GPUS"
sleep "$1"
"""
# an XID the rule pack calls critical (double-bit ECC error)
XID = 48

gpumon = functools.partial(run_cli, timeout=1500)
wait_until = functools.partial(labtools.wait_until, every=2.0)


def sh(lab: Lab, host: str, command: str) -> str:
    proc = lab.ssh(host, command, timeout=120)
    assert proc.returncode == 0, f"{host}: {command}: {proc.stderr[-500:]}"
    return proc.stdout


def replicas(lab: Lab) -> dict[str, str]:
    return {h.name: f"http://{h.address}:9090" for h in lab.hosts if "prometheus" in h.groups}


def query(url: str, promql: str) -> list[dict[str, Any]]:
    r = http_fetch(f"{url}/api/v1/query?query={urllib.parse.quote(promql)}")
    assert r.error is None and r.status == 200, (url, promql, r)
    return r.json()["data"]["result"]


def on_every_replica(lab: Lab, what: str, probe, timeout: float = 120) -> None:
    for name, url in replicas(lab).items():
        wait_until(f"{name}: {what}", functools.partial(probe, url), timeout)


def exporter_series(lab: Lab, host: str = HOST) -> list[str]:
    """``host``'s (gpu01's) exposition, series lines only, as the exporter serves it right now."""
    text = sh(lab, host, "curl -fsS http://127.0.0.1:9400/metrics")
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def gpu_of(line: str) -> str:
    return line.split('gpu="', 1)[1].split('"', 1)[0]


@pytest.fixture(scope="module")
def jlab(request) -> Lab:
    return lab_named_by("GPUMON_SLURM_JOBS_LAB", request)


@pytest.fixture(scope="module")
def site(jlab) -> dict[str, str]:
    """The lab's Slurm up, then gpu01 converged with job mapping on and the monitoring tier; the
    sha256 of slurm.conf on gpu01 before and after the converge."""
    jlab.heal(HOST)
    proc = run_cli("lab", "slurm", "--name", jlab.name, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before = sh(jlab, HOST, "sha256sum /etc/slurm/slurm.conf").split()[0]
    inv = str(jlab.inventory_path)
    jlab.heal(MIG_HOST)
    proc = gpumon("up", "-i", inv, "--limit", f"{HOST}:{MIG_HOST}", "-e", "nvidia_driver_reboot=if_required",
                  "--out-of-service", "-e", json.dumps(JOB_VARS))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    proc = gpumon("up", "-i", inv, "--limit", "prometheus:alertmanager:thanos_query")
    assert proc.returncode == 0, proc.stderr[-4000:]
    sh(jlab, "mon01", f"cat > {HOLD} <<'EOF'\n{HOLD_SCRIPT}EOF\nchmod 0755 {HOLD}")
    after = sh(jlab, HOST, "sha256sum /etc/slurm/slurm.conf").split()[0]
    return {"inventory": inv, "conf_before": before, "conf_after": after}


class Job:
    """A batch job on mon01 holding ``gpus`` GPUs of ``host`` (gpu01) until cancelled."""

    def __init__(self, lab: Lab, gpus: int, host: str = HOST, partition: str = "") -> None:
        self.lab, self.host = lab, host
        where = f"-p {partition} -w {host}" if partition else f"-w {host}"
        out = sh(lab, "mon01", f"sbatch --parsable -o /var/tmp/gpumon-jobs-%j.out {where} "
                 f"--gres=gpu:{gpus} {HOLD} 1800")  # fmt: skip
        self.id = out.strip().split(";")[0]

    def state(self) -> str:
        out = sh(self.lab, "mon01", f"squeue -h -j {self.id} -o '%T' 2>/dev/null || true")
        return out.strip()

    def gpus(self) -> list[str]:
        """The GPU ids Slurm gave the job, as its batch script saw them."""
        text = sh(
            self.lab, self.host, f"cat /var/tmp/gpumon-jobs-{self.id}.out 2>/dev/null || true"
        )
        for word in text.split():
            if word.startswith("gpus="):
                return word.removeprefix("gpus=").split(",")
        return []

    def cancel(self) -> None:
        self.lab.ssh("mon01", f"scancel {self.id}", timeout=30)


@pytest.fixture(scope="module")
def job(jlab, site) -> Iterator[Job]:
    j = Job(jlab, 2)
    wait_until(f"job {j.id} running", lambda: j.state() == "RUNNING" and j.gpus(), 120)
    yield j
    j.cancel()
    jlab.heal(HOST)


# ------------------------------------------------------------------- the hooks


def test_the_roles_hook_sits_beside_the_sites_own_and_slurm_conf_is_untouched(jlab, site):
    for d in (labslurm.PROLOG_DIR, labslurm.EPILOG_DIR):
        assert sh(jlab, HOST, f"ls {d}").split() == [labslurm.SITE_HOOK, HOOK]
    assert site["conf_after"] == site["conf_before"]
    conf = sh(jlab, HOST, "cat /etc/slurm/slurm.conf").splitlines()
    assert f"Prolog={labslurm.PROLOG_DIR}/*" in conf


def test_the_prolog_maps_the_jobs_gpus_and_the_sites_own_prolog_still_runs(jlab, job):
    gpus = job.gpus()
    assert len(gpus) == 2
    for gpu in gpus:
        assert sh(jlab, HOST, f"cat {MAP_DIR}/{gpu}").split() == [job.id]
    log = sh(jlab, HOST, f"cat {labslurm.SITE_HOOK_LOG}")
    assert f"prolog job={job.id} gpus={','.join(gpus)}" in log


# ------------------------------------------------------------------- the exporter and Prometheus


def test_the_exporter_labels_every_series_of_the_jobs_gpus_and_of_no_other(jlab, job):
    gpus = set(job.gpus())
    lines = exporter_series(jlab)
    labelled = [ln for ln in lines if f'hpc_job="{job.id}"' in ln]
    assert {gpu_of(ln) for ln in labelled} == gpus
    # every series of those GPUs, the job's label rendered last (render_metrics.go:52-54)
    assert all(f',hpc_job="{job.id}"}} ' in ln for ln in labelled)
    of_the_gpus = [ln for ln in lines if gpu_of(ln) in gpus]
    assert len(labelled) == len(of_the_gpus)
    assert not [ln for ln in lines if gpu_of(ln) not in gpus and "hpc_job=" in ln]


def test_both_replicas_store_the_jobs_gpus_with_its_id(jlab, job):
    gpus = set(job.gpus())

    def stored(url: str) -> bool:
        found = query(url, f'group by (gpu) (DCGM_FI_DEV_GPU_TEMP{{node="{HOST}",'
                      f'hpc_job="{job.id}"}})')  # fmt: skip
        return {r["metric"]["gpu"] for r in found} == gpus

    on_every_replica(jlab, f"GPU series of job {job.id}", stored)


def test_both_replicas_record_the_jobs_gpus_and_growing_gpu_hours(jlab, job):
    def counted(url: str) -> bool:
        found = query(url, f'hpc_job:gpus:sum{{hpc_job="{job.id}"}}')
        return [float(r["value"][1]) for r in found] == [2.0]

    def growing(url: str) -> float | None:
        found = query(url, f'hpc_job:gpu_hours:integral{{hpc_job="{job.id}"}}')
        return float(found[0]["value"][1]) if found and float(found[0]["value"][1]) > 0 else None

    on_every_replica(jlab, f"2 GPUs of job {job.id}", counted)
    on_every_replica(jlab, f"GPU hours of job {job.id}", growing)
    first = {n: growing(u) for n, u in replicas(jlab).items()}
    wait_until(
        "GPU hours still growing",
        lambda: all((growing(u) or 0) > (first[n] or 0) for n, u in replicas(jlab).items()),
        90,
    )


def test_an_xid_on_a_gpu_of_the_job_alerts_with_its_id_on_both_replicas(jlab, job):
    gpu = job.gpus()[0]
    jlab.fault(HOST, "xid", gpu=int(gpu), xid=XID)

    def firing(url: str) -> bool:
        alerts = http_fetch(f"{url}/api/v1/alerts").json()["data"]["alerts"]
        return any(
            a["labels"].get("alertname") == "GPUXidCritical"
            and a["labels"].get("node") == HOST
            and a["labels"].get("gpu") == gpu
            and a["labels"].get("hpc_job") == job.id
            and a["state"] == "firing"
            and f"Job(s) on it: {job.id}." in a["annotations"]["description"]
            for a in alerts
        )

    on_every_replica(jlab, f"GPUXidCritical with hpc_job={job.id}", firing)


def test_a_job_given_a_whole_mig_gpu_labels_each_of_its_gpu_instances_on_both_replicas(jlab, site):
    # dcgm-exporter keys a MIG instance's series <gpu>.<GPU_I_ID> (hpc.go:98-105 @691c9276): the
    # Prolog maps the GPU and each of its instances; the rules count the MIG GPU once
    job = Job(jlab, 2, host=MIG_HOST, partition="infer")
    try:
        wait_until(f"job {job.id} running", lambda: job.state() == "RUNNING" and job.gpus(), 120)
        smi = sh(jlab, MIG_HOST, "nvidia-smi -q -i 0")
        instances = sorted({ln.split(":")[1].strip() for ln in smi.splitlines()
                            if ln.strip().startswith("GPU Instance ID")})  # fmt: skip
        assert len(instances) == 4, smi
        for gi in instances:
            assert sh(jlab, MIG_HOST, f"cat {MAP_DIR}/0.{gi}").split() == [job.id]

        def instances_labelled() -> bool:
            mig = [ln for ln in exporter_series(jlab, MIG_HOST) if 'GPU_I_ID="' in ln]
            return bool(mig) and all(f'hpc_job="{job.id}"' in ln for ln in mig)

        wait_until("every series of gpu05's GPU instances labelled", instances_labelled, 60)

        def counted(url: str) -> bool:
            found = query(url, f'gpu_hpc_job:gpus:sum{{node="{MIG_HOST}",hpc_job="{job.id}"}}')
            return sorted((r["metric"]["gpu"], float(r["value"][1])) for r in found) == [
                ("0", 1.0), ("1", 1.0),
            ]  # fmt: skip

        on_every_replica(jlab, f"gpu05's 2 GPUs, the MIG one once, for job {job.id}", counted, 180)
    finally:
        job.cancel()
    wait_until(f"job {job.id} gone", lambda: job.state() == "", 120)
    wait_until(
        "gpu05's instance files emptied",
        lambda: all(sh(jlab, MIG_HOST, f"cat {MAP_DIR}/0.{gi}") == "" for gi in instances),
        60,
    )
    assert not [ln for ln in exporter_series(jlab, MIG_HOST) if "hpc_job=" in ln]


# ------------------------------------------------------------------- once the job ended


def test_once_the_job_ended_no_series_carries_its_id(jlab, job):
    gpus = job.gpus()
    job.cancel()
    wait_until(f"job {job.id} gone", lambda: job.state() == "", 120)
    # the Epilog emptied the job's GPU files, never removed them
    wait_until(
        "the job's GPU files emptied",
        lambda: all(sh(jlab, HOST, f"cat {MAP_DIR}/{g}") == "" for g in gpus),
        60,
    )
    assert not [ln for ln in exporter_series(jlab) if "hpc_job=" in ln]

    def gone(url: str) -> bool:
        return not query(url, f'{{hpc_job="{job.id}",__name__=~"DCGM_.*"}}') and not query(
            url, f'hpc_job:gpus:sum{{hpc_job="{job.id}"}}'
        )

    on_every_replica(jlab, f"no series of job {job.id}", gone)
    for name, url in replicas(jlab).items():
        kept = query(url, f'last_over_time(hpc_job:gpu_hours:integral{{hpc_job="{job.id}"}}[1h])')
        assert kept and float(kept[0]["value"][1]) > 0, name


def test_turned_off_the_flag_and_the_sites_hooks_go_and_jobs_still_run(jlab, site, job):
    # after the job test above: converge with the option off, the site's directories still named
    dirs = {k: v for k, v in JOB_VARS.items() if k != "dcgm_exporter_hpc_job_mapping"}
    proc = gpumon("up", "-i", site["inventory"], "--limit", HOST, "-e", json.dumps(dirs))
    assert proc.returncode == 0, proc.stderr[-4000:]
    for d in (labslurm.PROLOG_DIR, labslurm.EPILOG_DIR):
        assert sh(jlab, HOST, f"ls {d}").split() == [labslurm.SITE_HOOK]
    assert "--hpc-job-mapping-dir" not in sh(jlab, HOST, "systemctl cat dcgm-exporter")
    after = Job(jlab, 1)
    wait_until(f"job {after.id} running", lambda: after.state() == "RUNNING" and after.gpus(), 120)
    after.cancel()
    assert not [ln for ln in exporter_series(jlab) if "hpc_job=" in ln]
