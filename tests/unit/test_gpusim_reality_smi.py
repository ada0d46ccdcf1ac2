"""The simulated nvidia-smi prints what real nvidia-smi prints: one row per real capture.

Each row runs the simulator for the capture's model, driver branch and MIG layout and compares
its output with the capture after normalising the values that differ between any two machines
(``tests/unit/gpusim_captures.py``); the layout, keys, field order, units and N/A forms must be
equal. Adding a capture is one row in :data:`CAPTURES`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deployer.lab.gpusim import apply_fault, build_packages
from deployer.lab.gpusim.standins.smi_format import branch
from deployer.lab.gpusim.standins.smi_query import _BRANCH_FIELDS as BRANCH_FIELDS
from deployer.lab.gpusim.standins.smi_query import field_table
from tests.contract.captures import help_fields
from tests.reality import PROPOSED
from tests.unit.gpusim_captures import (
    csv_rows,
    csv_shape,
    q_shape,
    section,
    sim_host,
    smi,
    smi_packages,
    table_shape,
    without_sim_note,
)

NGE = "nvidia_gpu_exporter/linux-x86_64__"
H100_MIG = ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
H200_MIG = [{"profile": "3g.71gb", "compute_instances": ["1c", "2c"]}, "2g.35gb", "1g.18gb",
            "1g.18gb"]  # fmt: skip


@dataclass(frozen=True)
class Capture:
    path: str
    model: str
    driver: str  # the simulated release of the captured branch
    captured_driver: str
    cuda: str
    persistence: bool
    mig: Any = None
    fabric: bool = False  # an HGX board whose fabric manager has finished ("Completed")
    loaded: bool = True  # the capture ran a load too (its header: "load: none" when not)

    @property
    def id(self) -> str:
        return f"{self.path.split('__')[1]}-{self.captured_driver}"


CAPTURES = [
    Capture(NGE + "nvidia-h100-80gb-hbm3__590.48.01.txt", "H100", "590.48.01", "590.48.01",
            "13.1", True, fabric=True),
    Capture(NGE + "nvidia-h100-mig__590.48.01.txt", "H100", "590.48.01", "590.48.01", "13.1",
            True, {0: H100_MIG}, fabric=True),
    Capture(NGE + "nvidia-h200__590.48.01.txt", "H200", "590.48.01", "590.48.01", "13.1", True,
            fabric=True),
    Capture(NGE + "nvidia-h200-mig__590.48.01.txt", "H200", "590.48.01", "590.48.01", "13.1",
            True, {0: H200_MIG}, fabric=True),
    Capture(NGE + "nvidia-l40s__595.80.txt", "L40S", "595.45.04", "595.80", "13.2", False),
    # proposed for ../shared (tests/reality.py PROPOSED): R580's -q, from its newest release
    Capture(NGE + "nvidia-h200__580.173.02.txt", "H200", "580.126.20", "580.173.02", "13.0",
            True, fabric=True, loaded=False),
    Capture(NGE + "nvidia-h200-mig__580.173.02.txt", "H200", "580.126.20", "580.173.02", "13.0",
            True, {0: ["3g.71gb"]}, fabric=True, loaded=False),
    Capture(NGE + "nvidia-h200__610.43.02.txt", "H200", "610.43.02", "610.43.02", "13.3", True,
            fabric=True, loaded=False),
    Capture(NGE + "nvidia-h200-mig__610.43.02.txt", "H200", "610.43.02", "610.43.02", "13.3",
            True, {0: ["3g.71gb"]}, fabric=True, loaded=False),
]  # fmt: skip
IDS = [c.id for c in CAPTURES]
# Captures of boards the simulator does not make (GeForce; proposed), read for what their release
# prints whatever the board: the query fields it knows, its --version lines, its table's header.
# The simulated board is any one that answers the same branch (no fabric, no MIG).
RELEASES = [
    Capture(NGE + "nvidia-geforce-rtx-2080-super__595.71.05.txt", "L40S", "595.45.04", "595.71.05",
            "13.2", False),
    Capture(NGE + "nvidia-geforce-rtx-4080-super__595.71.05.txt", "L40S", "595.45.04", "595.71.05",
            "13.2", False),
    Capture(NGE + "nvidia-geforce-rtx-2080-super__610.57.04.txt", "L40S", "610.43.02", "610.57.04",
            "13.3", False),
]  # fmt: skip
RELEASE_IDS = [c.path.split("__")[1] + "-" + c.captured_driver for c in RELEASES]


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_packages(tmp_path_factory.mktemp("debs"))


def host(tmp_path: Path, debs: list[Path], cap: Capture) -> Path:
    root = sim_host(
        tmp_path / "root",
        debs,
        smi_packages(cap.driver),
        cap.model,
        1,
        nvswitch=cap.fabric,
        mig=cap.mig,
    )
    if cap.fabric:  # what nv-fabricmanager writes once the fabric is up
        (root / "run/gpusim").mkdir(parents=True, exist_ok=True)
        (root / "run/gpusim/fabric.json").write_text('{"state": "Completed"}')
    if cap.persistence:
        smi(root, "-pm", "1")
    return root


#: -q values that tell the machine, not the GPU: the captures were made in VMs
#: ("Pass-Through"), a lab host is bare metal ("None")
HOST_DEPENDENT = frozenset({"        Virtualization Mode", "        Atomic Caps Outbound"})


def q_of(text: str, cap: Capture) -> list[tuple[str, str]]:
    return [(k, "<HOST>" if k in HOST_DEPENDENT else v) for k, v in q_shape(text, versions(cap))]


def versions(cap: Capture) -> tuple[str, ...]:
    return (cap.driver, cap.captured_driver)


def processes(text: str) -> list[dict]:
    """The compute processes of a captured table: pid, name, memory, GI."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\|\s+(\d+)\s+(\S+)\s+(\S+)\s+(\d+)\s+C\s+(\S+)\s+(\d+)MiB \|", line)
        if m:
            out.append({"gi": m.group(2), "pid": m.group(4), "name": m.group(5),
                        "mib": m.group(6)})  # fmt: skip
    return out


