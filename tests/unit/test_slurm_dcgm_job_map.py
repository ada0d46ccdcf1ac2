"""The Slurm Prolog/Epilog that maps jobs to GPUs for dcgm-exporter's --hpc-job-mapping-dir, run as
slurmd runs it: no arguments (the mode from its path) or prolog|epilog, Slurm's environment
(SLURM_JOB_ID, SLURM_JOB_GPUS or CUDA_VISIBLE_DEVICES), and the directory read back by
dcgm-exporter's own rules (files named ``^\\d+(\\.\\d+)?$``, one job id a line)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.reality import capture_text

SCRIPT = Path(__file__).parents[2] / "roles/dcgm_exporter/files/slurm-dcgm-job-map"
# NVIDIA/dcgm-exporter internal/pkg/transformation/hpc.go:165 @691c9276 (4.5.3-4.8.2)
EXPORTER_FILE = re.compile(r"^\d+(\.\d+)?$")


def run(mapdir: Path, *args: str, script: Path = SCRIPT, **env: str):
    base = {"PATH": os.environ["PATH"], "DCGM_HPC_JOB_MAPPING_DIR": str(mapdir)}
    return subprocess.run(
        [str(script), *args], env={**base, **env}, capture_output=True, text=True, check=False
    )


def exporter_view(mapdir: Path) -> dict[str, list[str]]:
    """GPU id -> job ids, as dcgm-exporter reads the directory (hpc.go getGPUFiles, readFile)."""
    if not mapdir.is_dir():
        return {}
    return {
        p.name: p.read_text().splitlines()
        for p in sorted(mapdir.iterdir())
        if p.is_file() and EXPORTER_FILE.match(p.name)
    }


def test_the_prolog_maps_each_gpu_of_the_job_to_its_id(tmp_path):
    proc = run(tmp_path / "map", "prolog", SLURM_JOB_ID="4711", SLURM_JOB_GPUS="0,3")
    assert proc.returncode == 0, proc.stderr
    assert exporter_view(tmp_path / "map") == {"0": ["4711"], "3": ["4711"]}


def test_the_epilog_removes_the_job_and_leaves_its_gpus_files_empty_never_gone(tmp_path):
    # dcgm-exporter lists the directory, then opens each file: one removed in between fails the
    # scrape (hpc.go:80-84 @691c9276), so an emptied file stays, and an empty file adds no label
    env = {"SLURM_JOB_ID": "4711", "SLURM_JOB_GPUS": "0,3"}
    run(tmp_path / "map", "prolog", **env)
    assert run(tmp_path / "map", "epilog", **env).returncode == 0
    assert exporter_view(tmp_path / "map") == {"0": [], "3": []}
    assert sorted(p.name for p in (tmp_path / "map").iterdir()) == [".lock", "0", "3"]


def test_jobs_sharing_a_gpu_each_keep_their_line(tmp_path):
    run(tmp_path / "map", "prolog", SLURM_JOB_ID="10", SLURM_JOB_GPUS="1")
    run(tmp_path / "map", "prolog", SLURM_JOB_ID="11", SLURM_JOB_GPUS="1,2")
    assert exporter_view(tmp_path / "map") == {"1": ["10", "11"], "2": ["11"]}
    run(tmp_path / "map", "epilog", SLURM_JOB_ID="10", SLURM_JOB_GPUS="1")
    assert exporter_view(tmp_path / "map") == {"1": ["11"], "2": ["11"]}
    run(tmp_path / "map", "epilog", SLURM_JOB_ID="11", SLURM_JOB_GPUS="1,2")
    assert exporter_view(tmp_path / "map") == {"1": [], "2": []}


def test_a_repeated_prolog_or_epilog_changes_nothing_more(tmp_path):
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0"}
    run(tmp_path / "map", "prolog", **env)
    run(tmp_path / "map", "prolog", **env)
    assert exporter_view(tmp_path / "map") == {"0": ["7"]}
    run(tmp_path / "map", "epilog", **env)
    assert run(tmp_path / "map", "epilog", **env).returncode == 0
    assert exporter_view(tmp_path / "map") == {"0": []}


def test_cuda_visible_devices_stands_in_when_slurm_job_gpus_is_unset(tmp_path):
    run(tmp_path / "map", "prolog", SLURM_JOB_ID="8", CUDA_VISIBLE_DEVICES="2,5")
    assert exporter_view(tmp_path / "map") == {"2": ["8"], "5": ["8"]}


def test_a_job_without_gpus_on_the_node_writes_nothing(tmp_path):
    proc = run(tmp_path / "map", "prolog", SLURM_JOB_ID="9")
    assert proc.returncode == 0
    assert not (tmp_path / "map").exists()


@pytest.mark.parametrize(
    ("installed_as", "mode"),
    [("prolog.d/50-dcgm-job-map", "prolog"), ("epilog.d/50-dcgm-job-map", "epilog")],
)
def test_without_arguments_the_mode_comes_from_where_it_is_installed(tmp_path, installed_as, mode):
    script = tmp_path / "slurm" / installed_as
    script.parent.mkdir(parents=True)
    shutil.copy(SCRIPT, script)
    (tmp_path / "map").mkdir()
    (tmp_path / "map" / "0").write_text("12\n")
    run(tmp_path / "map", script=script, SLURM_JOB_ID="12", SLURM_JOB_GPUS="0")
    assert exporter_view(tmp_path / "map") == ({"0": ["12"]} if mode == "prolog" else {"0": []})


@pytest.mark.parametrize(
    "env",
    [
        {"SLURM_JOB_GPUS": "0"},  # no job id
        {"SLURM_JOB_ID": "5;rm -rf /", "SLURM_JOB_GPUS": "0"},
        {"SLURM_JOB_ID": "5", "SLURM_JOB_GPUS": "MIG-9c8f0b3e-0c5e-5d8a-9a2f-2b6d0f5b7a11"},
        {"SLURM_JOB_ID": "5", "SLURM_JOB_GPUS": "../../etc/passwd"},
    ],
)
def test_what_it_cannot_map_it_skips_and_it_never_fails_the_job(tmp_path, env):
    proc = run(tmp_path / "map", "prolog", **env)
    assert proc.returncode == 0
    assert exporter_view(tmp_path / "map") == {}


def test_an_unwritable_directory_does_not_fail_the_prolog(tmp_path):
    (tmp_path / "map").write_text("a file where the directory should be")
    proc = run(tmp_path / "map", "prolog", SLURM_JOB_ID="5", SLURM_JOB_GPUS="0")
    assert proc.returncode == 0


def test_many_jobs_starting_at_once_on_one_gpu_all_keep_their_line(tmp_path):
    def start(job: int):
        return run(tmp_path / "map", "prolog", SLURM_JOB_ID=str(job), SLURM_JOB_GPUS="0,1")

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert all(p.returncode == 0 for p in pool.map(start, range(100, 116)))
    view = exporter_view(tmp_path / "map")
    assert sorted(view["0"]) == sorted(view["1"]) == sorted(str(j) for j in range(100, 116))
    assert [
        p.name for p in (tmp_path / "map").iterdir() if p.name.startswith(".") and p.name != ".lock"
    ] == []


# ------------------------------------------------------------------- a whole GPU in MIG mode

H100_MIG = "nvidia_gpu_exporter/linux-x86_64__nvidia-h100-mig__590.48.01.txt"
# GPU instance 2 split into two compute instances (MIG devices 0 and 1), then 3, 9, 10
H200_MIG = "nvidia_gpu_exporter/linux-x86_64__nvidia-h200-mig__590.48.01.txt"
# R580, one GPU instance (2) as one compute instance; proposed for ../shared (tests/reality.py)
H200_MIG_580 = "nvidia_gpu_exporter/linux-x86_64__nvidia-h200-mig__580.173.02.txt"


def section_of(capture: str, command: str) -> str:
    """The first section of a nvidia_gpu_exporter capture made by ``command`` (one GPU)."""
    lines = capture.splitlines()
    start = lines.index(f"# $ {command}") + 2  # the command line, then the rule
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("####"))
    return "\n".join(lines[start:end]) + "\n"


def mig_smi_of(tmp_path: Path, path: str) -> Path:
    """A PATH whose ``nvidia-smi -q -i 0`` and ``-L`` print a real MIG capture's and which prints
    nothing for any other GPU, as for one not in MIG mode."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "smi-q.txt").write_text(section_of(capture_text(path), "nvidia-smi -q"))
    (bindir / "smi-L.txt").write_text(section_of(capture_text(path), "nvidia-smi -L"))
    smi = bindir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        f'[ "$*" = "-q -i 0" ] && cat {bindir}/smi-q.txt\n'
        f'[ "$*" = "-L" ] && cat {bindir}/smi-L.txt\n'
        "exit 0\n"
    )
    smi.chmod(0o755)
    return bindir


