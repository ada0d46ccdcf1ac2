"""The ``status`` table on canned API answers: what is green, and what fails naming host and
cause. Plus the HTTP fetch itself against a real local server, and the expectation built from an
inventory through the roles' variables."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer import status
from deployer.errors import InputError
from deployer.file_sd import Target
from deployer.status import Check, Endpoint, Peer, Replica, Response, StackExpectation

P1, P2 = "http://10.0.0.21:9090", "http://10.0.0.22:9090"
AMS = {"prom01": "10.0.0.21", "prom02": "10.0.0.22", "mon01": "10.0.0.23"}


def expectation(**kw: Any) -> StackExpectation:
    exp = StackExpectation(
        replicas=[
            Replica("prom01", P1, "prom01", "c1", "replica", "cluster"),
            Replica("prom02", P2, "prom02", "c1", "replica", "cluster"),
        ],
        alertmanagers=[Peer(h, f"http://{a}:9093", f"{a}:9094") for h, a in AMS.items()],
        targets=[
            Target("dcgm", "10.0.0.11:9400", "gpu01"),
            Target("node", "10.0.0.11:9100", "gpu01"),
            Target("prometheus", "10.0.0.21:9090", "prom01"),
            Target("prometheus", "10.0.0.22:9090", "prom02"),
        ],
        gpus={"gpu01": 8},
    )
    for k, v in kw.items():
        setattr(exp, k, v)
    return exp


class CannedStack:
    """A fetch function answering like a healthy stack; tests break one piece at a time."""

    def __init__(self) -> None:
        self.down: set[str] = set()  # base URLs with no answer
        self.labels = {
            P1: {"cluster": "c1", "replica": "prom01"},
            P2: {"cluster": "c1", "replica": "prom02"},
        }
        self.up = {("dcgm", "10.0.0.11:9400"): "1", ("node", "10.0.0.11:9100"): "1",
                   ("prometheus", "10.0.0.21:9090"): "1", ("prometheus", "10.0.0.22:9090"): "1"}  # fmt: skip
        self.rule_files = ["gpu-alerts.yml", "gpu-recording.yml", "meta-alerts.yml"]
        self.gpus = {P1: 8, P2: 8}
        self.am_status = {a: "ready" for a in AMS.values()}
        self.am_peers = {a: [f"{p}:9094" for p in AMS.values()] for a in AMS.values()}
        self.asked: list[str] = []

    def __call__(self, url: str) -> Response:
        self.asked.append(url)
        parts = urllib.parse.urlsplit(url)
        base = f"{parts.scheme}://{parts.netloc}"
        if base in self.down:
            return Response(0, error=f"no answer from {url}: [Errno 111] Connection refused")
        if parts.path == "/-/ready":
            return Response(200, "Prometheus Server is Ready.\n")
        if parts.path == "/api/v1/status/config":
            config = {"global": {"external_labels": self.labels[base]}}
            return ok({"status": "success", "data": {"yaml": yaml.safe_dump(config)}})
        if parts.path == "/api/v1/rules":
            groups = [
                {"file": f"/etc/prometheus/rules/{f}", "rules": [{"name": "R", "health": "ok"}]}
                for f in self.rule_files
            ]
            return ok({"status": "success", "data": {"groups": groups}})
        if parts.path == "/api/v1/query":
            query = urllib.parse.parse_qs(parts.query)["query"][0]
            if query == "up":
                result = [
                    {"metric": {"job": j, "instance": i}, "value": [0, v]}
                    for (j, i), v in self.up.items()
                ]
            else:
                assert query == (
                    'count by (node) (count by (node, UUID) (DCGM_FI_DEV_GPU_TEMP{job="dcgm"}))'
                )
                result = [{"metric": {"node": "gpu01"}, "value": [0, str(self.gpus[base])]}]
            return ok({"status": "success", "data": {"resultType": "vector", "result": result}})
        if parts.path == "/api/v2/status":
            addr = parts.hostname
            peers = [{"name": p, "address": p} for p in self.am_peers[addr]]
            return ok({"cluster": {"status": self.am_status[addr], "peers": peers}})
        return Response(404, "not found")


def ok(data: Any) -> Response:
    return Response(200, json.dumps(data))


def failed(checks: list[Check]) -> list[tuple[str, str, str]]:
    return [(c.component, c.host, c.check) for c in checks if not c.ok]


def detail(checks: list[Check], host: str, check: str) -> str:
    return next(c.detail for c in checks if c.host == host and c.check == check)


@pytest.fixture
def stack() -> CannedStack:
    return CannedStack()


def test_a_healthy_stack_is_all_green(stack):
    checks = status.collect(expectation(), stack)
    assert failed(checks) == []
    names = {(c.host, c.check) for c in checks}
    for host in ("prom01", "prom02"):
        for check in ("ready", "external labels", "rules loaded", "scraping job dcgm"):
            assert (host, check) in names
    assert ("mon01", "cluster ready with every peer") in names
    assert ("gpu01", "8 GPUs in the exporter's metrics") in names


def test_a_stopped_replica_fails_naming_it_and_the_other_still_checks(stack):
    stack.down.add(P2)
    checks = status.collect(expectation(), stack)
    assert ("prometheus", "prom02", "ready") in failed(checks)
    assert "Connection refused" in detail(checks, "prom02", "ready")
    prom02 = [c.check for c in checks if c.component == "prometheus" and c.host == "prom02"]
    assert prom02 == ["ready"]
    assert not [f for f in failed(checks) if f[1] == "prom01"]


def test_identical_external_labels_fail_the_distinct_check(stack):
    stack.labels[P2] = {"cluster": "c1", "replica": "prom01"}
    checks = status.collect(expectation(), stack)
    assert ("prometheus", "*", "external labels distinct") in failed(checks)
    assert "prom01 and prom02" in detail(checks, "*", "external labels distinct")
    assert "replica='prom01'" in detail(checks, "prom02", "external labels")


def test_a_down_target_fails_its_job_naming_node_and_instance(stack):
    stack.up[("dcgm", "10.0.0.11:9400")] = "0"
    checks = status.collect(expectation(), stack)
    assert ("prometheus", "prom01", "scraping job dcgm") in failed(checks)
    assert detail(checks, "prom01", "scraping job dcgm") == "gpu01 (10.0.0.11:9400) down"
    assert detail(checks, "prom01", "scraping job node") == "1/1 up"


def test_a_target_never_scraped_is_named(stack):
    del stack.up[("node", "10.0.0.11:9100")]
    checks = status.collect(expectation(), stack)
    assert detail(checks, "prom02", "scraping job node") == "gpu01 (10.0.0.11:9100) not scraped"


def test_a_missing_rule_file_fails_rules_loaded(stack):
    stack.rule_files = ["gpu-alerts.yml"]
    checks = status.collect(expectation(), stack)
    assert ("prometheus", "prom01", "rules loaded") in failed(checks)
    assert "gpu-recording.yml, meta-alerts.yml" in detail(checks, "prom01", "rules loaded")


def test_missing_gpus_fail_naming_the_replica_and_count(stack):
    stack.gpus[P1] = 7
    checks = status.collect(expectation(), stack)
    assert failed(checks) == [("gpus", "gpu01", "8 GPUs in the exporter's metrics")]
    assert detail(checks, "gpu01", "8 GPUs in the exporter's metrics") == "prom01 sees 7"


def test_a_settling_alertmanager_fails(stack):
    stack.am_status["10.0.0.23"] = "settling"
    checks = status.collect(expectation(), stack)
    assert failed(checks) == [("alertmanager", "mon01", "cluster ready with every peer")]
    assert "settling" in detail(checks, "mon01", "cluster ready with every peer")


def test_an_alertmanager_missing_a_peer_names_the_peer(stack):
    stack.am_peers["10.0.0.21"] = ["10.0.0.21:9094", "10.0.0.22:9094"]
    checks = status.collect(expectation(), stack)
    assert "peers missing: 10.0.0.23:9094" in detail(
        checks, "prom01", "cluster ready with every peer"
    )


def test_an_unreachable_alertmanager_fails(stack):
    stack.down.add("http://10.0.0.22:9093")
    checks = status.collect(expectation(), stack)
    assert ("alertmanager", "prom02", "cluster ready with every peer") in failed(checks)


def test_thanos_not_deployed_is_reported_but_not_a_failure(stack):
    checks = status.collect(expectation(), stack)
    row = next(c for c in checks if c.component == "thanos")
    assert row.ok and "not deployed" in row.detail


def test_thanos_components_must_be_ready_when_deployed(stack):
    exp = expectation(
        thanos_active=True,
        thanos_sidecars=[Endpoint("prom01", "http://10.0.0.21:10902")],
        thanos_queries=[Endpoint("mon01", "http://10.0.0.23:19192")],
    )
    stack.down.add("http://10.0.0.23:19192")
    checks = status.collect(exp, stack)
    assert failed(checks) == [("thanos query", "mon01", "ready")]
    assert ("thanos sidecar", "prom01", "ready") in {(c.component, c.host, c.check) for c in checks}


def thanos_expectation() -> StackExpectation:
    return expectation(
        thanos_active=True,
        thanos_sidecars=[
            Endpoint("prom01", "http://10.0.0.21:10902"),
            Endpoint("prom02", "http://10.0.0.22:10902"),
        ],
        thanos_queries=[Endpoint("mon01", "http://10.0.0.23:19192")],
        thanos_stores=["10.0.0.21:10901", "10.0.0.22:10901"],
    )


def stores_answer(stack: CannedStack, stores: list[dict[str, Any]]) -> Any:
    def fetch(url: str) -> Response:
        if url == "http://10.0.0.23:19192/api/v1/stores":
            return ok({"status": "success", "data": {"sidecar": stores}})
        return stack(url)

    return fetch


def test_query_with_every_sidecar_as_a_healthy_store_is_green(stack):
    fetch = stores_answer(
        stack,
        [{"name": "10.0.0.21:10901", "lastError": None}, {"name": "10.0.0.22:10901"}],
    )
    checks = status.collect(thanos_expectation(), fetch)
    assert failed(checks) == []
    assert detail(checks, "mon01", "every sidecar a store") == "2/2 sidecars"


def test_query_missing_or_failing_a_sidecar_store_fails_naming_it(stack):
    fetch = stores_answer(
        stack,
        [{"name": "10.0.0.21:10901", "lastError": "connection refused"}],
    )
    checks = status.collect(thanos_expectation(), fetch)
    assert failed(checks) == [("thanos query", "mon01", "every sidecar a store")]
    assert detail(checks, "mon01", "every sidecar a store") == (
        "not healthy stores: 10.0.0.21:10901, 10.0.0.22:10901"
    )


def test_only_the_expected_addresses_are_asked(stack):
    status.collect(expectation(), stack)
    hosts = {urllib.parse.urlsplit(u).hostname for u in stack.asked}
    assert hosts == {"10.0.0.21", "10.0.0.22", "10.0.0.23"}


def test_json_and_table_name_the_failures(stack):
    stack.down.add(P2)
    checks = status.collect(expectation(), stack)
    data = status.to_json(checks)
    assert data["ok"] is False
    assert data["failed"] == [
        {
            "component": "prometheus",
            "host": "prom02",
            "check": "ready",
            "ok": False,
            "detail": detail(checks, "prom02", "ready"),
        }
    ]
    text = status.table(checks)
    assert text.splitlines()[0].split()[:4] == ["COMPONENT", "HOST", "CHECK", "RESULT"]
    assert any("prom02" in ln and "FAILED" in ln for ln in text.splitlines())


# ---------------------------------------------------------------- HTTP for real (loopback only)


@pytest.fixture
def local_server() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = 200 if self.path == "/-/ready" else 503
            body = b"ready" if code == 200 else b"not ready"
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_fetch_returns_status_and_body(local_server):
    assert status.http_fetch(f"{local_server}/-/ready") == Response(200, "ready")
    assert status.http_fetch(f"{local_server}/other").status == 503


def test_http_fetch_reports_no_answer_without_raising():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = status.http_fetch(f"http://127.0.0.1:{port}/-/ready", timeout=2)
    assert r.status == 0 and r.error is not None and "no answer" in r.error


# ---------------------------------------------------------------- expectation from an inventory

INVENTORY = """\
all:
  hosts:
    gpu01: {ansible_host: 192.0.2.11, gpu_model: H100, gpu_count: 8}
    gpu02: {ansible_host: 192.0.2.12, gpu_model: A100, gpu_count: 4}
    prom01: {ansible_host: 192.0.2.21}
    prom02: {ansible_host: 192.0.2.22}
    mon01: {ansible_host: 192.0.2.23}
  children:
    gpu: {hosts: {gpu01: {}, gpu02: {}}}
    prometheus: {hosts: {prom01: {}, prom02: {}}}
    alertmanager: {hosts: {prom01: {}, prom02: {}, mon01: {}}}
    thanos_query: {hosts: {mon01: {}}}
