"""The simulated dcgmi prints what real dcgmi prints: one row per real capture.

``dcgmi discovery -l`` from three DCGM generations and ``dcgmi -v`` of 4.7.0 (all under
``gpu_reality_fixtures/dcgmi/``), compared with the simulator's output for the same model and
the simulated DCGM release of the same output generation (``N GPUs found.`` up to 4.4.x,
``N GPU(s) found (Active).`` from 4.5.0). UUIDs, bus ids and build identities are normalised;
line layout, widths and wording are compared. Adding a capture is one row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from deployer.lab.gpusim import build_packages
from deployer.lab.gpusim.sandbox import Daemon, free_port, run
from tests.reality import capture_text
from tests.unit.gpusim_captures import BUS, UUID, sim_host, smi_packages


@dataclass(frozen=True)
class Discovery:
    path: str
    dcgm: str  # the simulated DCGM release with the same output
    model: str
    count: int
    #: the capture's author trimmed the table (SOURCES.md): compare the count line and names only
    trimmed: bool = False
    #: the capture names the GPU as an older driver did (no "NVIDIA " prefix): compare the layout
    other_name: bool = False


DISCOVERIES = [
    Discovery("dcgmi/discovery-l__dcgm-2.x__a100-sxm4-40gb.txt", "4.4.2", "A100", 8,
              other_name=True),
    Discovery("dcgmi/discovery-l__dcgm-3.x__h200.txt", "4.4.2", "H200", 1),
    Discovery("dcgmi/discovery-l__dcgm-4.x-active__a10g.txt", "4.5.3", "A10", 1, trimmed=True),
]  # fmt: skip


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_packages(tmp_path_factory.mktemp("debs"))


def dcgm_host(tmp_path: Path, debs, dcgm: str, model: str, count: int) -> Path:
    pkgs = (*smi_packages("580.65.06"), f"datacenter-gpu-manager-4-core_{dcgm}")
    return sim_host(tmp_path / "root", debs, pkgs, model, count)


def dcgmi(root: Path, *args: str) -> str:
    port = free_port()
    engine = ["/usr/bin/nv-hostengine", "-n", "-p", str(port), "--pid", "/run/he.pid"]
    with Daemon(root, engine, port):
        res = run(root, ["/usr/bin/dcgmi", "--host", f"127.0.0.1:{port}", *args])
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def normal(text: str, other_name: bool = False) -> list[str]:
    text = BUS.sub("<BUS>", UUID.sub("<UUID>", text))
    lines = text.rstrip("\n").split("\n")
    if other_name:  # keep the cell's width: the name is padded inside it
        lines = [re.sub(r"Name: (\S.*?)(\s*\|)$", lambda m: "Name: <NAME>" + " " * (
            len(m.group(1)) - 6) + m.group(2), ln) for ln in lines]  # fmt: skip
    return lines


@pytest.mark.parametrize("cap", DISCOVERIES, ids=[d.path.split("__")[1] for d in DISCOVERIES])
def test_discovery_prints_the_captured_lines(tmp_path: Path, debs, cap: Discovery) -> None:
    real = capture_text(cap.path)
    sim = dcgmi(dcgm_host(tmp_path, debs, cap.dcgm, cap.model, cap.count), "discovery", "-l")
    if cap.trimmed:
        first, *rest = real.splitlines()
        assert sim.splitlines()[0] == first
        names = [ln.split("|")[2].strip() for ln in rest if "Name:" in ln]
        assert [ln.split("|")[2].strip() for ln in sim.splitlines() if "Name:" in ln] == names
        return
    want = normal(real, cap.other_name)
    assert normal(sim, cap.other_name)[: len(want)] == want


def test_dcgmi_version_prints_the_captured_blocks_and_keys(tmp_path: Path, debs) -> None:
    real = capture_text("dcgmi/dcgmi-v__dcgm-4.7.0.txt")
    sim = dcgmi(dcgm_host(tmp_path, debs, "4.6.0", "H100", 1), "-v")

    def keys(text: str) -> list[str]:
        return [ln.split(" : ")[0] if " : " in ln else ln for ln in text.rstrip("\n").split("\n")]

    assert keys(sim) == keys(real)
    assert re.search(r"^Version : 4\.6\.0$", sim, re.M)
