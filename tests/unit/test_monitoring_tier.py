"""The monitoring tier as a rollout sees it (deployer/monitoring/tier.py): after a GPU host is
upgraded, the replicas that scrape it must see it with the new driver label; in a sharded tier
those are its shard's pair, never the other shards' replicas, which do not scrape it."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from deployer.errors import InputError
from deployer.monitoring import shards
from deployer.monitoring import tier as monitoring_tier
from deployer.monitoring.http import Response
from deployer.rollout import validation
from deployer.session import DeploySession, RunOptions

GPUS = [f"gpu{i:02d}" for i in range(1, 9)]
SHARD_OF = {"prom01": "a", "prom02": "a", "prom03": "b", "prom04": "b"}


def inventory(tmp_path: Path, sharded: bool) -> Path:
    hosts = "".join(f"    {g}: {{ansible_host: 192.0.2.{10 + i}}}\n" for i, g in enumerate(GPUS))
    hosts += "".join(
        f"    {r}: {{ansible_host: 198.51.100.{10 + i}"
        + (f", prometheus_shard: {s}}}\n" if sharded else "}\n")
        for i, (r, s) in enumerate(SHARD_OF.items())
    )
    path = tmp_path / "inventory.yml"
    path.write_text(
        f"all:\n  vars: {{cluster: c1, prometheus_shard_record: {tmp_path / 'record.json'}}}\n"
        f"  hosts:\n{hosts}  children:\n"
        f"    gpu: {{hosts: {{{', '.join(f'{g}: {{}}' for g in GPUS)}}}}}\n"
        f"    prometheus: {{hosts: {{{', '.join(f'{r}: {{}}' for r in SHARD_OF)}}}}}\n"
    )
    return path


def tier_of(path: Path) -> monitoring_tier.MonitoringTier:
    return monitoring_tier.load(DeploySession.load(RunOptions(inventory=path), plan=False))


def test_in_a_sharded_tier_a_node_is_seen_by_its_own_shards_pair_only(tmp_path):
    tier = tier_of(inventory(tmp_path, sharded=True))
    owner = shards.host_shards(GPUS, {}, ["a", "b"])
    for node in GPUS:
        want = [r for r, s in SHARD_OF.items() if s == owner[node]]
        assert [h for h, _ in tier.replicas_of(node)] == want
    assert {owner[g] for g in GPUS} == {"a", "b"}  # both shards own some: the test means it


def test_one_pair_sees_every_node_and_an_unlisted_node_is_asked_of_every_replica(tmp_path):
    tier = tier_of(inventory(tmp_path, sharded=False))
    assert tier.scrapers == {}
    assert [h for h, _ in tier.replicas_of("gpu01")] == list(SHARD_OF)
    sharded = tier_of(inventory(tmp_path, sharded=True))
    assert [h for h, _ in sharded.replicas_of("gpu99")] == list(SHARD_OF)


def prometheus_answering(scraped_by: set[str], node: str) -> Any:
    """Each replica's query API: those in ``scraped_by`` have the node's targets up and its 8
    GPUs with the new driver label; the others have no target of it."""

    def fetch(url: str, *_: object) -> Response:
        base, query = url.split("/api/v1/query?")
        promql = urllib.parse.parse_qs(query)["query"][0]
        mine = any(base.endswith(f"198.51.100.{10 + i}:9090") for i, r in enumerate(SHARD_OF)
                   if r in scraped_by)  # fmt: skip
        if not mine:
            result: list[dict[str, Any]] = []
        elif promql.startswith("up{"):
            result = [{"metric": {"job": j, "node": node}, "value": [0, "1"]}
                      for j in ("dcgm", "node")]  # fmt: skip
        else:
            result = [{"metric": {}, "value": [0, "8"]}]
        return Response(200, json.dumps({"status": "success", "data": {"result": result}}))

    return fetch


def test_validation_waits_only_for_the_replicas_that_scrape_the_upgraded_host(tmp_path):
    # Before: every replica of every shard was asked, the other shard's answered "no target
    # of gpuNN", and every upgraded host of a sharded tier failed validation at its timeout.
    tier = tier_of(inventory(tmp_path, sharded=True))
    node = "gpu01"
    own = {h for h, _ in tier.replicas_of(node)}
    host = SimpleNamespace(host=node, clock=lambda: 0.0, wait=lambda s: None)
    target = SimpleNamespace(gpu_count=8)
    fetch = prometheus_answering(own, node)
    said = validation._prometheus(host, target, "595.58.03", tier, fetch, 0, lambda _: None)
    assert said is None
    # and a replica of its own shard that lost it still fails it, named
    half = prometheus_answering(own - {sorted(own)[0]}, node)
    said = validation._prometheus(host, target, "595.58.03", tier, half, 0, lambda _: None)
    assert said == f"{sorted(own)[0]}: no target of {node}"


def test_a_tier_whose_re_shard_up_has_not_finished_is_refused_naming_both_layouts(tmp_path):
    # The inventory asks for shards a and b; the last whole up recorded one pair. Until up hands
    # the hosts over, a moved host's new owner does not scrape it: an upgraded host would fail
    # validation after its reboot, for want of a scraper that is not one yet.
    path = inventory(tmp_path, sharded=True)
    record = tmp_path / "record.json"
    pair = {"format": 1, "shards": [""], "by": "host", "replicas": ["prom01", "prom02"]}
    record.write_text(json.dumps(pair))
    with pytest.raises(InputError) as refused:
        tier_of(path)
    said = str(refused.value)
    assert f"{record}: one pair of prom01, prom02 recorded" in said
    assert "the inventory asks for shards a, b (by host) of prom01, prom02, prom03, prom04" in said
    assert "run a whole `gpumon-deploy up` first" in said
    assert json.loads(record.read_text()) == pair  # left as it was
    # once up has recorded the layout, the tier loads (and each node has its shard's pair)
    settled = {**pair, "shards": ["a", "b"], "replicas": list(SHARD_OF)}
    record.write_text(json.dumps(settled))
    assert set(tier_of(path).scrapers) == set(GPUS)
