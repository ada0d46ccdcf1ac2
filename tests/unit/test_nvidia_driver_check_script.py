"""roles/nvidia_driver/files/nvidia-driver-check where no capture reaches: the path it takes when
nvidia-smi cannot answer, and the passing verification (the real captures run in
tests/contract/test_nvidia_driver_check.py; none of them pairs an nvidia-smi capture with the
/proc line of the same driver)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.dpkgdb import Instance, needs_dpkg, write_db

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "roles/nvidia_driver/files/nvidia-driver-check"
# the real line of ../shared/gpu_reality_fixtures/driver-misc/proc-driver-nvidia-version.txt
NVRM = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Wed Apr 29 17:32:45 UTC 2026\n"


def tool(bindir: Path, name: str, body: str) -> None:
    bindir.mkdir(exist_ok=True)
    (bindir / name).write_text("#!/bin/sh\n" + body)
    (bindir / name).chmod(0o755)


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
           "GPUMON_PROCFS": str(tmp_path / "proc")}  # fmt: skip
    return subprocess.run(["sh", str(SCRIPT), *args], capture_output=True, text=True, env=env)


def fake_proc(tmp_path: Path, holders: dict[int, tuple[str, str]]) -> None:
    """GPUMON_PROCFS with the NVRM line and processes {pid: (comm, device their fd 3 opens)}."""
    proc = tmp_path / "proc"
    (proc / "driver/nvidia").mkdir(parents=True)
    (proc / "driver/nvidia/version").write_text(NVRM)
    (proc / "modules").write_text("nvidia 100 0 - Live 0x0\n")
    for pid, (comm, device) in holders.items():
        (proc / str(pid) / "fd").mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")
        (proc / str(pid) / "fd" / "3").symlink_to(device)


def test_without_nvidia_smi_busy_lists_processes_holding_a_gpu_device(tmp_path):
    fake_proc(tmp_path, {4242: ("python3", "/dev/nvidia0"), 77: ("nv-hostengine", "/dev/nvidia0"),
                         99: ("bash", "/dev/null")})  # fmt: skip
    tool(tmp_path / "bin", "nvidia-smi", "echo 'Failed to initialize NVML'; exit 18\n")
    proc = run(tmp_path, "busy")
    assert proc.returncode == 0 and proc.stdout.splitlines() == ["4242, python3, (device open)"]


def test_without_nvidia_smi_only_the_gpu_daemons_holding_devices_is_not_busy(tmp_path):
    fake_proc(
        tmp_path, {77: ("nv-hostengine", "/dev/nvidia0"), 78: ("dcgm-exporter", "/dev/nvidiactl")}
    )
    tool(tmp_path / "bin", "nvidia-smi", "exit 18\n")
    assert run(tmp_path, "busy").returncode == 1


SMI_TWO_GPUS = (
    "580.159.04, GPU-1f027ee8-6e1e-2b8c-0108-3d370e5f0418\\n"
    "580.159.04, GPU-9e5b8fec-61bf-5124-a0a9-079af1b65cc6\\n"
)


@needs_dpkg
def test_verify_passes_when_loaded_installed_and_nvidia_smi_agree_on_every_gpu(tmp_path):
    fake_proc(tmp_path, {})
    tool(tmp_path / "bin", "nvidia-smi", f"printf '{SMI_TWO_GPUS}'\n")
    write_db(tmp_path, tmp_path / "bin", "amd64", Instance("nvidia-open", "amd64", "580.159.04-1"))
    proc = run(tmp_path, "verify", "580.159.04", "2", "nvidia-open")
    assert (proc.returncode, proc.stderr) == (0, "")


@needs_dpkg
def test_verify_reads_the_native_installed_instance_of_the_package(tmp_path):
    """Real dpkg-query on a host with i386 enabled: the package's 32-bit instance, listed after
    the native one, does not stand for it; a package removed with its configuration files left
    is not installed, whatever version dpkg still names for it."""
    fake_proc(tmp_path, {})
    tool(tmp_path / "bin", "nvidia-smi", f"printf '{SMI_TWO_GPUS}'\n")
    lib = "libnvidia-compute-580"
    write_db(tmp_path / "a", tmp_path / "bin", "amd64",
             Instance(lib, "i386", "580.126.20-1", "ii"), Instance(lib, "amd64", "580.159.04-1"))  # fmt: skip
    assert run(tmp_path, "verify", "580.159.04", "2", lib).returncode == 0

    write_db(tmp_path / "b", tmp_path / "bin", "amd64",
             Instance(lib, "amd64", "580.159.04-1", "rc"), Instance(lib, "i386", "580.159.04-1"))  # fmt: skip
    proc = run(tmp_path, "verify", "580.159.04", "2", lib)
    assert proc.returncode == 1 and f"installed driver ({lib}) is absent" in proc.stderr


def test_a_loaded_nouveau_needs_a_reboot_even_at_the_planned_version(tmp_path):
    fake_proc(tmp_path, {})
    (tmp_path / "proc/modules").write_text("nouveau 2000 0 - Live 0x0\n")
    assert run(tmp_path, "reboot-needed", "580.159.04").returncode == 0
