"""The rollout's validation (deployer/rollout/validation.py, deployer/gpu/dcgmi.py) on what real hosts
print after an upgrade.

Three tables:

- ``dcgmi health -c`` and ``dcgmi diag -r N`` output -> verdict. No real health report of an
  unhealthy GPU is in ../shared: those rows print NVIDIA/DCGM's own printing code's output, ported
  in tests/contract/dcgm_render.py and held to NVIDIA's own test expectations there. Two real diag
  captures found in public material are proposed for ../shared (tests/contract/captures.py,
  PROPOSED); their rows skip, naming the origin, until they are there.
- the validation probe (hostops.probe_script) run for real with stand-in nvidia-smi and dcgmi ->
  the checks ``validation.judge_probe`` makes of it.
- the exporter's label reader (hostops.exporter_driver_labels) on the real scrapes.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from deployer.gpu import dcgmi
from deployer.rollout import hostops
from deployer.rollout.validation import judge_probe
from tests.contract import dcgm_render as r
from tests.contract import standins
from tests.contract.captures import proposed_capture
from tests.reality import capture

DIAG_442_A10G = "dcgmi/diag-r2__dcgm-4.4.2__a10g.txt"
DIAG_318_H200 = "dcgmi/diag-r1__dcgm-3.1.8__h200x8.txt"

DBE = "A volatile double-bit ECC error was detected on GPU 0."
HEALTHY = r.health_tree([])
MEMORY_FAILURE = r.health_tree([r.Incident(0, "Memory system", "Failure", DBE)])
PCIE_WARNING = r.health_tree(
    [r.Incident(3, "PCIe system", "Warning", "Detected more than 8 PCIe replays per minute for "
                "GPU 3 : 12 Reconnect PCIe card. Run system side PCIE diagnostic utilities to "
                "verify hops off the GPU board.")]
)  # fmt: skip
MEMORY_FAILURE_JSON = r.health_json([r.Incident(0, "Memory system", "Failure", DBE)])
NOT_WATCHED = "Error: Health watches not enabled. Please enable watches. \n"  # Health.cpp:385

H100_ALL_PASS = r.diag_table("4.6.0", "580.105.08", ["2330"], [
    r.Test("software", "Deployment", "Pass", (r.EntityResult("GPU0", "Pass"),)),
    r.Test("memory", "Hardware", "Pass", (r.EntityResult("GPU0", "Pass"),)),
    r.Test("pcie", "Integration", "Pass", (r.EntityResult("GPU0", "Pass"),)),
])  # fmt: skip
H100_MEMORY_FAIL = r.diag_table("4.6.0", "580.105.08", ["2330"], [
    r.Test("software", "Deployment", "Pass", (r.EntityResult("GPU0", "Pass"),)),
    r.Test("memory", "Hardware", "Fail", (r.EntityResult("GPU0", "Fail", (DBE,)),)),
    r.Test("pcie", "Integration", "Pass", (r.EntityResult("GPU0", "Pass"),)),
])  # fmt: skip
PAUSED = "Error: Diagnostic could not be run while DCGM is paused.\n"  # Diag.cpp:433


@dataclass(frozen=True)
class Verdict:
    text: str  # the output, or "capture:<path>" of a proposed real capture
    rc: int
    ok: bool
    summary: str
    problems: tuple[str, ...] = ()


PERSISTENCE = (
    "Persistence Mode: Persistence mode for GPU 0 is currently disabled. The DCGM diagnostic "
    "requires peristence mode to be enabled."
)

# fmt: off
HEALTH = [
    Verdict(HEALTHY, 0, True, "Overall Health: Healthy"),
    Verdict(MEMORY_FAILURE, 0, False, "Overall Health: Failure",
            (f"GPU 0 Memory system: Failure ({DBE})",)),
    # the final "." is gone: Health::AddErrorMessage ends a piece before a "." that follows it
    # one short of the 54-character limit and resumes two characters on (Health.cpp:241-269)
    Verdict(PCIE_WARNING, 0, False, "Overall Health: Warning",
            ("GPU 3 PCIe system: Warning (Detected more than 8 PCIe replays per minute for GPU 3 "
             ": 12 Reconnect PCIe card. Run system side PCIE diagnostic utilities to verify hops "
             "off the GPU board)",)),
    Verdict(MEMORY_FAILURE_JSON, 0, False, "Overall Health: Failure",
            (f"GPU 0 Memory system: Failure ({DBE})",)),
    Verdict(NOT_WATCHED, 253, False, "dcgmi health -c could not check (exit 253, "
            "DCGM_ST_GENERIC_ERROR): Error: Health watches not enabled. Please enable watches."),
]
DIAG = [
    Verdict(f"capture:{DIAG_442_A10G}", 0, True, "3 tests passed"),
    Verdict(f"capture:{DIAG_318_H200}", 226, False, "dcgmi diag failed (exit 226, DCGM_ST_NVVS_ERROR)",
            (PERSISTENCE,)),
    Verdict(f"capture:{DIAG_318_H200}", 0, False, "dcgmi diag reports failed tests", (PERSISTENCE,)),
    Verdict(H100_ALL_PASS, 0, True, "3 tests passed"),
    Verdict(H100_MEMORY_FAIL, 226, False, "dcgmi diag failed (exit 226, DCGM_ST_NVVS_ERROR)",
            (f"memory (GPU0): {DBE}",)),
    Verdict(H100_ALL_PASS, 205, False, "dcgmi diag failed (exit 205, DCGM_ST_NVVS_ISOLATE_ERROR): "
            "Successfully ran diagnostic for group. +---------------------------+"
            "------------------------------------------------+"),
    Verdict(PAUSED, 202, False, "dcgmi diag failed (exit 202, DCGM_ST_PAUSED): Error: Diagnostic "
            "could not be run while DCGM is paused."),
]
# fmt: on


def output_of(row: Verdict) -> str:
    if row.text.startswith("capture:"):
        return proposed_capture(row.text.removeprefix("capture:")).read_text()
    return row.text


def verdict_id(kind: str, i: int, row: Verdict) -> str:
    return f"{kind}{i}-rc{row.rc}-{'ok' if row.ok else 'fails'}"


@pytest.mark.parametrize(
    "row", HEALTH, ids=[verdict_id("health", i, v) for i, v in enumerate(HEALTH)]
)
def test_health_verdict(row: Verdict):
    v = dcgmi.health_verdict(output_of(row), row.rc)
    assert (v.ok, v.summary) == (row.ok, row.summary)
    assert v.problems == row.problems


@pytest.mark.parametrize("row", DIAG, ids=[verdict_id("diag", i, v) for i, v in enumerate(DIAG)])
def test_diag_verdict(row: Verdict):
    v = dcgmi.diag_verdict(output_of(row), row.rc)
    assert (v.ok, v.summary) == (row.ok, row.summary)
    assert tuple(p[: len(e)] for p, e in zip(v.problems, row.problems, strict=True)) == row.problems


# --- the probe, run for real --------------------------------------------------------------

H100 = "nvidia_gpu_exporter/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
H200_MIG = "nvidia_gpu_exporter/linux-x86_64__nvidia-h200-mig__590.48.01.txt"
L40S = "nvidia_gpu_exporter/linux-x86_64__nvidia-l40s__595.80.txt"  # knows kmd_version
MISMATCH = "driver-misc/nvidia-smi-mismatch.txt"
MASKED = "GPU-00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class Probe:
    smi: str
    health: str
    diag: str | None  # None: diag level 0
    diag_rc: int
    want: str
    gpu_count: int
    checks: dict[str, tuple[bool, str]]  # check -> (ok, its detail starts with)
    # nvidia-smi as a driver that has dropped driver_version for kmd_version would answer
    # (tests/contract/standins.py nvidia_smi, docs/unverified.md#nvidia-smi-without-driver-version)
    renamed: bool = False


# fmt: off
PROBES = [
    Probe(H100, HEALTHY, H100_ALL_PASS, 0, "590.48.01", 1, {
        "nvidia-smi sees every GPU": (True, "1 GPUs at 590.48.01"),
        "dcgmi health": (True, "Overall Health: Healthy"),
        "dcgmi diag -r 2": (True, "3 tests passed")}),
    Probe(H200_MIG, MEMORY_FAILURE, None, 0, "590.48.01", 1, {
        "nvidia-smi sees every GPU": (True, "1 GPUs at 590.48.01"),
        "dcgmi health": (False, f"Overall Health: Failure; GPU 0 Memory system: Failure ({DBE})")}),
    Probe(H100, PCIE_WARNING, H100_MEMORY_FAIL, 226, "590.48.01", 2, {
        "nvidia-smi sees every GPU": (False, "nvidia-smi sees 1 GPUs, expected 2"),
        "dcgmi health": (False, "Overall Health: Warning; GPU 3 PCIe system: Warning"),
        "dcgmi diag -r 2": (False, f"dcgmi diag failed (exit 226, DCGM_ST_NVVS_ERROR); memory (GPU0): {DBE}")}),
    Probe(MISMATCH, NOT_WATCHED, None, 0, "610.43.02", 1, {
        "nvidia-smi sees every GPU": (False, "nvidia-smi fails: Failed to initialize NVML: "
                                      "Driver/library version mismatch\nNVML library version: 610.43"),
        "dcgmi health": (False, "dcgmi health -c could not check (exit 253")}),
    Probe(L40S, HEALTHY, None, 0, "595.80", 1, {
        "nvidia-smi sees every GPU": (True, "1 GPUs at 595.80"),
        "dcgmi health": (True, "Overall Health: Healthy")}, renamed=True),
]
# fmt: on


@pytest.mark.parametrize("row", PROBES, ids=[f"probe{i}" for i in range(len(PROBES))])
def test_validation_checks_of_the_probe_run_on_real_output(row: Probe, tmp_path: Path):
    bindir = tmp_path / "bin"
    if row.smi == MISMATCH:
        standins.printing(bindir, "nvidia-smi", None, capture(MISMATCH), rc=18)
    else:
        standins.nvidia_smi(bindir, capture(row.smi), "idle", renamed=row.renamed)
    (tmp_path / "health.txt").write_text(row.health)
    (tmp_path / "diag.txt").write_text(row.diag or "")
    health_rc = 253 if row.health == NOT_WATCHED else 0  # real dcgmi: 0 whatever the health
    standins.answering(bindir, "dcgmi", {
        "health -s a": (None, 0),
        "health -c": (tmp_path / "health.txt", health_rc),
        "diag -r 2": (tmp_path / "diag.txt", row.diag_rc),
    })  # fmt: skip
    level = 2 if row.diag is not None else 0
    proc = subprocess.run(
        ["sh", "-c", hostops.probe_script(level)], capture_output=True, text=True, timeout=60,
        env=standins.environment(bindir),
    )  # fmt: skip
    checks = judge_probe(
        hostops.parse_probe(proc.stdout), want=row.want, gpu_count=row.gpu_count,
        expected_uuids={MASKED} if row.smi != MISMATCH else set(), diag_level=level,
    )  # fmt: skip
    got = {c["check"]: (c["ok"], c["detail"]) for c in checks if c["check"] in row.checks}
    assert set(got) == set(row.checks)
    for name, (ok, detail) in row.checks.items():
        assert got[name][0] is ok, (name, got[name])
        assert got[name][1].startswith(detail), (name, got[name])


# --- the exporter's label reader ----------------------------------------------------------

# fmt: off
SCRAPES = [
    # capture                                                          drivers          GPUs
    ("dcgm-exporter-metrics/l40s_595.58.03_default-counters.metrics", {"595.58.03"},  1),
    ("dcgm-exporter-metrics/h100x8_580.105.08_excerpt.metrics",       {"580.105.08"}, 8),
    ("dcgm-exporter-metrics/a800_mig_535.129.03_excerpt.metrics",     {"535.129.03"}, 2),
]
# fmt: on


@pytest.mark.parametrize(
    ("path", "drivers", "gpus"), SCRAPES, ids=[Path(p).stem for p, *_ in SCRAPES]
)
def test_the_exporter_label_reader_counts_gpus_and_their_driver(path, drivers, gpus):
    found_drivers, uuids = hostops.exporter_driver_labels(capture(path).read_text())
    assert (found_drivers, len(uuids)) == (drivers, gpus)
