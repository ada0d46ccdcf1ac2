"""The product reads what every simulated driver release prints: the facts script (nvidia-smi's
driver and GPUs, the loaded module) and ``nvidia-driver-check verify``, on a simulated host of
each release of the catalog, R610's layout (``KMD Version``, ``driver_version`` deprecated)
included.

The simulator is held to the real captures release by release (``test_gpusim_reality_smi.py``);
this holds the product's readers to the simulator, so a release the lab can install is one the
product can read.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from deployer.connection import CommandResult
from deployer.facts import FACTS_SCRIPT, parse_facts
from deployer.lab.gpusim import build_packages, catalog
from deployer.lab.gpusim.sandbox import env_for
from tests.contract import standins
from tests.unit.gpusim_captures import sim_host, smi, smi_packages

CHECK = Path(__file__).resolve().parents[2] / "roles/nvidia_driver/files/nvidia-driver-check"
RELEASES = [d.version for d in catalog.DRIVERS]


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_packages(tmp_path_factory.mktemp("debs"))


def booted(tmp_path: Path, debs: list[Path], version: str) -> tuple[Path, dict[str, str]]:
    """A simulated two-GPU H200 host of ``version`` whose module is loaded (the first nvidia-smi
    loads it, as at boot), and the environment a script on it runs in."""
    root = sim_host(tmp_path / "root", debs, smi_packages(version), "H200", 2)
    smi(root, "-L")
    procfs = tmp_path / "proc"
    procfs.mkdir()
    (procfs / "driver").symlink_to(root / "run/gpusim/proc-driver")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").symlink_to(root / "usr/bin/nvidia-smi")
    standins.dpkg_query(bindir, {"nvidia-open": f"{version}-1"})
    env = standins.environment(bindir, GPUMON_PROCFS=str(procfs))
    env["GPUSIM_ROOT"] = env_for(root)["GPUSIM_ROOT"]
    return root, env


def on(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("version", RELEASES)
def test_the_facts_read_the_driver_and_gpus_every_simulated_release_prints(
    tmp_path: Path, debs, version: str
) -> None:
    _, env = booted(tmp_path, debs, version)
    proc = on(env, "sh", "-c", FACTS_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    f = parse_facts("gpu01", CommandResult("facts", 0, proc.stdout, proc.stderr))
    assert (f.nvidia_smi, f.driver_smi, f.driver_loaded) == ("ok", version, version)
    assert [g.name for g in f.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert not f.reboot_required and not f.nvml_mismatch


@pytest.mark.parametrize("version", RELEASES)
def test_nvidia_driver_check_verifies_every_simulated_release(
    tmp_path: Path, debs, version: str
) -> None:
    _, env = booted(tmp_path, debs, version)
    ok = on(env, str(CHECK), "verify", version, "2", "nvidia-open")
    assert ok.returncode == 0, ok.stderr
    wrong = on(env, str(CHECK), "verify", version, "4", "nvidia-open")
    assert wrong.returncode == 1
    assert "nvidia-smi sees 2 GPUs, the inventory's gpu_count is 4" in wrong.stderr
