"""The replicas' remote_write is sized for a GPU host's GPUs as the plan counts them: the declared
``gpu_count``, else what the host's facts count (nvidia-smi, else the PCI bus), else an estimate
of 8 (no facts read). A run limited to the replicas reads those facts too (read-only), so it
sizes the queues as a run over the whole inventory does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from deployer.facts import GPU, HostFacts
from deployer.monitoring import remote_write
from deployer.session import DeploySession, RunOptions, validation_facts

INVENTORY = """\
all:
  vars:
    release_mirror_url: http://mirror.invalid/releases
  hosts:
    gpu01: {ansible_host: 192.0.2.11, gpu_model: H100, gpu_count: 8}
    gpu02: {ansible_host: 192.0.2.12}
    prom01: {ansible_host: 192.0.2.21}
    mon01: {ansible_host: 192.0.2.23}
  children:
    gpu:
      hosts: {gpu01: {}, gpu02: {}}
    prometheus:
      hosts: {prom01: {}}
    metrics_store:
      hosts: {mon01: {}}
"""
PER_GPU = 60  # the role's default dcgm series per GPU


# So many series per GPU that the GPUs decide the shards.
HEAVY = json.dumps(
    {
        "prometheus_remote_write_series_estimate": {
            "dcgm_per_gpu": 1_500_000, "node": 1500, "prometheus": 1500, "alertmanager": 300,
            "thanos-sidecar": 300, "victoriametrics": 1500, "other": 500,
        }
    }
)  # fmt: skip


def session(tmp_path: Path, limit: str | None = None, *extra: str) -> DeploySession:
    inv = tmp_path / "inventory.yml"
    inv.write_text(INVENTORY)
    options = RunOptions(inventory=inv, limit=limit, extra_vars=list(extra))
    return DeploySession.load(options, plan=False)


def gpus(host: str, n: int) -> HostFacts:
    found = HostFacts(host=host, nvidia_smi="ok")
    found.gpus = [GPU(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", 81559, f"0:{i}:0", "Disabled") for i in range(n)]  # fmt: skip
    return found


def dcgm_rate(s: DeploySession, counts: dict[str, int]) -> float:
    """prom01's samples/s minus the same without any dcgm target (the dcgm part)."""
    planner = s.load_content()
    play = next(p for p in s.plays if "prometheus" in p.roles)
    context = {"facts": validation_facts("prom01").to_json(), "gpumon_gpu_counts": counts}
    with_ = planner.host_vars("prom01", play, context)
    without = {**with_, "prometheus_scrape_jobs": [j for j in with_["prometheus_scrape_jobs"] if j != "dcgm"]}  # fmt: skip
    every = remote_write.seconds(with_["prometheus_scrape_interval"])
    overhead = 1 + float(with_["prometheus_remote_write_rules_overhead"])
    diff = remote_write.samples_per_second(with_) - remote_write.samples_per_second(without)
    return diff / overhead * every / PER_GPU  # GPUs


def test_an_undeclared_host_is_sized_with_the_gpus_its_facts_count(tmp_path):
    assert dcgm_rate(session(tmp_path), {"gpu02": 2}) == pytest.approx(8 + 2)


def test_a_declared_count_wins_over_the_facts(tmp_path):
    assert dcgm_rate(session(tmp_path), {"gpu01": 1, "gpu02": 2}) == pytest.approx(8 + 2)


def test_without_facts_an_undeclared_host_is_estimated_at_8(tmp_path):
    assert dcgm_rate(session(tmp_path), {}) == pytest.approx(8 + 8)


def min_shards(s: DeploySession, facts: dict[str, HostFacts]) -> int:
    s.load_content()
    (plan,) = s.plan_hosts(["prom01"], s.plays, facts)
    (task,) = [t for p in plan.plays for t in p.tasks if t.name.startswith("prometheus.yml")]
    return int(
        yaml.safe_load(task.args["content"])["remote_write"][0]["queue_config"]["min_shards"]
    )


def test_the_plan_sizes_the_replicas_for_the_gpus_the_facts_read_count(tmp_path):
    with_facts = min_shards(session(tmp_path, None, HEAVY), {"gpu02": gpus("gpu02", 2)})
    without = min_shards(session(tmp_path, None, HEAVY), {})
    # (8 + 2) and (8 + 8) GPUs x 1.5M series / 15 s x 1.1 (rules) / 20k per shard, + the rest
    assert (with_facts, without) == (56, 89)


def test_a_run_limited_to_the_replicas_reads_the_facts_of_undeclared_gpu_hosts(tmp_path):
    s = session(tmp_path, limit="prometheus")
    s.build_plan()
    assert s.sizing_hosts() == ["gpu02"]


def test_a_run_over_the_gpu_hosts_only_reads_no_other_host(tmp_path):
    s = session(tmp_path, limit="gpu")
    s.build_plan()
    assert s.sizing_hosts() == []
