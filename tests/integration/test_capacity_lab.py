"""The capacity prediction calibrated on the lab: ``up``, then the replicas' own counts.

After the site converges and every target has been scraped at least twice (two of the slowest
scrape intervals, then the one minute the ingestion rate is taken over), ``gpumon-deploy capacity``
must predict each replica's active series (``prometheus_tsdb_head_series``) and its ingestion rate
(``rate(prometheus_tsdb_head_samples_appended_total[1m])``) within 10 %.

Runs on the session ``lab`` fixture; ``GPUMON_CAPACITY_LAB=<name>`` runs it on a lab of that name
that is already up instead.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from deployer.lab import Lab
from deployer.monitoring.http import http_fetch
from tests.integration.labtools import lab_named_by, run_cli, wait_until

pytestmark = pytest.mark.lab

TOLERANCE = 0.10
HEAD_SERIES = "prometheus_tsdb_head_series"
INGESTION = "rate(prometheus_tsdb_head_samples_appended_total[1m])"


@pytest.fixture(scope="module")
def clab(request: pytest.FixtureRequest) -> Lab:
    return lab_named_by("GPUMON_CAPACITY_LAB", request)


@pytest.fixture(scope="module")
def inventory(clab: Lab) -> Path:
    return clab.inventory_path


@pytest.fixture(scope="module")
def converged(inventory: Path) -> float:
    """The site converged; when it ended (monotonic)."""
    proc = run_cli("up", "-i", str(inventory), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return time.monotonic()


@pytest.fixture(scope="module")
def predicted(inventory: Path, converged: float) -> dict[str, Any]:
    proc = run_cli("capacity", "-i", str(inventory), "--output", "json", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def replica_urls(lab: Lab) -> dict[str, str]:
    return {h.name: f"http://{h.address}:9090" for h in lab.hosts if "prometheus" in h.groups}


def own_value(url: str, query: str) -> float | None:
    """``query``'s value for the replica at ``url`` as it measures itself (job prometheus)."""
    r = http_fetch(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": query}))
    if r.error is not None or r.status != 200:
        return None
    host = url.split("//", 1)[1]
    # summed: from Prometheus 2.40 the appended-samples counter has one series per sample type
    # (type="float", type="histogram")
    rows = [r for r in r.json()["data"]["result"] if r["metric"].get("instance") == host]
    return sum(float(row["value"][1]) for row in rows) if rows else None


def within(measured: float | None, predicted: float) -> bool:
    return measured is not None and abs(predicted - measured) <= TOLERANCE * measured


def settled(predicted: dict[str, Any], converged: float) -> None:
    """Two of the slowest scrape intervals, then the rate's minute, after the converge."""
    slowest = max(30.0, predicted["settings"]["scrape_interval_s"])
    rest = converged + 2 * slowest + 60 - time.monotonic()
    if rest > 0:
        time.sleep(rest)


@pytest.mark.parametrize(
    ("what", "query", "key"),
    [("active series", HEAD_SERIES, "series"), ("samples/s", INGESTION, "samples_per_s")],
)
def test_each_replica_measures_the_predicted_load_within_10_percent(
    clab: Lab, predicted: dict[str, Any], converged: float, what: str, query: str, key: str
):
    settled(predicted, converged)
    want = predicted["per_replica"][key]
    last: dict[str, float | None] = {}

    def probe() -> bool:
        for name, url in replica_urls(clab).items():
            last[name] = own_value(url, query)
        return all(within(v, want) for v in last.values())

    try:
        # a restarted replica's first scrapes of every target take another interval or two
        wait_until(f"{what} within 10 %", probe, timeout=180, every=10)
    except pytest.fail.Exception:
        pytest.fail(f"{what}: predicted {want:,.1f} per replica, measured {last}")
