"""``status`` counts GPUs by UUID per node, on series shaped exactly like real dcgm-exporter scrapes.

Each row takes real ``/metrics`` captures from ``../shared/gpu_reality_fixtures`` (parsed with
prometheus_client's text parser), adds the labels the product's scrape adds (``job``, ``instance``
and file_sd's ``node``), optionally relabels them as another exporter version would, and states
the GPUs status must count per node, beside the number of series (which it must not count).
Adding a capture is one row.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from deployer.monitoring.checks_gpus import gpu_query, gpus_by_node, presence_metric
from tests.reality import capture_text

A800_MIG = "dcgm-exporter-metrics/a800_mig_535.129.03_excerpt.metrics"
H100X8 = "dcgm-exporter-metrics/h100x8_580.105.08_excerpt.metrics"
L40S = "dcgm-exporter-metrics/l40s_595.58.03_default-counters.metrics"

Relabel = Callable[[dict[str, str]], dict[str, str]]


def as_is(labels: dict[str, str]) -> dict[str, str]:
    return labels


def hostname_localhost(labels: dict[str, str]) -> dict[str, str]:
    """dcgm-exporter 4.x run with ``-r localhost:5555`` outside Kubernetes: every host says
    ``Hostname="localhost"`` (render_metrics.go:47 at 4.5.3-4.8.2)."""
    return {**labels, "Hostname": "localhost"}


def hostname_renamed(labels: dict[str, str]) -> dict[str, str]:
    """Newer dcgm-exporter (HEAD d5e5f51, "#655") names the label ``hostname``."""
    out = {k: v for k, v in labels.items() if k != "Hostname"}
    return out | {"hostname": labels["Hostname"]}


@dataclass(frozen=True)
class Row:
    id: str
    nodes: dict[str, str]  # node -> capture scraped from that node
    gpus: dict[str, int]  # what status must count
    series: int  # how many series of the metric there are (not GPUs)
    relabel: Relabel = as_is


ROWS = [
    Row("a800-mig: 2 GPUs, GPU 0 in 3 GPU instances", {"gpu01": A800_MIG}, {"gpu01": 2}, 4),
    Row("h100x8", {"gpu01": H100X8}, {"gpu01": 8}, 8),
    Row("l40s: sensorless board", {"gpu01": L40S}, {"gpu01": 1}, 1),
    Row(
        "two nodes both Hostname=localhost",
        {"gpu01": A800_MIG, "gpu02": H100X8},
        {"gpu01": 2, "gpu02": 8},
        12,
        hostname_localhost,
    ),
    Row("hostname renamed (newer exporter)", {"gpu01": H100X8}, {"gpu01": 8}, 8, hostname_renamed),
    Row(
        "the same MIG capture on two nodes",
        {"gpu01": A800_MIG, "gpu02": A800_MIG},
        {"gpu01": 2, "gpu02": 2},
        8,
    ),
]


def scraped(row: Row, metric: str) -> list[dict[str, Any]]:
    """The capture's series of ``metric`` as a replica holds them, in the shape of an instant
    query's answer: ``{"metric": {labels}, "value": [t, "v"]}``."""
    out = []
    for i, (node, relpath) in enumerate(row.nodes.items()):
        for family in text_string_to_metric_families(capture_text(relpath)):
            for s in family.samples:
                if s.name != metric:
                    continue
                labels = row.relabel(dict(s.labels)) | {
                    "job": "dcgm",
                    "instance": f"10.0.0.{11 + i}:9400",
                    "node": node,
                }
                out.append({"metric": {"__name__": metric, **labels}, "value": [0, str(s.value)]})
    return out


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_gpus_are_counted_by_uuid_per_node_never_by_series_or_hostname(row: Row):
    series = scraped(row, presence_metric())
    assert len(series) == row.series
    counts, no_uuid = gpus_by_node(series)
    assert counts == row.gpus
    assert no_uuid == {}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool not installed (scripts/setup installs it)")
    return found


def _selector(metric: dict[str, str]) -> str:
    labels = ",".join(f'{k}="{v}"' for k, v in metric.items() if k != "__name__")
    return f"{metric['__name__']}{{{labels}}}"


@pytest.mark.parametrize("row", ROWS[:1] + ROWS[3:4], ids=[ROWS[0].id, ROWS[3].id])
def test_the_status_query_gives_one_series_per_node_and_gpu_in_prometheus(row: Row, tmp_path: Path):
    """The query status sends, evaluated by Prometheus' own engine (promtool) on the capture's
    series: one series per (node, UUID), whatever the MIG layout, so the answer is as long as
    the number of GPUs and counting it is counting GPUs."""
    series = scraped(row, presence_metric())
    expected = sorted({(s["metric"]["node"], s["metric"]["UUID"]) for s in series})
    assert len(expected) == sum(row.gpus.values())
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": _selector(s["metric"]), "values": s["value"][1]} for s in series
                ],
                "promql_expr_test": [
                    {
                        "expr": gpu_query(presence_metric(), since=0),
                        "eval_time": "0m",
                        "exp_samples": [
                            {"labels": f'{{node="{n}", UUID="{u}"}}', "value": 1}
                            for n, u in expected
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "status_gpus_test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    proc = subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
