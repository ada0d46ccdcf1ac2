"""The simulated kernel module and NVML fail and report as the real ones: one row per capture
of ``gpu_reality_fixtures/driver-misc/``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deployer.lab.gpusim import build_packages
from deployer.lab.gpusim.sandbox import pick, run, unpack
from tests.reality import capture_text
from tests.unit.gpusim_captures import sim_host


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_packages(tmp_path_factory.mktemp("debs"))


def shape(line: str) -> str:
    line = re.sub(r"\b\d+\.\d+(\.\d+)?\b", "<VERSION>", line)
    line = re.sub(r"(Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \w+ \d{4}",
                  "<DATE>", line)  # fmt: skip
    return line


@pytest.mark.parametrize("n", [0, 1])
def test_the_proprietary_module_version_line_is_the_captured_one(tmp_path, debs, n: int) -> None:
    real = capture_text("driver-misc/proc-driver-nvidia-version.txt").splitlines()[n]
    pkgs = ("libnvidia-ml1_535.54.03", "nvidia-kernel-dkms_535.54.03")
    root = sim_host(tmp_path / "root", debs, pkgs, "V100", 1)
    assert run(root, ["/usr/libexec/gpusim/nvidia-module-load"]).returncode == 0
    sim = (root / "run/gpusim/proc-driver/nvidia/version").read_text().splitlines()[0]
    assert shape(sim) == shape(real)


def test_the_captured_r580_release_prints_its_captured_line_exactly(tmp_path, debs) -> None:
    """580.159.04, the release of the capture's second line, is one the simulator carries: its
    module prints that very line, version and build date."""
    real = capture_text("driver-misc/proc-driver-nvidia-version.txt").splitlines()[1]
    pkgs = ("libnvidia-ml1_580.159.04", "nvidia-kernel-dkms_580.159.04")
    root = sim_host(tmp_path / "root", debs, pkgs, "V100", 1)
    assert run(root, ["/usr/libexec/gpusim/nvidia-module-load"]).returncode == 0
    sim = (root / "run/gpusim/proc-driver/nvidia/version").read_text().splitlines()[0]
    assert sim == real


def test_a_library_newer_than_the_module_fails_as_captured(tmp_path: Path, debs) -> None:
    real = capture_text("driver-misc/nvidia-smi-mismatch.txt")
    old = ("libnvidia-ml1_580.65.06", "libcuda1_580.65.06", "nvidia-smi_580.65.06",
           "nvidia-kernel-open-dkms_580.65.06")  # fmt: skip
    root = sim_host(tmp_path / "root", debs, old, "H100", 1)
    assert run(root, ["/usr/bin/nvidia-smi", "-L"]).returncode == 0  # loads 580.65.06
    unpack(pick(debs, "libnvidia-ml1_580.126.20", "nvidia-smi_580.126.20"), root)
    res = run(root, ["/usr/bin/nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    # "exit 18, the NVML line on STDOUT" (SOURCES.md)
    assert res.returncode == 18
    assert [shape(x) for x in res.stdout.splitlines()] == [shape(x) for x in real.splitlines()]
