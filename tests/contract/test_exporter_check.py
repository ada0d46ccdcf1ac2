"""roles/dcgm_exporter/files/dcgm-exporter-check on real dcgm-exporter scrapes.

The script runs for real and scrapes with the machine's own curl a real HTTP server on loopback
that serves the capture's bytes at /metrics (behind basic auth in the auth rows). One row per
(capture, inventory's gpu_count, UUIDs from nvidia-smi, auth) -> (exit status, what it says).
On MIG GPUs the exporter emits a series per GPU instance, all with the parent GPU's UUID
(a800 capture: GPU 0 has instances 3, 5, 6): the check counts GPUs, not series.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.contract import standins
from tests.reality import capture

SCRIPT = Path(__file__).resolve().parents[2] / "roles/dcgm_exporter/files/dcgm-exporter-check"

L40S = "dcgm-exporter-metrics/l40s_595.58.03_default-counters.metrics"
H100X8 = "dcgm-exporter-metrics/h100x8_580.105.08_excerpt.metrics"
A800_MIG = "dcgm-exporter-metrics/a800_mig_535.129.03_excerpt.metrics"

L40S_GPU = "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43"
H100_GPUS = (
    "GPU-22dbdd79-f55a-92a8-aa39-322198e72ed6", "GPU-289275cb-a907-ab73-9a95-058ae119f62d",
    "GPU-3cc59718-d7df-49ac-07a3-a6cedfe263c6", "GPU-71fc8f21-7800-5bb9-53ad-7e6fc93ef15f",
    "GPU-b60b817a-a091-c492-4211-92b276d697e6", "GPU-ca1b8386-093b-60cc-349d-c4a38b9124c0",
    "GPU-dee5c16e-1d0a-cec8-a9ea-f878a4be1b3d", "GPU-f814846a-9bbe-469e-97c3-d037d67c3c32",
)  # fmt: skip
A800_GPUS = ("GPU-1f027ee8-6e1e-2b8c-0108-3d370e5f0418", "GPU-9e5b8fec-61bf-5124-a0a9-079af1b65cc6")


@dataclass(frozen=True)
class Row:
    capture: str
    count: int
    uuids: tuple[str, ...]
    rc: int
    says: tuple[str, ...] = ()  # stderr lines, {url} for the scraped URL
    auth: str = "none"  # none | basic (the server wants user:secret)
    password: str = "secret"  # what the check is given


# fmt: off
ROWS = [
    Row(L40S, 1, (L40S_GPU,), 0),
    Row(L40S, 2, (L40S_GPU,), 1, ("{url} serves metrics of 1 GPUs, the inventory's gpu_count is 2",)),
    Row(H100X8, 8, H100_GPUS, 0),
    Row(H100X8, 8, (*H100_GPUS[:7], L40S_GPU), 1,
        (f"{{url}} serves no metrics of {L40S_GPU} (a GPU nvidia-smi reports)",)),
    Row(A800_MIG, 2, A800_GPUS, 0),
    Row(A800_MIG, 3, A800_GPUS, 1, ("{url} serves metrics of 2 GPUs, the inventory's gpu_count is 3",)),
    Row(L40S, 1, (L40S_GPU,), 0, auth="basic"),
    Row(L40S, 1, (L40S_GPU,), 1, ("scraping {url}: HTTP 401: Unauthorized",), auth="basic",
        password="wrong"),
]
# fmt: on


def row_id(r: Row) -> str:
    return f"{Path(r.capture).name.split('_')[0]}-count{r.count}-{r.auth}-rc{r.rc}"


@pytest.mark.parametrize("row", ROWS, ids=[row_id(r) for r in ROWS])
def test_exporter_check_verify_on_a_real_scrape(row: Row, tmp_path: Path):
    auth = ("gpumon", "secret") if row.auth == "basic" else None
    with standins.serving(capture(row.capture).read_bytes(), auth) as url:
        env = standins.environment(
            tmp_path, GPUMON_SCRAPE_USER="gpumon", GPUMON_SCRAPE_PASSWORD=row.password
        )
        proc = subprocess.run(
            ["sh", str(SCRIPT), "verify", url, str(row.count), row.auth, *row.uuids],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
    says = tuple(s.format(url=url) for s in row.says)
    assert (proc.returncode, tuple(proc.stderr.splitlines())) == (row.rc, says)