@pytest.mark.parametrize("cap", CAPTURES, ids=IDS)
def test_list_has_the_captured_lines(tmp_path: Path, debs, cap: Capture) -> None:
    _, real = section(cap.path, "capabilities :: list (-L)")
    sim = smi(host(tmp_path, debs, cap), "-L")
    assert table_shape(sim) == table_shape(real)


@pytest.mark.parametrize("cap", CAPTURES, ids=IDS)
def test_idle_table_has_the_captured_layout(tmp_path: Path, debs, cap: Capture) -> None:
    _, real = section(cap.path, "idle :: nvidia-smi (default table)")
    sim = without_sim_note(smi(host(tmp_path, debs, cap)))
    assert table_shape(sim, versions(cap)) == table_shape(real, versions(cap))


@pytest.mark.parametrize("cap", CAPTURES + RELEASES, ids=IDS + RELEASE_IDS)
def test_idle_table_header_is_the_captured_one(tmp_path: Path, debs, cap: Capture) -> None:
    """The lines above the GPU rows: the version line (Driver Version / CUDA Version, or R610's
    KMD Version / CUDA UMD Version) and the column titles, the same on every board."""
    _, real = section(cap.path, "idle :: nvidia-smi (default table)")
    sim = without_sim_note(smi(host(tmp_path, debs, cap)))

    def header(text: str) -> list[tuple]:
        lines = text.split("\n")
        end = next(i for i, ln in enumerate(lines) if ln.startswith("|====="))
        return table_shape("\n".join(lines[1 : end + 1]), versions(cap))  # after the date line

    assert header(sim) == header(real)


@pytest.mark.parametrize("cap", CAPTURES, ids=IDS)
def test_busy_table_lists_processes_as_captured(tmp_path: Path, debs, cap: Capture) -> None:
    if not cap.loaded:
        pytest.skip("the capture ran no load")
    _, real = section(cap.path, "load :: nvidia-smi (default table)")
    root = host(tmp_path, debs, cap)
    for p in processes(real):
        params = {"gpu": 0, "pid": p["pid"], "process_name": p["name"], "used_memory_mib": p["mib"]}
        if p["gi"] != "N/A":
            params["gpu_instance"] = p["gi"]
        apply_fault(root, "gpu-jobs", params)
    sim = without_sim_note(smi(root))
    real_rows = [r for r in table_shape(real, versions(cap))]
    sim_rows = [r for r in table_shape(sim, versions(cap))]
    assert sim_rows == real_rows


