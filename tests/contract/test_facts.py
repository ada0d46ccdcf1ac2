"""deployer/facts.py on real nvidia-smi and /proc output: the facts script runs for real.

FACTS_SCRIPT runs here with ``sh -c`` as on a host: a stand-in ``nvidia-smi`` first on PATH answers
the script's own ``--query-gpu`` from a real capture (tests/contract/standins.py), or prints the
real NVML mismatch and exits 18; ``GPUMON_PROCFS`` points at a folder whose
``driver/nvidia/version`` is one real line of ``driver-misc/proc-driver-nvidia-version.txt``;
dpkg-query knows no NVIDIA package. ``parse_facts`` reads the output.

One row per (capture, run, /proc line) -> (GPUs as facts list them, the model each GPU name maps
to, nvidia-smi state, driver versions, mismatch). Adding a capture is one row.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from deployer.connection import CommandResult
from deployer.facts import FACTS_SCRIPT, GPU, parse_facts
from deployer.gpu.matrix import model_from_gpu_name
from deployer.gpu.rules import check
from deployer.gpu.version_plan import plan_from_vars
from tests.contract import standins
from tests.reality import capture, capture_text

H100 = "nvidia_gpu_exporter/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
H100_MIG = "nvidia_gpu_exporter/linux-x86_64__nvidia-h100-mig__590.48.01.txt"
H200 = "nvidia_gpu_exporter/linux-x86_64__nvidia-h200__590.48.01.txt"
H200_MIG = "nvidia_gpu_exporter/linux-x86_64__nvidia-h200-mig__590.48.01.txt"
L40S = "nvidia_gpu_exporter/linux-x86_64__nvidia-l40s__595.80.txt"
# proposed for ../shared (tests/reality.py PROPOSED): their rows skip until they join it. R610's
# --help-query-gpu calls driver_version "Deprecated; use kmd_version instead": still answered.
H200_580 = "nvidia_gpu_exporter/linux-x86_64__nvidia-h200__580.173.02.txt"
H200_610 = "nvidia_gpu_exporter/linux-x86_64__nvidia-h200__610.43.02.txt"
H200_MIG_580 = "nvidia_gpu_exporter/linux-x86_64__nvidia-h200-mig__580.173.02.txt"
# GeForce boards, no model of the matrix (proposed too): R595's 595.71.05 and R610's 610.57.04
RTX2080S_595 = "nvidia_gpu_exporter/linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05.txt"
RTX2080S_610 = "nvidia_gpu_exporter/linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04.txt"
RTX4080S_595 = "nvidia_gpu_exporter/linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.txt"
MISMATCH = "driver-misc/nvidia-smi-mismatch.txt"
PROC = "driver-misc/proc-driver-nvidia-version.txt"  # line 1: 515.76, line 2: 580.159.04

MASKED = "GPU-00000000-0000-0000-0000-000000000000"  # the nvidia_gpu_exporter captures mask UUIDs


@dataclass(frozen=True)
class Row:
    smi: str | None  # capture answering nvidia-smi (None: no nvidia-smi on the host)
    run: str  # idle | load
    proc_line: int | None  # line of PROC as /proc/driver/nvidia/version (None: no module)
    gpus: tuple[GPU, ...]
    models: tuple[str | None, ...]  # compat.model_from_gpu_name of each GPU's name
    nvidia_smi: str  # absent | ok | error
    driver_smi: str | None
    driver_loaded: str | None
    reboot_required: bool
    nvml_mismatch: bool = False
    nvml_library_version: str | None = None
    # nvidia-smi as a driver that has dropped driver_version for kmd_version would answer
    # (tests/contract/standins.py nvidia_smi, docs/unverified.md#nvidia-smi-without-driver-version)
    renamed: bool = False


def gpu(name: str, mem: int, bus: str, mig: str) -> GPU:
    return GPU(0, MASKED, name, mem, bus, mig, mig_enabled=mig == "Enabled")


H100_GPU = gpu("NVIDIA H100 80GB HBM3", 81559, "00000000:00:09.0", "Disabled")
H100_MIG_GPU = gpu("NVIDIA H100 80GB HBM3", 81559, "00000000:00:09.0", "Enabled")
H200_GPU = gpu("NVIDIA H200", 143771, "00000000:83:00.0", "Disabled")
H200_MIG_GPU = gpu("NVIDIA H200", 143771, "00000000:83:00.0", "Enabled")
L40S_GPU = gpu("NVIDIA L40S", 46068, "00000000:01:00.0", "[N/A]")
RTX2080S_GPU = gpu("NVIDIA GeForce RTX 2080 SUPER", 8192, "00000000:0C:00.0", "[N/A]")
RTX4080S_GPU = gpu("NVIDIA GeForce RTX 4080 SUPER", 16376, "00000000:01:00.0", "[N/A]")

# fmt: off
ROWS = [
    #   nvidia-smi   run     /proc  GPUs             models   smi    driver_smi   loaded      reboot
    Row(H100,       "idle",  2,     (H100_GPU,),     ("H100",), "ok", "590.48.01", "580.159.04", True),
    Row(H100,       "load",  None,  (H100_GPU,),     ("H100",), "ok", "590.48.01", None,         False),
    Row(H100_MIG,   "idle",  None,  (H100_MIG_GPU,), ("H100",), "ok", "590.48.01", None,         False),
    Row(H100_MIG,   "load",  2,     (H100_MIG_GPU,), ("H100",), "ok", "590.48.01", "580.159.04", True),
    Row(H200,       "idle",  None,  (H200_GPU,),     ("H200",), "ok", "590.48.01", None,         False),
    Row(H200_MIG,   "load",  None,  (H200_MIG_GPU,), ("H200",), "ok", "590.48.01", None,         False),
    Row(H200_580,   "idle",  None,  (H200_GPU,),     ("H200",), "ok", "580.173.02", None,        False),
    Row(H200_610,   "idle",  None,  (H200_GPU,),     ("H200",), "ok", "610.43.02", None,         False),
    Row(H200_MIG_580, "idle", None, (H200_MIG_GPU,), ("H200",), "ok", "580.173.02", None,        False),
    Row(L40S,       "idle",  1,     (L40S_GPU,),     ("L40S",), "ok", "595.80",    "515.76",     True),
    Row(L40S,       "load",  None,  (L40S_GPU,),     ("L40S",), "ok", "595.80",    None,         False),
    Row(RTX2080S_595, "idle", 1,    (RTX2080S_GPU,), (None,), "ok", "595.71.05", "515.76",   True),
    Row(RTX2080S_610, "load", None, (RTX2080S_GPU,), (None,), "ok", "610.57.04", None,       False),
    Row(RTX4080S_595, "idle", None, (RTX4080S_GPU,), (None,), "ok", "595.71.05", None,       False),
    Row(MISMATCH,   "idle",  2,     (),              (),     "error", None,        "580.159.04", True,
        nvml_mismatch=True, nvml_library_version="610.43"),
    Row(None,       "idle",  1,     (),              (),    "absent", None,        "515.76",     False),
    Row(L40S,       "idle",  1,     (L40S_GPU,),     ("L40S",), "ok", "595.80",    "515.76",     True,
        renamed=True),
    Row(L40S,       "load",  None,  (L40S_GPU,),     ("L40S",), "ok", "595.80",    None,         False,
        renamed=True),
]
# fmt: on


def row_id(r: Row) -> str:
    name = Path(r.smi).name if r.smi else "no-nvidia-smi"
    parts = Path(name).stem.split("__")
    source = f"{parts[1]}-{parts[2]}" if len(parts) == 3 else parts[0]
    return f"{source}-{r.run}-proc{r.proc_line}" + ("-kmd_version" if r.renamed else "")


def gather_here(tmp_path: Path, row: Row) -> CommandResult:
    bindir, procfs = tmp_path / "bin", tmp_path / "proc"
    (procfs / "driver/nvidia").mkdir(parents=True)
    if row.proc_line is not None:
        line = capture_text(PROC).splitlines()[row.proc_line - 1]
        (procfs / "driver/nvidia/version").write_text(line + "\n")
    if row.smi == MISMATCH:
        standins.printing(bindir, "nvidia-smi", None, capture(MISMATCH), rc=18)
    elif row.smi is not None:
        standins.nvidia_smi(bindir, capture(row.smi), row.run, renamed=row.renamed)
    standins.dpkg_query(bindir, {})
    proc = subprocess.run(
        ["sh", "-c", FACTS_SCRIPT], capture_output=True, text=True, timeout=60,
        env=standins.environment(bindir, GPUMON_PROCFS=str(procfs)),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return CommandResult("facts", proc.returncode, proc.stdout, proc.stderr)


@pytest.mark.parametrize("row", ROWS, ids=[row_id(r) for r in ROWS])
def test_facts_of_a_host_printing_real_output(row: Row, tmp_path: Path):
    f = parse_facts("gpu01", gather_here(tmp_path, row))
    assert tuple(f.gpus) == row.gpus
    assert tuple(model_from_gpu_name(g.name) for g in f.gpus) == row.models
    assert (f.nvidia_smi, f.driver_smi, f.driver_loaded, f.reboot_required) == (
        row.nvidia_smi, row.driver_smi, row.driver_loaded, row.reboot_required,
    )  # fmt: skip
    assert (f.nvml_mismatch, f.nvml_library_version) == (
        row.nvml_mismatch,
        row.nvml_library_version,
    )
    if row.driver_loaded:
        assert f.kernel_module_flavour == "proprietary"  # both real /proc lines are proprietary


@pytest.mark.parametrize("path", [RTX2080S_595, RTX2080S_610, RTX4080S_595],
                         ids=["2080-super-595", "2080-super-610", "4080-super-595"])  # fmt: skip
def test_a_gpu_of_no_model_the_matrix_lists_is_refused_by_the_name_it_prints(path, tmp_path: Path):
    """A GeForce board where the inventory says a datacenter model: the facts' GPU names (what
    the preflight plans with) match no model, and the compatibility check refuses the host,
    naming the board as nvidia-smi prints it, before anything is installed."""
    row = next(r for r in ROWS if r.smi == path)
    names = parse_facts("gpu01", gather_here(tmp_path, row)).gpu_names()[0]
    plan = plan_from_vars("gpu01", {"gpu_model": "L40S", "gpu_count": 1}, gpu_names=names)
    (refusal,) = check([plan])
    assert refusal.rule == "gpu-name-unknown"
    assert f"GPU name {row.gpus[0].name!r} from facts matches no model" in refusal.message


SMI_CAPTURES = [H100, H100_MIG, H200, H200_MIG, L40S, RTX2080S_595, RTX4080S_595]


@pytest.mark.parametrize(
    "path", SMI_CAPTURES, ids=[Path(p).name.split("__")[1] for p in SMI_CAPTURES]
)
def test_the_pci_class_a_real_gpu_reports_is_one_facts_counts_as_a_gpu(path: str):
    """facts counts NVIDIA PCI functions of class 0x0302/0x0300 (sysfs ``class`` without its
    programming-interface byte) as GPUs; nvidia-smi's pci.baseClass/pci.subClass of the real
    boards say which class they are."""
    from deployer.facts import _GPU_CLASSES
    from tests.contract.captures import query

    line = query(capture_text(path), "idle :: query-gpu", ["pci.baseClass", "pci.subClass"],
                 header=False, units=True)  # fmt: skip
    base, sub = (int(v, 16) for v in line.strip().split(", "))
    assert f"0x{base:02x}{sub:02x}" in _GPU_CLASSES