@pytest.fixture
def mig_smi(tmp_path) -> Path:
    """The real H100's (MIG on: devices 0-3, GPU instances 2, 3, 9 and 10)."""
    return mig_smi_of(tmp_path, H100_MIG)


@pytest.mark.parametrize(
    ("path", "instances"),
    [(H100_MIG, ["2", "3", "9", "10"]), (H200_MIG, ["2", "3", "9", "10"]), (H200_MIG_580, ["2"])],
    ids=["h100-590.48.01", "h200-590.48.01-split-gi", "h200-580.173.02"],
)
def test_a_whole_mig_gpu_maps_each_of_its_gpu_instances_for_exporters_that_key_them(
    tmp_path, path, instances
):
    # dcgm-exporter 4.5.3-4.8.2 keys a MIG instance's series "<gpu>.<GPU_I_ID>" (hpc.go:98-105
    # @691c9276): a file "0" alone would label none of GPU 0's series
    mig_smi = mig_smi_of(tmp_path, path)
    env = {"SLURM_JOB_ID": "31", "SLURM_JOB_GPUS": "0,1", "DCGM_HPC_JOB_MAPPING_INSTANCES": "1",
           "PATH": f"{mig_smi}:{os.environ['PATH']}"}  # fmt: skip
    files = ["0", *(f"0.{gi}" for gi in instances), "1"]
    assert run(tmp_path / "map", "prolog", **env).returncode == 0
    assert exporter_view(tmp_path / "map") == {name: ["31"] for name in files}
    assert run(tmp_path / "map", "epilog", **env).returncode == 0
    assert exporter_view(tmp_path / "map") == {name: [] for name in files}


