"""``status`` holds a GPU node whose inventory declares no ``gpu_count`` to the count the plan
used (deployer/gpu/gpu_plan.py, rule ``gpu-count-facts``): the number ``up`` recorded on the host
(node_exporter's textfile, ``gpumon_expected_gpus``), else the facts status reads now, else
(``--api-only``) the record as the replicas scraped it. A declared count stays the number.
Canned answers as in test_monitoring_status.py."""

from __future__ import annotations

import urllib.parse
from typing import Any

from deployer.monitoring import status
from deployer.monitoring.checks_gpus import expected_counts, parse_record
from deployer.monitoring.http import Response
from tests.unit.test_monitoring_status import (
    NOW,
    CannedHosts,
    CannedStack,
    detail,
    expectation,
    failed,
    gpu_series,
    ok,
    row,
)

RECORD = "/var/lib/node_exporter/textfile_collector/gpumon.prom"
UNDECLARED: dict[str, Any] = {"gpus": {}, "gpu_records": {"gpu01": RECORD}}


class Stack(CannedStack):
    """The canned stack, also answering the query of the scraped record."""

    def __init__(self) -> None:
        super().__init__()
        self.gpus = {base: gpu_series("gpu01", 2) for base in self.gpus}
        self.scraped: dict[str, int] = {"gpu01": 2}

    def __call__(self, url: str) -> Response:
        parts = urllib.parse.urlsplit(url)
        q = urllib.parse.parse_qs(parts.query).get("query", [""])[0]
        if parts.path == "/api/v1/query" and q == "max by (node) (gpumon_expected_gpus)":
            self.asked.append(url)
            result = [
                {"metric": {"node": n}, "value": [NOW, str(c)]} for n, c in self.scraped.items()
            ]
            return ok({"status": "success", "data": {"resultType": "vector", "result": result}})
        return super().__call__(url)


class Hosts(CannedHosts):
    """The canned hosts; gpu01's record of the last ``up`` (None: no file)."""

    def __init__(self) -> None:
        super().__init__()
        self.record: str | None = "# TYPE gpumon_expected_gpus gauge\ngpumon_expected_gpus 2\n"

    def __call__(self, host: str) -> Any:
        conn = super().__call__(host)
        if host == "gpu01":
            conn.on(f"cat {RECORD}", stdout=self.record or "")
        return conn


def run(stack: Stack, hosts: Hosts | None) -> list[status.Check]:
    return status.collect(expectation(**UNDECLARED), stack, hosts, now=lambda: NOW)


def test_an_undeclared_node_is_held_to_the_count_up_recorded():
    checks = run(Stack(), Hosts())
    assert failed(checks) == []
    assert detail(checks, "gpu01", "2 GPUs in the exporter's metrics") == (
        "2/2 (distinct UUIDs) on 2 replica(s) (recorded by up)"
    )


def test_a_gpu_lost_since_up_fails_although_the_facts_now_show_one_fewer():
    stack, hosts = Stack(), Hosts()
    stack.gpus = {base: gpu_series("gpu01", 1) for base in stack.gpus}
    hosts.smi["gpu01"] = "\n".join([*hosts.smi["gpu01"].splitlines()[:2], "@@smi_rc", "rc=0", ""])
    checks = run(stack, hosts)
    assert ("gpus", "gpu01", "2 GPUs in the exporter's metrics") in failed(checks)
    assert "prom01 sees 1" in detail(checks, "gpu01", "2 GPUs in the exporter's metrics")


def test_without_a_record_the_node_is_held_to_its_facts_now():
    stack, hosts = Stack(), Hosts()
    hosts.record = None
    checks = run(stack, hosts)
    got = row(checks, "gpu01", "2 GPUs in the exporter's metrics")
    assert got.ok and "facts, nvidia-smi; no record of up on the host" in got.detail


def test_without_a_record_a_missing_gpu_against_the_facts_fails():
    stack, hosts = Stack(), Hosts()
    hosts.record = None
    stack.gpus[stack_url(stack, 1)] = gpu_series("gpu01", 1)
    assert ("gpus", "gpu01", "2 GPUs in the exporter's metrics") in failed(run(stack, hosts))


def test_api_only_holds_the_node_to_the_record_the_replicas_scraped():
    stack = Stack()
    stack.scraped = {"gpu01": 3}
    checks = run(stack, None)
    assert ("gpus", "gpu01", "3 GPUs in the exporter's metrics") in failed(checks)
    assert "gpumon_expected_gpus as scraped" in detail(
        checks, "gpu01", "3 GPUs in the exporter's metrics"
    )


def test_a_node_nothing_gives_a_count_fails_saying_why():
    stack = Stack()
    stack.scraped = {}
    checks = run(stack, None)
    assert ("gpus", "gpu01", "GPUs in the exporter's metrics") in failed(checks)


def test_the_record_is_read_read_only():
    hosts = Hosts()
    run(Stack(), hosts)
    assert f"cat {RECORD} 2>/dev/null || true" in hosts.conns["gpu01"].commands


def test_a_declared_count_stays_the_number_whatever_the_record_says():
    got = expected_counts({"g": 8}, ["g"], {"g": 2}, {"g": (2, "nvidia-smi")})
    assert got == {"g": (8, "gpu_count")}


def test_a_record_differing_from_the_facts_now_is_noted():
    got = expected_counts({}, ["g"], {"g": 8}, {"g": (7, "nvidia-smi")})
    assert got == {"g": (8, "recorded by up; facts now show 7 (nvidia-smi)")}


def test_the_record_is_parsed_from_the_textfile_and_absent_is_none():
    assert parse_record("# HELP x\ngpumon_expected_gpus 4\n") == 4
    assert parse_record("") is None


def stack_url(stack: Stack, i: int) -> str:
    return sorted(stack.gpus)[i]


def test_the_expectation_reads_an_undeclared_nodes_record_where_its_node_exporter_writes(
    tmp_path,
):
    inv = tmp_path / "inventory.yml"
    inv.write_text(
        """\
all:
  hosts:
    gpu01: {ansible_host: 192.0.2.11, gpu_model: H100, gpu_count: 8}
    gpu02: {ansible_host: 192.0.2.12, node_exporter_textfile_dir: /srv/textfile}
    prom01: {ansible_host: 192.0.2.21}
  children:
    gpu: {hosts: {gpu01: {}, gpu02: {}}}
    prometheus: {hosts: {prom01: {}}}
"""
    )
    exp = status.load_expectation(inv)
    assert exp.gpus == {"gpu01": 8}
    assert exp.gpu_records == {"gpu02": "/srv/textfile/gpumon.prom"}
    assert "gpu02" in exp.ssh


def test_the_global_view_holds_undeclared_nodes_to_the_same_counts():
    from tests.unit.test_status_store import expectation as store_expectation
    from tests.unit.test_status_store import healthy_stack

    stack = Stack()
    stack.scraped = {"gpu01": 2, "gpu02": 1}
    exp = expectation(gpus={}, gpu_records={"gpu01": RECORD, "gpu02": RECORD})
    exp.store = store_expectation(gpus={})  # what store.expect gives with no gpu_count
    checks = status.collect(exp, stack, None, now=lambda: NOW, store_fetch=healthy_stack())
    once = row(checks, "victoriametrics", "every GPU once")
    assert once.ok and once.detail.startswith("3 GPUs of 2 hosts"), once
