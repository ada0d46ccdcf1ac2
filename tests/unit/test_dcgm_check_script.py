"""roles/dcgm/files/dcgm-check on the count lines NVIDIA/DCGM's source prints that no capture in
../shared shows yet (the real captures run in tests/contract/test_dcgm_check.py).

dcgmi/Query.cpp at v4.6.0 (51b65ccebf9d61e6593713a7d6b68e594d9d7975) line 281:
``fmt::print("{} GPU{} found ({}).\\n", filteredCount, ..., showAll ? "All" : "Active")`` and, when
some GPU is not active, line 285: ``Note: Use -a flag to show all GPUs, including those that are
not active.``
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "roles/dcgm/files/dcgm-check"
UUID = "GPU-65f8c655-bdb7-3246-468c-994c27fbb392"
TABLE = (
    "+--------+----------------------------------------------------------------------+\n"
    "| GPU ID | Device Information                                                   |\n"
    "+--------+----------------------------------------------------------------------+\n"
    "| 0      | Name: NVIDIA H200                                                    |\n"
    "|        | PCI Bus ID: 00000000:8D:00.0                                         |\n"
    f"|        | Device UUID: {UUID}                |\n"
    "+--------+----------------------------------------------------------------------+\n"
)


def run(tmp_path: Path, text: str, count: int, rc: int = 0) -> subprocess.CompletedProcess[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "out.txt").write_text(text)
    dcgmi = tmp_path / "dcgmi"
    dcgmi.write_text(f"#!/bin/sh\ncat {tmp_path / 'out.txt'}\nexit {rc}\n")
    dcgmi.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin:/usr/sbin:/sbin"}
    return subprocess.run(["sh", str(SCRIPT), "verify", "127.0.0.1", str(port), str(count), UUID],
                          capture_output=True, text=True, env=env, timeout=30)  # fmt: skip


@pytest.mark.parametrize("line", ["1 GPU found (All).", "1 GPU found (Active).", "1 GPU found."])
def test_every_form_of_the_count_line_is_read(tmp_path, line):
    assert run(tmp_path, f"{line}\n{TABLE}", 1).returncode == 0


def test_a_count_of_active_gpus_below_the_inventory_says_inactive_gpus_exist(tmp_path):
    note = "Note: Use -a flag to show all GPUs, including those that are not active.\n"
    proc = run(tmp_path, f"1 GPU found (Active).\n{note}{TABLE}", 2)
    assert proc.returncode == 1
    assert "lists 1 GPUs (active; dcgmi discovery -l -a lists the inactive ones too)" in proc.stderr


def test_output_without_a_count_line_lists_no_gpus(tmp_path):
    proc = run(tmp_path, "0 CPUs found.\n", 1)
    assert proc.returncode == 1 and "lists no GPUs" in proc.stderr


def test_a_failing_dcgmi_is_reported_with_its_first_lines(tmp_path):
    proc = run(tmp_path, "Error: unable to establish a connection to the specified host\n", 1, 250)
    assert proc.returncode == 1
    assert "fails: Error: unable to establish a connection" in proc.stderr
