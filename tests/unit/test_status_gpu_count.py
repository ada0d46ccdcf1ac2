"""``status`` counts a node's GPUs, not its series: on a GPU in MIG mode dcgm-exporter emits one
series per GPU instance, each carrying the parent GPU's UUID (the real 8xA800 scrape: GPU 0 in
MIG mode with 3 instances, GPU 1 not, is 2 GPUs and 4 series of DCGM_FI_DEV_GPU_TEMP).

The query status sends is taken from the status check itself (a fetch that records it) and
evaluated by promtool over the captured scrape's series as Prometheus stores them, so the test
judges what Prometheus answers, not the query's text."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import yaml

from deployer import dcgm_fields, status
from deployer.file_sd import Target
from deployer.status import Replica, Response, StackExpectation
from tests.unit.test_rule_pack import promtool, run_promtool
from tests.unit.test_rule_pack_reality import A800, H100, stored, target_labels

__all__ = ["promtool"]  # the fixture

URL = "http://10.0.0.21:9090"


def gpu_query(node: str, gpus: int) -> str:
    """The PromQL status asks a replica for the GPUs per node."""
    asked: list[str] = []

    def fetch(url: str) -> Response:
        parts = urllib.parse.urlsplit(url)
        if parts.path == "/api/v1/query":
            query = urllib.parse.parse_qs(parts.query)["query"][0]
            if dcgm_fields.metric("gpu_temp") in query:
                asked.append(query)
            body = {"status": "success", "data": {"resultType": "vector", "result": []}}
            return Response(200, json.dumps(body))
        if parts.path == "/-/ready":
            return Response(200, "ready")
        return Response(404, "not found")

    exp = StackExpectation(
        replicas=[Replica("prom01", URL, "prom01", "lab", "replica", "cluster")],
        targets=[Target("dcgm", f"{node}:9400", node)],
        gpus={node: gpus},
    )
    status.check_replica(exp, exp.replicas[0], fetch)
    assert len(asked) == 1, asked
    return asked[0]


def count_per_node(promtool_path: str, tmp_path: Path, capture: str, node: str, want: int) -> int:
    """Assert through promtool that status's query answers ``want`` GPUs for ``node`` over the
    captured scrape's GPU temperature series (as the dcgm job stores them); their number back."""
    query = gpu_query(node, want)
    series = stored(
        capture, target_labels(node, cluster="lab"), only={dcgm_fields.metric("gpu_temp")}
    )
    rule = {"record": "status_gpus", "expr": query}
    (tmp_path / "rules.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "s", "rules": [rule]}]})
    )
    expect = {"labels": f'status_gpus{{node="{node}"}}', "value": want}
    case = {
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [{"expr": "status_gpus", "eval_time": "5m", "exp_samples": [expect]}],
    }
    path = tmp_path / "test.yml"
    path.write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "tests": [case]}))
    result = run_promtool(promtool_path, "test", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    return len(series)


def test_status_counts_a_mig_node_by_uuid_not_by_series(promtool, tmp_path):
    series = count_per_node(promtool, tmp_path, A800, "gpu05", 2)
    assert series == 4  # the capture: GPU 0 once per GPU instance (3), GPU 1 once


def test_status_counts_a_node_without_mig_as_before(promtool, tmp_path):
    assert count_per_node(promtool, tmp_path, H100, "gpu01", 8) == 8
