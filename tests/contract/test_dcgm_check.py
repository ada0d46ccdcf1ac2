"""roles/dcgm/files/dcgm-check on real ``dcgmi discovery -l`` output.

The script runs for real, with a stand-in ``dcgmi`` first on PATH that prints the capture when
asked exactly what the script asks (``dcgmi discovery --host 127.0.0.1:PORT -l``). ``ss`` is the
machine's own: the port is one nothing listens on, as on a host where nv-hostengine listens on
the address asked only.

One row per (capture, inventory's gpu_count, UUIDs from nvidia-smi) -> (exit status, what it
says). Adding a capture is one row.
"""

from __future__ import annotations

import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.contract import standins
from tests.reality import capture

SCRIPT = Path(__file__).resolve().parents[2] / "roles/dcgm/files/dcgm-check"

A100_UUID = "GPU-1d82f4df-3cf9-150d-088b-52f18f8654e1"
H200_UUID = "GPU-65f8c655-bdb7-3246-468c-994c27fbb392"


@dataclass(frozen=True)
class Row:
    capture: str
    count: int
    uuids: tuple[str, ...]
    rc: int
    says: str = ""  # a line of stderr ("" when it passes: nothing on stderr)


# the captures, by the DCGM generation that printed them
DCGM_45 = "dcgmi/discovery-l__dcgm-4.x-active__a10g.txt"  # "1 GPU found (Active)."; the capture's
#   author trimmed its Device UUID line, so no UUID is asked of it
DCGM_3 = "dcgmi/discovery-l__dcgm-3.x__h200.txt"  # "1 GPU found."
DCGM_2 = "dcgmi/discovery-l__dcgm-2.x__a100-sxm4-40gb.txt"  # excerpt: "8 GPUs found." + 1st GPU

# fmt: off
ROWS = [
    Row(DCGM_45, 1, (), 0),
    Row(DCGM_45, 2, (), 1, "dcgmi discovery -l lists 1 GPUs, the inventory's gpu_count is 2"),
    Row(DCGM_3, 1, (H200_UUID,), 0),
    Row(DCGM_3, 1, (A100_UUID,), 1,
        f"dcgmi discovery -l does not list {A100_UUID} (a GPU nvidia-smi reports)"),
    Row(DCGM_2, 8, (A100_UUID,), 0),
    Row(DCGM_2, 7, (A100_UUID,), 1, "dcgmi discovery -l lists 8 GPUs, the inventory's gpu_count is 7"),
]
# fmt: on


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def row_id(r: Row) -> str:
    return f"{r.capture.split('__')[1]}-count{r.count}-{'pass' if r.rc == 0 else 'fail'}"


@pytest.mark.parametrize("row", ROWS, ids=[row_id(r) for r in ROWS])
def test_dcgm_check_verify_on_real_discovery_output(row: Row, tmp_path: Path):
    port = free_port()
    standins.printing(tmp_path, "dcgmi", ["discovery", "--host", f"127.0.0.1:{port}", "-l"],
                      capture(row.capture))  # fmt: skip
    proc = subprocess.run(
        ["sh", str(SCRIPT), "verify", "127.0.0.1", str(port), str(row.count), *row.uuids],
        capture_output=True, text=True, env=standins.environment(tmp_path), timeout=30,
    )  # fmt: skip
    assert (proc.returncode, proc.stderr.splitlines()) == (row.rc, [row.says] if row.says else [])
