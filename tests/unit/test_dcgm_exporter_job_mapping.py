"""The dcgm_exporter role's job-aware metrics (``dcgm_exporter_hpc_job_mapping: slurm``): the
exporter's ``--hpc-job-mapping-dir``, the directory, the Slurm Prolog/Epilog hooks and how they
sit beside a site's own, and the variables refused before anything is touched."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.errors import InputError
from deployer.gpu import hpc_job_mapping
from tests.unit.test_gpu_roles import H100, absent, planned, task

ROOT = Path(__file__).resolve().parents[2]
ON = {**H100, "dcgm_exporter_hpc_job_mapping": "slurm"}
SITE_DIRS = {
    "dcgm_exporter_slurm_prolog_dir": "/etc/slurm/prolog.d",
    "dcgm_exporter_slurm_epilog_dir": "/etc/slurm/epilog.d",
}


def unit(variables: dict[str, Any]) -> str:
    return task(planned(variables), "^dcgm-exporter hardened unit").args["content"]


def test_job_mapping_is_off_by_default():
    tasks = planned(H100)
    assert "--hpc-job-mapping-dir" not in unit(H100)
    assert absent(tasks, "^job-mapping directory /")
    assert absent(tasks, "^Slurm (prolog|epilog) hook")
    assert task(tasks, "^job-mapping directory no longer made at boot").args["state"] == "absent"


def test_on_the_exporter_reads_the_job_map_directory():
    assert "    --hpc-job-mapping-dir /run/gpumon/dcgm-job-map" in unit(ON)


def test_the_directory_is_roots_readable_by_all_and_emptied_at_every_boot():
    tasks = planned(ON)
    d = task(tasks, "^job-mapping directory /run/gpumon/dcgm-job-map$").args
    assert (d["owner"], d["group"], int(d["mode"], 8)) == ("root", "root", 0o755)
    tmpfiles = task(tasks, "made and emptied at boot").args
    assert tmpfiles["dest"] == "/etc/tmpfiles.d/gpumon-dcgm-job-map.conf"
    assert "\nD /run/gpumon/dcgm-job-map 0755 root root -\n" in tmpfiles["content"]


def test_the_directory_comes_from_the_variable():
    variables = {**ON, "dcgm_exporter_hpc_job_mapping_dir": "/var/lib/gpumon/jobs/"}
    assert re.search(r"--hpc-job-mapping-dir /var/lib/gpumon/jobs$", unit(variables), re.M)


def test_the_hardened_unit_gets_no_write_access_nor_a_bind_of_the_directory():
    text = unit(ON)
    assert "ProtectSystem=strict" in text
    assert "ReadWritePaths" not in text
    assert not [ln for ln in text.splitlines() if ln.startswith("ReadOnlyPaths=")]


def test_the_script_and_its_two_hooks_are_installed_executable():
    tasks = planned(ON)
    script = task(tasks, "^Slurm Prolog/Epilog script of the job map").args
    assert script["dest"] == "/usr/local/libexec/gpumon/slurm-dcgm-job-map"
    assert int(script["mode"], 8) == 0o755
    for mode in ("prolog", "epilog"):
        hook = task(tasks, f"^Slurm {mode} hook of the job map").args
        assert hook["dest"] == f"/usr/local/libexec/gpumon/slurm-dcgm-job-map-{mode}"
        assert hook["content"].splitlines()[-1] == (
            "DCGM_HPC_JOB_MAPPING_DIR=/run/gpumon/dcgm-job-map DCGM_HPC_JOB_MAPPING_INSTANCES=1 "
            f"exec /usr/local/libexec/gpumon/slurm-dcgm-job-map {mode}"
        )


@pytest.mark.parametrize(("tag", "switch"), [("4.4.2-4.7.1", "0"), ("4.5.3-4.8.2", "1")])
def test_the_hooks_map_mig_instances_only_for_exporters_that_read_instance_files(tag, switch):
    tasks = planned({**ON, "dcgm_exporter_version": tag})
    hook = task(tasks, "^Slurm prolog hook of the job map").args
    assert f" DCGM_HPC_JOB_MAPPING_INSTANCES={switch} exec " in hook["content"]


def test_without_hook_directories_nothing_of_the_sites_slurm_is_touched():
    tasks = planned(ON)
    assert absent(tasks, "hook in /")
    assert absent(tasks, "is free or gpumon-deploy's")
    places = [str(t.args.get("dest") or t.args.get("path") or "") for t in tasks.values()]
    assert not [p for p in places if p.startswith("/etc/slurm")]


def test_with_hook_directories_one_file_of_ours_goes_into_each():
    tasks = planned({**ON, **SITE_DIRS})
    for mode, d in (("prolog", "/etc/slurm/prolog.d"), ("epilog", "/etc/slurm/epilog.d")):
        hook = task(tasks, f"^job-map {mode} hook in {d}$").args
        assert hook["dest"] == f"{d}/50-gpumon-dcgm-job-map"
        assert f"hook=/usr/local/libexec/gpumon/slurm-dcgm-job-map-{mode}\n" in hook["content"]


def test_a_file_of_the_sites_under_our_hook_name_is_never_replaced():
    guard = task(
        planned({**ON, **SITE_DIRS}), "^/etc/slurm/prolog.d/50-gpumon-dcgm-job-map is free"
    )
    assert guard.args["unless"].startswith(
        "test ! -e /etc/slurm/prolog.d/50-gpumon-dcgm-job-map ||"
    )
    assert "grep -q '^# Managed by gpumon-deploy (role dcgm_exporter)'" in guard.args["unless"]
    assert "refusing to replace it" in guard.args["cmd"]


def test_turned_off_the_hooks_leave_the_sites_directories():
    tasks = planned({**H100, **SITE_DIRS})
    gone = task(tasks, "^job-map prolog hook absent").args
    assert (gone["path"], gone["state"]) == ("/etc/slurm/prolog.d/50-gpumon-dcgm-job-map", "absent")


def test_the_installed_hooks_map_a_job_the_way_slurmd_runs_them(tmp_path: Path):
    # the hook files as the role writes them, run as slurmd runs a Prolog.d entry: no argument,
    # no environment of ours, only Slurm's
    tasks = planned({**ON, **SITE_DIRS})

    def here(text: str) -> str:  # the host's paths, moved under tmp_path
        return text.replace("/run/gpumon/dcgm-job-map", str(tmp_path / "map")).replace(
            "/usr/local/libexec/gpumon", str(tmp_path / "libexec")
        )

    (tmp_path / "libexec").mkdir()
    script = tmp_path / "libexec/slurm-dcgm-job-map"
    script.write_bytes((ROOT / "roles/dcgm_exporter/files/slurm-dcgm-job-map").read_bytes())
    files = [script]
    for mode in ("prolog", "epilog"):
        for pattern in (f"^Slurm {mode} hook of the job map", f"^job-map {mode} hook in "):
            args = task(tasks, pattern).args
            path = (
                tmp_path / "site" / mode / "50"
                if "hook in" in pattern
                else Path(here(args["dest"]))
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(here(args["content"]))
            files.append(path)
    for f in files:
        f.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "77", "SLURM_JOB_GPUS": "1,2"}
    prolog = subprocess.run([tmp_path / "site/prolog/50"], env=env, check=False)
    assert prolog.returncode == 0
    assert (tmp_path / "map/1").read_text() == "77\n" == (tmp_path / "map/2").read_text()
    assert subprocess.run([tmp_path / "site/epilog/50"], env=env, check=False).returncode == 0
    assert (tmp_path / "map/1").read_text() == "" == (tmp_path / "map/2").read_text()
    script.unlink()  # the role gone, or turned off on a site that kept its own Prolog entry
    (tmp_path / "libexec/slurm-dcgm-job-map-prolog").unlink()
    assert subprocess.run([tmp_path / "site/prolog/50"], env=env, check=False).returncode == 0


def test_the_role_defaults_are_the_ones_the_plan_applies():
    defaults = yaml.safe_load((ROOT / "roles/dcgm_exporter/defaults/main.yml").read_text())
    assert defaults[hpc_job_mapping.DIR_KEY] == hpc_job_mapping.DEFAULT_DIR
    assert defaults[hpc_job_mapping.HOOK_KEY] == hpc_job_mapping.DEFAULT_HOOK_NAME
    assert defaults[hpc_job_mapping.KEY] == ""


# ---- what is refused ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variables", "key", "words"),
    [
        ({"dcgm_exporter_hpc_job_mapping": "pbs"}, "dcgm_exporter_hpc_job_mapping", "slurm"),
        ({"dcgm_exporter_hpc_job_mapping_dir": "/tmp/jobs"}, "dcgm_exporter_hpc_job_mapping_dir",
         "PrivateTmp"),
        ({"dcgm_exporter_hpc_job_mapping_dir": "/home/x"}, "dcgm_exporter_hpc_job_mapping_dir",
         "ProtectHome"),
        ({"dcgm_exporter_hpc_job_mapping_dir": "run/jobs"}, "dcgm_exporter_hpc_job_mapping_dir",
         "absolute"),
        ({"dcgm_exporter_hpc_job_mapping_dir": "/run/a b"}, "dcgm_exporter_hpc_job_mapping_dir",
         "absolute"),
        ({"dcgm_exporter_slurm_prolog_dir": "/etc/slurm/prolog.d"},
         "dcgm_exporter_slurm_epilog_dir", "go together"),
        ({"dcgm_exporter_slurm_hook_name": "../x"}, "dcgm_exporter_slurm_hook_name", "file name"),
    ],
)  # fmt: skip
def test_bad_values_are_refused_naming_the_host_and_key(variables, key, words):
    with pytest.raises(InputError) as refused:
        planned({**ON, **variables})
    assert refused.value.key == key
    assert "host g1:" in refused.value.message and words in refused.value.message


def test_an_exporter_that_drops_an_idle_gpus_metrics_is_refused():
    # before 4.3.1-4.4.0 (NVIDIA/dcgm-exporter fe52755, #533) an emptied GPU file removed every
    # series of that GPU (hpc.go `if exists {` with no len check, @9378144 = 4.2.3-4.2.0)
    with pytest.raises(InputError) as refused:
        hpc_job_mapping.plan("g1", {"dcgm_exporter_hpc_job_mapping": "slurm"}, "4.2.3-4.2.0")
    assert refused.value.key == "dcgm_exporter_hpc_job_mapping"
    assert "4.3.1-4.4.0" in refused.value.message
    ok = hpc_job_mapping.plan("g1", {"dcgm_exporter_hpc_job_mapping": "slurm"}, "4.3.1-4.4.0")
    assert ok["enabled"]


@pytest.mark.parametrize(
    ("tag", "instance_files"),
    [("4.4.2-4.7.1", False), ("4.5.2-4.8.1", False), ("4.5.3-4.8.2", True), ("4.6.0-4.8.3", True)],
)
def test_mig_instance_files_are_read_from_4_5_3_4_8_2(tag, instance_files):
    # hpc.go:98-105,165 @691c927 (NVIDIA/dcgm-exporter#602, first in 4.5.3-4.8.2)
    found = hpc_job_mapping.plan("g1", {"dcgm_exporter_hpc_job_mapping": "slurm"}, tag)
    assert found["instance_files"] is instance_files


def test_an_old_exporter_is_fine_while_job_mapping_is_off():
    assert not hpc_job_mapping.plan("g1", {}, "3.3.5-3.4.0")["enabled"]