def test_older_exporters_get_no_instance_files(tmp_path, mig_smi):
    # 4.4.2-4.7.1 reads integer names only (hpc.go:176 @b921c57): the role leaves the switch off
    env = {"SLURM_JOB_ID": "32", "SLURM_JOB_GPUS": "0",
           "PATH": f"{mig_smi}:{os.environ['PATH']}"}  # fmt: skip
    run(tmp_path / "map", "prolog", **env)
    assert exporter_view(tmp_path / "map") == {"0": ["32"]}


def test_the_epilog_clears_instance_files_of_a_layout_changed_since_the_prolog(tmp_path, mig_smi):
    env = {"SLURM_JOB_ID": "33", "SLURM_JOB_GPUS": "0", "DCGM_HPC_JOB_MAPPING_INSTANCES": "1",
           "PATH": f"{mig_smi}:{os.environ['PATH']}"}  # fmt: skip
    run(tmp_path / "map", "prolog", **env)
    (mig_smi / "smi-q.txt").write_text("")  # MIG turned off, or nvidia-smi not answering
    run(tmp_path / "map", "epilog", **env)
    assert all(jobs == [] for jobs in exporter_view(tmp_path / "map").values())


# Slurm's MIG GRES: in the Prolog/Epilog SLURM_JOB_GPUS holds the GRES indices of the MIG devices
# and CUDA_VISIBLE_DEVICES their UUIDs (gres_common.c:670-710 @slurm-22-05-8-1)
MIG_2 = "MIG-00000002-0000-0000-0000-000000000002"  # 1g.10gb, device 2: GPU instance 9
MIG_3 = "MIG-00000003-0000-0000-0000-000000000003"  # 1g.10gb, device 3: GPU instance 10


def test_mig_gres_devices_map_to_their_gpu_instances_not_to_the_gres_indices(tmp_path, mig_smi):
    env = {"SLURM_JOB_ID": "41", "SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": f"{MIG_2},{MIG_3}",
           "DCGM_HPC_JOB_MAPPING_INSTANCES": "1", "PATH": f"{mig_smi}:{os.environ['PATH']}"}  # fmt: skip
    assert run(tmp_path / "map", "prolog", **env).returncode == 0
    assert exporter_view(tmp_path / "map") == {"0.9": ["41"], "0.10": ["41"]}
    assert run(tmp_path / "map", "epilog", **env).returncode == 0
    assert exporter_view(tmp_path / "map") == {"0.9": [], "0.10": []}


def test_mig_gres_devices_are_not_mapped_for_exporters_that_cannot_key_instances(tmp_path, mig_smi):
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "2", "CUDA_VISIBLE_DEVICES": MIG_2,
           "PATH": f"{mig_smi}:{os.environ['PATH']}"}  # fmt: skip
    assert run(tmp_path / "map", "prolog", **env).returncode == 0
    assert exporter_view(tmp_path / "map") == {}


def test_a_mig_device_nvidia_smi_does_not_know_is_skipped_and_the_job_still_runs(tmp_path, mig_smi):
    env = {"SLURM_JOB_ID": "43", "SLURM_JOB_GPUS": "5", "DCGM_HPC_JOB_MAPPING_INSTANCES": "1",
           "CUDA_VISIBLE_DEVICES": "MIG-ffffffff-0000-0000-0000-000000000000",
           "PATH": f"{mig_smi}:{os.environ['PATH']}"}  # fmt: skip
    assert run(tmp_path / "map", "prolog", **env).returncode == 0
    assert exporter_view(tmp_path / "map") == {}


def test_the_epilog_takes_the_job_out_of_every_file_and_no_other_jobs_line(tmp_path):
    run(tmp_path / "map", "prolog", SLURM_JOB_ID="50", SLURM_JOB_GPUS="0,1")
    run(tmp_path / "map", "prolog", SLURM_JOB_ID="51", SLURM_JOB_GPUS="1")
    (tmp_path / "map" / "1.9").write_text("50\n")  # a MIG layout of the prolog's time
    run(tmp_path / "map", "epilog", SLURM_JOB_ID="50", SLURM_JOB_GPUS="0")
    assert exporter_view(tmp_path / "map") == {"0": [], "1": ["51"], "1.9": []}
