"""roles/nvidia_driver/files/nvidia-driver-check on real nvidia-smi and /proc output.

The script runs for real: a stand-in ``nvidia-smi`` first on PATH answers its queries from a real
capture (tests/contract/standins.py), ``GPUMON_PROCFS`` points it at a folder whose
``driver/nvidia/version`` is one real line of ``driver-misc/proc-driver-nvidia-version.txt``, and a
stand-in ``dpkg-query`` names the installed package's version (Debian's format, not GPU output).

One row per (subcommand, captures fed) -> (exit status, stdout lines, stderr lines).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.contract import standins
from tests.reality import capture, capture_text

SCRIPT = Path(__file__).resolve().parents[2] / "roles/nvidia_driver/files/nvidia-driver-check"

H100 = "nvidia_gpu_exporter/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
H100_MIG = "nvidia_gpu_exporter/linux-x86_64__nvidia-h100-mig__590.48.01.txt"
H200 = "nvidia_gpu_exporter/linux-x86_64__nvidia-h200__590.48.01.txt"
H200_MIG = "nvidia_gpu_exporter/linux-x86_64__nvidia-h200-mig__590.48.01.txt"
L40S = "nvidia_gpu_exporter/linux-x86_64__nvidia-l40s__595.80.txt"
# proposed for ../shared (tests/reality.py PROPOSED): R610 deprecates driver_version, still answers
H200_610 = "nvidia_gpu_exporter/linux-x86_64__nvidia-h200__610.43.02.txt"
H200_MIG_580 = "nvidia_gpu_exporter/linux-x86_64__nvidia-h200-mig__580.173.02.txt"  # MIG on
# GeForce boards (proposed too): R595's 595.71.05, R610's 610.57.04 (KMD Version in its texts)
RTX2080S_610 = "nvidia_gpu_exporter/linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04.txt"
RTX4080S_595 = "nvidia_gpu_exporter/linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.txt"
MISMATCH = "driver-misc/nvidia-smi-mismatch.txt"  # NVML mismatch; exit 18 (SOURCES.md)
PROC = "driver-misc/proc-driver-nvidia-version.txt"  # line 1: 515.76, line 2: 580.159.04


@dataclass(frozen=True)
class Row:
    args: tuple[str, ...]
    smi: str | None  # capture answering nvidia-smi (None: no nvidia-smi)
    run: str = "idle"  # the capture's run: idle or load
    proc_line: int | None = None  # line of PROC as /proc/driver/nvidia/version (None: absent)
    installed: str | None = None  # dpkg-query's ${Version} of the package asked
    rc: int = 0
    stdout: tuple[str, ...] = ()
    stderr: tuple[str, ...] = ()
    # nvidia-smi as a driver that has dropped driver_version for kmd_version would answer
    # (tests/contract/standins.py nvidia_smi, docs/unverified.md#nvidia-smi-without-driver-version)
    renamed: bool = False


PKG = "nvidia-open"
# fmt: off
ROWS = [
    # --- which kernel module is loaded: the NVRM line of /proc/driver/nvidia/version
    Row(("reboot-needed", "515.76"), None, proc_line=1, rc=1),
    Row(("reboot-needed", "580.159.04"), None, proc_line=1, rc=0),
    Row(("reboot-needed", "580.159.04"), None, proc_line=2, rc=1),
    Row(("reboot-needed", "590.48.01"), None, proc_line=2, rc=0),
    Row(("reboot-needed", "590.48.01"), None, proc_line=None, rc=0),
    # --- verify: loaded == installed == nvidia-smi == planned on COUNT GPUs
    Row(("verify", "590.48.01", "1", PKG), H100, proc_line=2, installed="590.48.01-1", rc=1,
        stderr=("loaded kernel module is 580.159.04, planned 590.48.01 (reboot required)",)),
    Row(("verify", "590.48.01", "1", PKG), H100_MIG, proc_line=2, installed="590.48.01-1", rc=1,
        stderr=("loaded kernel module is 580.159.04, planned 590.48.01 (reboot required)",)),
    Row(("verify", "590.48.01", "2", PKG), H200_MIG, proc_line=2, installed="590.48.01-1", rc=1,
        stderr=("loaded kernel module is 580.159.04, planned 590.48.01 (reboot required)",
                "nvidia-smi sees 1 GPUs, the inventory's gpu_count is 2")),
    Row(("verify", "580.159.04", "1", PKG), H200, proc_line=2, installed="580.159.04-1", rc=1,
        stderr=("nvidia-smi reports driver 590.48.01, planned 580.159.04",)),
    Row(("verify", "580.173.02", "1", PKG), H200_MIG_580, proc_line=2, installed="580.173.02-1",
        rc=1, stderr=("loaded kernel module is 580.159.04, planned 580.173.02 (reboot required)",)),
    Row(("verify", "595.80", "1", PKG), L40S, proc_line=1, installed="1:595.80-1", rc=1,
        stderr=("loaded kernel module is 515.76, planned 595.80 (reboot required)",)),
    Row(("verify", "610.43.02", "1", PKG), H200_610, proc_line=None, installed="610.43.02-1",
        rc=1, stderr=("loaded kernel module is none, planned 610.43.02 (reboot required)",)),
    Row(("verify", "595.80", "1", PKG), L40S, proc_line=1, installed="1:595.80-1", rc=1,
        stderr=("loaded kernel module is 515.76, planned 595.80 (reboot required)",),
        renamed=True),
    Row(("verify", "610.57.04", "1", PKG), RTX2080S_610, proc_line=None,
        installed="610.57.04-1", rc=1,
        stderr=("loaded kernel module is none, planned 610.57.04 (reboot required)",)),
    Row(("verify", "595.71.05", "2", PKG), RTX4080S_595, proc_line=1, installed="595.71.05-1",
        rc=1, stderr=("loaded kernel module is 515.76, planned 595.71.05 (reboot required)",
                      "nvidia-smi sees 1 GPUs, the inventory's gpu_count is 2")),
    Row(("verify", "610.43.02", "1", PKG), RTX2080S_610, proc_line=None,
        installed="610.43.02-1", rc=1,
        stderr=("loaded kernel module is none, planned 610.43.02 (reboot required)",
                "nvidia-smi reports driver 610.57.04, planned 610.43.02")),
    Row(("verify", "515.76", "2", PKG), L40S, proc_line=1, installed="515.76-1", rc=1,
        stderr=("nvidia-smi reports driver 595.80, planned 515.76",
                "nvidia-smi sees 1 GPUs, the inventory's gpu_count is 2"), renamed=True),
    Row(("verify", "580.159.04", "1", PKG), MISMATCH, proc_line=2, installed="580.159.04-1", rc=1,
        stderr=("nvidia-smi fails: Failed to initialize NVML: Driver/library version mismatch "
                "NVML library version: 610.43",)),
    # --- busy: GPU compute processes (nvidia-smi --query-compute-apps)
    Row(("busy",), H100, "load", rc=0, stdout=("11327, /root/tools/memhog, 2566 MiB",
        "11328, /root/tools/memhog, 1542 MiB", "11345, ./gpu_burn, 15690 MiB")),
    Row(("busy",), L40S, "load", rc=0,
        stdout=("20037, ffmpeg, 538 MiB", "20038, ffmpeg, 681 MiB")),
    Row(("busy",), H200_MIG, "idle", rc=1),
    Row(("busy",), RTX2080S_610, "load", rc=0,
        stdout=("28512, ffmpeg, 370 MiB", "28511, ffmpeg, 230 MiB")),
    # a desktop's compositor holds the idle GeForce: busy as any process that holds a GPU
    Row(("busy",), RTX4080S_595, "idle", rc=0, stdout=("2165, /usr/bin/kwin_wayland, 25 MiB",)),
    # nvidia-smi cannot answer: the /dev/nvidia* holders of GPUMON_PROCFS (none here)
    Row(("busy",), MISMATCH, rc=1),
]
# fmt: on


def row_id(r: Row) -> str:
    name = Path(r.smi).name if r.smi else "no-nvidia-smi"
    source = name.split("__")[1] if "__" in name else Path(name).stem
    kmd = "-kmd_version" if r.renamed else ""
    return f"{'-'.join(r.args[:2])}-{source}-{r.run}-proc{r.proc_line}{kmd}"


@pytest.mark.parametrize("row", ROWS, ids=[row_id(r) for r in ROWS])
def test_nvidia_driver_check_on_real_output(row: Row, tmp_path: Path):
    bindir, procfs = tmp_path / "bin", tmp_path / "proc"
    (procfs / "driver" / "nvidia").mkdir(parents=True)
    (procfs / "modules").write_text("")
    if row.proc_line is not None:
        line = capture_text(PROC).splitlines()[row.proc_line - 1]
        (procfs / "driver/nvidia/version").write_text(line + "\n")
    if row.smi == MISMATCH:
        standins.printing(bindir, "nvidia-smi", None, capture(MISMATCH), rc=18)
    elif row.smi is not None:
        standins.nvidia_smi(bindir, capture(row.smi), row.run, renamed=row.renamed)
    standins.dpkg_query(bindir, {PKG: row.installed} if row.installed else {})
    proc = subprocess.run(
        ["sh", str(SCRIPT), *row.args], capture_output=True, text=True, timeout=60,
        env=standins.environment(bindir, GPUMON_PROCFS=str(procfs)),
    )  # fmt: skip
    got = (proc.returncode, tuple(proc.stdout.splitlines()), tuple(proc.stderr.splitlines()))
    assert got == (row.rc, row.stdout, row.stderr)
