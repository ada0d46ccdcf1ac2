"""The rollout's Prometheus check (deployer/monitoring/tier.py: replica_sees, called by validation)
against a real Prometheus that scrapes the real dcgm-exporter captures.

Each capture is served at /metrics by a loopback HTTP server and scraped every second by this
machine's Prometheus as one node (the ``node`` label file_sd gives a target). One row per
(capture, driver the upgrade wants, the inventory's gpu_count) -> what the check says (None:
satisfied). On the A800 capture GPU 0 is in MIG mode: its DCGM_FI_DEV_GPU_TEMP comes once per GPU
instance (3 series), so 2 GPUs give 4 series; the check must count GPUs (UUIDs), not series.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.parse
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from deployer.monitoring import tier as monitoring_tier
from deployer.monitoring.http import http_fetch
from tests.contract import standins
from tests.reality import capture

NODES = {
    "l40s": "dcgm-exporter-metrics/l40s_595.58.03_default-counters.metrics",
    "h100x8": "dcgm-exporter-metrics/h100x8_580.105.08_excerpt.metrics",
    "a800mig": "dcgm-exporter-metrics/a800_mig_535.129.03_excerpt.metrics",
}
METRIC = "DCGM_FI_DEV_GPU_TEMP"  # what the rollout asks for (status.load_expectation's default)


@dataclass(frozen=True)
class Row:
    node: str
    driver: str
    gpus: int
    says: str | None


# fmt: off
ROWS = [
    Row("l40s", "595.58.03", 1, None),
    Row("l40s", "595.58.03", 2, "1/2 GPUs of l40s with DCGM_FI_DRIVER_VERSION=595.58.03"),
    Row("h100x8", "580.105.08", 8, None),
    Row("h100x8", "590.48.01", 8, "0/8 GPUs of h100x8 with DCGM_FI_DRIVER_VERSION=590.48.01"),
    Row("a800mig", "535.129.03", 2, None),
    Row("a800mig", "535.129.03", 3, "2/3 GPUs of a800mig with DCGM_FI_DRIVER_VERSION=535.129.03"),
    Row("gpu99", "535.129.03", 1, "no target of gpu99"),
]
# fmt: on


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(base: str, promql: str) -> list:
    r = http_fetch(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    return r.json()["data"]["result"] if r.status == 200 else []


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no prometheus binary on this machine")
    tmp = tmp_path_factory.mktemp("prometheus")
    with ExitStack() as stack:
        jobs = []
        for node, path in NODES.items():
            url = urllib.parse.urlsplit(
                stack.enter_context(standins.serving(capture(path).read_bytes()))
            )
            jobs.append(
                f"  - job_name: dcgm-{node}\n    scrape_interval: 1s\n    static_configs:\n"
                f"      - targets: ['{url.netloc}']\n        labels: {{node: {node}}}\n"
            )
        (tmp / "prometheus.yml").write_text("scrape_configs:\n" + "".join(jobs))
        port = free_port()
        proc = subprocess.Popen(
            [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=(tmp / "log").open("w"),
        )  # fmt: skip
        stack.callback(proc.wait, 10)
        stack.callback(proc.terminate)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while len(query(base, f"count by (node) ({METRIC})")) < len(NODES):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"Prometheus never scraped the captures: {(tmp / 'log').read_text()[-2000:]}"
                )
            time.sleep(0.5)
        yield base


@pytest.mark.parametrize("row", ROWS, ids=[f"{r.node}-{r.driver}-{r.gpus}" for r in ROWS])
def test_replica_sees_the_host_on_a_real_scrape(prometheus: str, row: Row):
    said = monitoring_tier.replica_sees(
        http_fetch, prometheus, row.node, METRIC, row.driver, row.gpus
    )
    assert said == row.says


def test_the_mig_capture_has_more_series_than_gpus(prometheus: str):
    series = query(prometheus, f'count({METRIC}{{node="a800mig"}})')
    assert int(series[0]["value"][1]) == 4  # GPU 0 once per instance (3), GPU 1 once
    assert Path(NODES["a800mig"]).name.startswith("a800_mig")
