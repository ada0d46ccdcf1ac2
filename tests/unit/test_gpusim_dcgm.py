"""The simulated nv-hostengine and dcgmi: a real TCP host engine on a free port, real dcgmi runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployer.lab.gpusim import apply_fault, build_packages, hardware_for, heal, prepare_root
from deployer.lab.gpusim.sandbox import Daemon, free_port, pick, run, unpack

DRIVER_580 = ("libnvidia-ml1_580.65.06", "libcuda1_580.65.06", "nvidia-smi_580.65.06",
              "nvidia-kernel-open-dkms_580.65.06")  # fmt: skip


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_packages(tmp_path_factory.mktemp("debs"))


def host(tmp_path: Path, debs, *, dcgm="4.4.2", cuda="13", model="H100", driver=DRIVER_580) -> Path:
    root = tmp_path / "root"
    pkgs = [*driver, f"datacenter-gpu-manager-4-core_{dcgm}"]
    if cuda:
        pkgs.append(f"datacenter-gpu-manager-4-cuda{cuda}_{dcgm}")
    unpack(pick(debs, *pkgs), root)
    prepare_root(root, hardware_for(model, 8 if model != "A100" else 4, "gpu01", model == "H100"))
    return root


def engine(root: Path, port: int) -> Daemon:
    return Daemon(
        root,
        ["/usr/bin/nv-hostengine", "-n", "-p", str(port), "--pid", "/run/nvhostengine.pid"],
        port,
    )


def dcgmi(root: Path, port: int, *args: str):
    return run(root, ["/usr/bin/dcgmi", "--host", f"127.0.0.1:{port}", *args])


@pytest.fixture
def h100(tmp_path: Path, debs):
    root = host(tmp_path, debs)
    port = free_port()
    with engine(root, port):
        yield root, port


def test_discovery_lists_every_gpu_with_bus_id_and_uuid(h100) -> None:
    root, port = h100
    res = dcgmi(root, port, "discovery", "-l")
    assert res.returncode == 0
    assert res.stdout.startswith("8 GPUs found.\n")
    for g in hardware_for("H100", 8, "gpu01", True)["gpus"]:
        assert f"PCI Bus ID: {g['pci_bus_id']}" in res.stdout
        assert f"Device UUID: {g['uuid']}" in res.stdout
    assert "4 NvSwitches found." in res.stdout


def test_discovery_drops_a_missing_gpu(h100) -> None:
    root, port = h100
    apply_fault(root, "gpu-missing", {"gpu": 6})
    res = dcgmi(root, port, "discovery", "-l")
    assert res.stdout.startswith("7 GPUs found.\n")
    assert hardware_for("H100", 8, "gpu01", True)["gpus"][6]["uuid"] not in res.stdout


def test_health_is_healthy_without_faults(h100) -> None:
    root, port = h100
    assert dcgmi(root, port, "health", "-s", "a").returncode == 0
    res = dcgmi(root, port, "health", "-c")
    assert res.returncode == 0
    assert "| Overall Health            | Healthy" in res.stdout


@pytest.mark.parametrize(
    ("kind", "params", "system"),
    [
        ("ecc-dbe", {"gpu": 2}, "Memory"),
        ("gpu-missing", {"gpu": 1}, "PCIe"),
        ("xid", {"gpu": 0, "xid": 79}, "Driver"),
    ],
)
def test_health_fails_on_a_fault(h100, kind: str, params: dict, system: str) -> None:
    root, port = h100
    apply_fault(root, kind, params)
    res = dcgmi(root, port, "health", "-c", "-j")
    assert res.returncode == 1
    body = json.loads(res.stdout)["body"]
    assert body["Overall Health"]["value"] == "Failure"
    assert body["GPU"][str(params["gpu"])]["children"][system]["value"] == "Failure"


def test_a_hot_gpu_is_a_warning_not_a_failure(h100) -> None:
    root, port = h100
    apply_fault(root, "gpu-temp", {"gpu": 3, "value": 91})
    res = dcgmi(root, port, "health", "-c")
    assert res.returncode == 0
    assert "| Overall Health            | Warning" in res.stdout


@pytest.mark.parametrize("level", ["1", "2"])
def test_diag_passes_on_a_healthy_host(h100, level: str) -> None:
    root, port = h100
    res = dcgmi(root, port, "diag", "-r", level)
    assert res.returncode == 0, res.stdout
    assert "| Driver Version Detected   | 580.65.06" in res.stdout
    assert "Fail" not in res.stdout


@pytest.mark.parametrize(
    ("kind", "params", "level", "failing_test"),
    [
        ("upgrade-validation", {}, "1", "software"),
        ("upgrade-validation", {"test": "pcie", "gpu": 4}, "2", "pcie"),
        ("ecc-dbe", {"gpu": 2}, "2", "memory"),
        ("gpu-missing", {"gpu": 0}, "1", "software"),
    ],
)
def test_diag_fails_when_the_fault_is_set(
    h100, kind: str, params: dict, level: str, failing_test: str
) -> None:
    root, port = h100
    apply_fault(root, kind, params)
    res = dcgmi(root, port, "diag", "-r", level, "-j")
    assert res.returncode == 226
    result = json.loads(res.stdout)
    failed = {t["name"] for t in result["tests"] if any(g["result"] == "Fail" for g in t["gpus"])}
    assert failing_test in failed


def test_a_validation_failure_on_a_test_outside_the_level_does_not_fail_it(h100) -> None:
    root, port = h100
    apply_fault(root, "upgrade-validation", {"test": "memory"})
    assert dcgmi(root, port, "diag", "-r", "1").returncode == 0
    assert dcgmi(root, port, "diag", "-r", "2").returncode == 226


def test_heal_makes_diag_pass_again(h100) -> None:
    root, port = h100
    apply_fault(root, "upgrade-validation", {})
    assert dcgmi(root, port, "diag", "-r", "1").returncode == 226
    heal(root)
    assert dcgmi(root, port, "diag", "-r", "1").returncode == 0


def test_diag_needs_the_cuda_variant_of_the_driver(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs, cuda="12")  # driver 580 = CUDA 13, on Hopper
    port = free_port()
    with engine(root, port):
        res = dcgmi(root, port, "diag", "-r", "1")
    assert res.returncode == 226
    assert "datacenter-gpu-manager-4-cuda13" in res.stdout


def test_volta_on_580_uses_the_cuda12_variant(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs, cuda="12", model="V100",
                driver=tuple(p.replace("open-dkms", "dkms") for p in DRIVER_580))  # fmt: skip
    port = free_port()
    with engine(root, port):
        assert dcgmi(root, port, "diag", "-r", "1").returncode == 0


def test_dcgmi_without_a_host_engine_cannot_connect(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    res = dcgmi(root, free_port(), "discovery", "-l")
    assert res.returncode == 247
    assert "Unable to connect to host engine" in res.stdout


def test_an_upgraded_dcgmi_against_the_old_engine_is_an_api_mismatch(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    port = free_port()
    with engine(root, port):
        unpack(pick(debs, "datacenter-gpu-manager-4-core_4.5.3"), root)
        res = dcgmi(root, port, "discovery", "-l")
    assert res.returncode == 247
    assert "API version mismatch" in res.stdout


@pytest.mark.parametrize("dcgm", ["4.4.2", "4.5.3"])
def test_versions_are_reported(tmp_path: Path, debs, dcgm: str) -> None:
    root = host(tmp_path, debs, dcgm=dcgm)
    for exe, flag in (
        ("/usr/bin/nv-hostengine", "--version"),
        ("/usr/bin/dcgmi", "-v"),
        ("/usr/bin/dcgmi", "--version"),
    ):
        out = run(root, [exe, flag]).stdout
        assert out.startswith(f"Version : {dcgm}\n")
        assert "SIMULATED" in out


def test_the_host_engine_refuses_to_start_on_a_driver_mismatch(tmp_path: Path, debs) -> None:
    root = host(tmp_path, debs)
    run(root, ["/usr/libexec/gpusim/nvidia-module-load"])
    unpack(pick(debs, "libnvidia-ml1_580.126.20"), root)
    res = run(
        root, ["/usr/bin/nv-hostengine", "-n", "-p", str(free_port()), "--pid", "/run/he.pid"]
    )
    assert res.returncode == 1
    assert "Driver/library version mismatch" in res.stdout


def test_the_host_engine_listens_on_loopback_only_by_default(h100) -> None:
    root, port = h100
    listening = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, hexport = local.split(":")
        if state == "0A" and int(hexport, 16) == port:  # 0A = LISTEN
            listening.add(addr)
    assert listening == {"0100007F"}  # 127.0.0.1
    assert (root / "run/nvhostengine.pid").exists()
