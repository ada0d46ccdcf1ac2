"""``status`` counts a node's GPUs, not its series: on a GPU in MIG mode dcgm-exporter emits one
series per GPU instance, each carrying the parent GPU's UUID (the real 8xA800 scrape: GPU 0 in
MIG mode with 3 instances, GPU 1 not, is 2 GPUs and 4 series of DCGM_FI_DEV_GPU_TEMP).

The query status sends (``checks_gpus.gpu_query``) is evaluated by promtool over the captured
scrape's series as Prometheus stores them, and its answer counted as status counts it
(``checks_gpus.gpus_by_node``), so the test judges what Prometheus answers, not the query's text."""

from __future__ import annotations

from pathlib import Path

import yaml

from deployer.monitoring import checks_gpus
from tests.unit.test_rule_pack import promtool, run_promtool
from tests.unit.test_rule_pack_reality import A800, H100, stored, target_labels

__all__ = ["promtool"]  # the fixture


def count_per_node(promtool_path: str, tmp_path: Path, capture: str, node: str, want: int) -> int:
    """Assert through promtool that status's query answers one series per GPU of ``node`` (``want``
    of them) over the captured scrape's GPU temperature series, and that status counts ``want``
    GPUs from that answer; the number of captured series back."""
    metric = checks_gpus.presence_metric()
    query = checks_gpus.gpu_query(metric, since=0.0)
    series = stored(capture, target_labels(node, cluster="lab"), only={metric})
    uuids = sorted({s["series"].split('UUID="')[1].split('"')[0] for s in series})
    assert len(uuids) == want
    rule = {"record": "status_gpus", "expr": query}
    (tmp_path / "rules.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "s", "rules": [rule]}]})
    )
    expect = [{"labels": f'status_gpus{{node="{node}",UUID="{u}"}}', "value": 1} for u in uuids]
    case = {
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [{"expr": "status_gpus", "eval_time": "5m", "exp_samples": expect}],
    }
    path = tmp_path / "test.yml"
    path.write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "tests": [case]}))
    result = run_promtool(promtool_path, "test", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    answer = [{"metric": {"node": node, "UUID": u}, "value": [300, "1"]} for u in uuids]
    assert checks_gpus.gpus_by_node(answer) == ({node: want}, {})
    return len(series)


def test_status_counts_a_mig_node_by_uuid_not_by_series(promtool, tmp_path):
    series = count_per_node(promtool, tmp_path, A800, "gpu05", 2)
    assert series == 4  # the capture: GPU 0 once per GPU instance (3), GPU 1 once


def test_status_counts_a_node_without_mig_as_before(promtool, tmp_path):
    assert count_per_node(promtool, tmp_path, H100, "gpu01", 8) == 8