"""


def test_expectation_follows_the_inventory_and_role_variables(tmp_path: Path):
    inv = tmp_path / "inventory.yml"
    inv.write_text(INVENTORY)
    exp = status.load_expectation(inv, ["prometheus_port=9091"])
    assert [(r.host, r.url, r.replica) for r in exp.replicas] == [
        ("prom01", "http://192.0.2.21:9091", "prom01"),
        ("prom02", "http://192.0.2.22:9091", "prom02"),
    ]
    assert [p.cluster_address for p in exp.alertmanagers] == [
        "192.0.2.21:9094",
        "192.0.2.22:9094",
        "192.0.2.23:9094",
    ]
    assert exp.gpus == {"gpu01": 8, "gpu02": 4}
    assert Target("dcgm", "192.0.2.12:9400", "gpu02") in exp.targets
    assert not exp.thanos_active


def test_expectation_includes_thanos_when_enabled(tmp_path: Path):
    inv = tmp_path / "inventory.yml"
    inv.write_text(INVENTORY)
    exp = status.load_expectation(inv, ["thanos_enabled=true"])
    assert exp.thanos_active
    assert [e.url for e in exp.thanos_sidecars] == [
        "http://192.0.2.21:10902",
        "http://192.0.2.22:10902",
    ]
    assert [e.url for e in exp.thanos_queries] == ["http://192.0.2.23:19192"]
    assert exp.thanos_stores == ["192.0.2.21:10901", "192.0.2.22:10901"]


def test_an_inventory_without_monitoring_hosts_is_an_input_error(tmp_path: Path):
    inv = tmp_path / "inventory.yml"
    inv.write_text(
        "all:\n  hosts:\n    gpu01: {gpu_count: 8}\n  children:\n    gpu: {hosts: {gpu01: {}}}\n"
    )
    with pytest.raises(InputError, match="nothing to check"):
        status.load_expectation(inv)
