"""``status`` reports an NVML version mismatch per GPU host, read from real nvidia-smi output.

Each row is what the engine's facts script would return on a host after a driver package change
without a reboot: nvidia-smi's real answer (``driver-misc/nvidia-smi-mismatch.txt``: exit 18, the
NVML line on stdout), a real ``/proc/driver/nvidia/version`` line of the module still loaded
(``driver-misc/proc-driver-nvidia-version.txt``) and the installed package named by the NVML
library version. Status reads it through ``deployer.facts.parse_facts`` (no parser of its own) and
must fail the host's driver row with the cause. Adding a capture is one row.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from deployer.connection import CommandResult
from deployer.facts import parse_facts
from deployer.monitoring.check import FAILED
from deployer.monitoring.checks_driver import driver_check
from tests.reality import capture_text

MISMATCH = "driver-misc/nvidia-smi-mismatch.txt"
PROC = "driver-misc/proc-driver-nvidia-version.txt"


@dataclass(frozen=True)
class Row:
    id: str
    smi: str  # capture of nvidia-smi's output
    smi_rc: int  # its exit status, as SOURCES.md records it
    proc_line: int  # which line of the /proc capture is the loaded module
    installed: str  # the driver package installed (the NVML library's version)
    expect_state: str
    expect_detail: str


ROWS = [
    Row(
        "mismatch-after-upgrade-from-580",
        MISMATCH, 18, 1, "610.43", FAILED,
        "NVML version mismatch: nvidia-smi: Failed to initialize NVML: Driver/library version "
        "mismatch (installed 610.43, kernel module loaded 580.159.04)",
    ),
    Row(
        "mismatch-after-upgrade-from-515",
        MISMATCH, 18, 0, "610.43", FAILED,
        "NVML version mismatch: nvidia-smi: Failed to initialize NVML: Driver/library version "
        "mismatch (installed 610.43, kernel module loaded 515.76)",
    ),
]  # fmt: skip


def facts_output(row: Row) -> str:
    proc = capture_text(PROC).splitlines()[row.proc_line]
    return (
        "@@os\nid=ubuntu\nversion_id=22.04\nid_like=debian\n@@pci\n0000:18:00.0 0x0302\n"
        f"@@smi\n{capture_text(row.smi).rstrip()}\n@@smi_rc\nrc={row.smi_rc}\n"
        f"@@proc\n{proc}\n"
        f"@@pkgs\nlibnvidia-compute-610\t{row.installed}-0ubuntu1\tii\n@@nvswitch\n0\n"
    )


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_an_nvml_mismatch_fails_the_hosts_driver_row_naming_the_versions(row: Row):
    facts = parse_facts("gpu07", CommandResult("facts", 0, facts_output(row), ""))
    check = driver_check("gpu07", facts, None)
    assert (check.component, check.host, check.state) == ("driver", "gpu07", row.expect_state)
    assert check.detail.startswith(row.expect_detail), check.detail
    assert "reboot" in check.detail
