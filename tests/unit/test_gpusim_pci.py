"""The SIMULATED PCI bus of a lab GPU host (deployer/lab/gpusim/pci.py): what its boot script
makes is what the product's facts read on bare metal before any driver."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from deployer.connection import CommandResult
from deployer.facts import FACTS_SCRIPT, parse_facts
from deployer.gpu.matrix import models_from_gpu_names
from deployer.lab.gpusim import hardware_for, pci


def test_every_gpu_and_nvswitch_is_a_function_at_its_nvidia_smi_bus_address():
    found = pci.functions(hardware_for("H100", 8, "gpu01", True))
    gpus = [f for f in found if f[2] == pci.GPU_CLASS]
    assert [f[0] for f in gpus][:2] == ["0000:18:00.0", "0000:2a:00.0"]  # sysfs: lowercase
    assert {(f[1], f[3]) for f in gpus} == {("0x10de", "0x2330")} and len(gpus) == 8
    assert len([f for f in found if f[2] == pci.NVSWITCH_CLASS]) == 4
    assert pci.HOST_BRIDGE in found  # not NVIDIA's: the facts skip it


def test_the_bus_id_nvidia_smi_prints_is_the_sysfs_address():
    assert pci.sysfs_address("00000000:9A:00.0") == "0000:9a:00.0"
    assert pci.sysfs_address("00000001:1B:00.0") == "0001:1b:00.0"


def booted_bus(tmp_path: Path, hardware: dict) -> Path:
    """Run the boot script with its directories under ``tmp_path`` and ``mount --bind`` as a
    link (no mount here); the bus directory the facts then read."""
    bus = tmp_path / "sys-bus-pci-devices"
    bus.mkdir()
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "mountpoint").write_text("#!/bin/sh\nexit 1\n")
    (stubs / "mount").write_text('#!/bin/sh\nrmdir "$3" && ln -s "$2" "$3"\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    script = pci.bus_script(hardware)
    script = script.replace(pci.BUS_DIR, str(tmp_path / "run-pci")).replace(
        pci.SYSFS_DEVICES, str(bus)
    )
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"}
    subprocess.run(["sh", "-c", script], check=True, env=env)
    return bus


@pytest.mark.parametrize(("model", "count", "nvswitch"), [("H100", 8, True), ("L40S", 2, False)])
def test_the_facts_read_the_model_from_the_simulated_bus_before_any_driver(
    tmp_path, model, count, nvswitch
):
    bus = booted_bus(tmp_path, hardware_for(model, count, "gpu01", nvswitch))
    out = subprocess.run(
        ["sh", "-c", FACTS_SCRIPT.replace("/sys/bus/pci/devices", str(bus))],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"},
    ).stdout  # fmt: skip
    f = parse_facts("gpu01", CommandResult("", 0, out, ""))
    assert f.nvidia_pci_gpus == count and f.nvidia_pci_switches == (4 if nvswitch else 0)
    assert f.nvswitch is nvswitch
    names, source = f.gpu_names()
    assert source == "the PCI bus"
    assert list(models_from_gpu_names(names)[0]) == [model]


def test_the_unit_is_enabled_at_sysinit_and_marked_simulated(tmp_path):
    pci.prepare_root(tmp_path, hardware_for("H200", 8, "gpu02", True))
    link = tmp_path / "etc/systemd/system/sysinit.target.wants" / pci.UNIT
    assert os.readlink(link) == f"/etc/systemd/system/{pci.UNIT}"
    assert "SIMULATED" in (tmp_path / "etc/systemd/system" / pci.UNIT).read_text()
    script = tmp_path / pci.SCRIPT
    assert os.access(script, os.X_OK) and "SIMULATED" in script.read_text().splitlines()[1]
    pci.prepare_root(tmp_path, hardware_for("H200", 8, "gpu02", True))  # again: the same