@pytest.mark.parametrize("cap", CAPTURES, ids=IDS)
def test_q_has_the_captured_sections_keys_and_value_forms(tmp_path: Path, debs, cap) -> None:
    _, real = section(cap.path, "idle :: query (-q)")
    sim = without_sim_note(smi(host(tmp_path, debs, cap), "-q"))
    assert q_of(sim, cap) == q_of(real, cap)


@pytest.mark.parametrize("cap", CAPTURES, ids=IDS)
def test_query_gpu_has_the_captured_header_and_value_forms(tmp_path: Path, debs, cap) -> None:
    command, real = section(cap.path, "idle :: query-gpu (csv, what the exporter parses)")
    captured_fields = command.split("--query-gpu=")[1].split()[0].split(",")
    simulated = set(field_table())
    fields = [f for f in captured_fields if f in simulated]
    assert len(fields) >= 0.9 * len(captured_fields), "the simulator answers what the capture asks"
    real_rows = csv_rows(real)
    index = [captured_fields.index(f) for f in fields]
    want_header = [real_rows[0][i] for i in index]
    want_values = [csv_shape(real_rows[1][i], versions(cap)) for i in index]
    sim_rows = csv_rows(smi(host(tmp_path, debs, cap), f"--query-gpu={','.join(fields)}",
                            "--format=csv"))  # fmt: skip
    assert sim_rows[0] == want_header
    assert dict(zip(fields, [csv_shape(v, versions(cap)) for v in sim_rows[1]], strict=True)) == (
        dict(zip(fields, want_values, strict=True))
    )


@pytest.mark.parametrize("cap", CAPTURES, ids=IDS)
def test_compute_apps_header_is_the_captured_one(tmp_path: Path, debs, cap: Capture) -> None:
    command, real = section(cap.path, "idle :: query-compute-apps (per-process)")
    fields = command.split("--query-compute-apps=")[1].split()[0]
    sim = smi(host(tmp_path, debs, cap), f"--query-compute-apps={fields}", "--format=csv")
    assert sim == real


@pytest.mark.parametrize("cap", CAPTURES + RELEASES, ids=IDS + RELEASE_IDS)
def test_version_lines_are_the_captured_ones(tmp_path: Path, debs, cap: Capture) -> None:
    _, real = section(cap.path, "capabilities :: version")
    sim = smi(host(tmp_path, debs, cap), "--version")
    real_lines = real.splitlines()
    assert [ln.split(":")[0] for ln in sim.splitlines()[: len(real_lines)]] == [
        ln.split(":")[0] for ln in real_lines
    ]
    # R610's "Deprecated, see ..." lines, word for word (the versions are the release's)
    assert [ln for ln in sim.splitlines() if "Deprecated" in ln] == [
        ln for ln in real_lines if "Deprecated" in ln
    ]


def listed_fields(cap: Capture) -> set[str]:
    """The --query-gpu fields (and aliases) that a capture's ``--help-query-gpu`` lists."""
    return help_fields(section(cap.path, "capabilities :: help-query-gpu")[1])


def test_every_simulated_query_field_is_one_real_nvidia_smi_lists() -> None:
    shared = [cap for cap in CAPTURES if cap.path not in PROPOSED]
    listed = set().union(*(listed_fields(cap) for cap in shared))
    for canonical, (aliases, _unit, _fn) in field_table().items():
        for name in (canonical, *aliases):
            if name in listed:
                continue
            # a field of a branch only proposed captures show (R610's): the branch test of
            # their rows checks it against their help once they join ../shared
            known = BRANCH_FIELDS.get(canonical)
            assert known is not None, name
            assert not any(known(branch_of(cap)) for cap in shared), name
            assert any(
                known(branch_of(cap)) for cap in CAPTURES + RELEASES if cap.path in PROPOSED
            ), name


def branch_of(cap: Capture) -> int:
    return branch(cap.captured_driver)


@pytest.mark.parametrize("cap", CAPTURES + RELEASES, ids=IDS + RELEASE_IDS)
def test_a_field_only_some_branches_know_is_known_where_the_capture_lists_it(cap) -> None:
    listed = listed_fields(cap)
    branch = branch_of(cap)
    assert {f: known(branch) for f, known in BRANCH_FIELDS.items()} == {
        f: f in listed for f in BRANCH_FIELDS
    }
