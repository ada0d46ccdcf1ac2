"""The ``status`` table on canned answers: what is green, what is pending and what fails naming
the host and the cause. The APIs answer like Prometheus 2.42 / Alertmanager 0.25 (shapes cited
in deployer/monitoring/); the hosts answer like the product's read-only commands. Plus the
expectation built from an inventory through the roles' variables (the HTTP client itself:
tests/unit/test_monitoring_http.py)."""

from __future__ import annotations

import json
import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.connection import ScriptedConnection
from deployer.errors import HostUnreachable, InputError
from deployer.facts import FACTS_SCRIPT
from deployer.monitoring import checks_global, status
from deployer.monitoring.check import FAILED, OK, PENDING, overall, table, to_json
from deployer.monitoring.checks_loaded import md5_metric_value, md5_of
from deployer.monitoring.file_sd import Target
from deployer.monitoring.http import Response
from deployer.monitoring.status import Check, Endpoint, Peer, Replica, StackExpectation
from deployer.monitoring.store import Store, StoreExpectation

P1, P2 = "http://10.0.0.21:9090", "http://10.0.0.22:9090"
AMS = {"prom01": "10.0.0.21", "prom02": "10.0.0.22", "mon01": "10.0.0.23"}
NOW = 1_800_000_000.0
STARTED = NOW - 3600  # every daemon started an hour ago
LOADED = NOW - 1800  # and loaded its config half an hour ago
WRITTEN = NOW - 1900  # its files written just before that
AM_CONFIG = b"route:\n  receiver: r\nreceivers:\n  - name: r\n"
RULES = "/etc/prometheus/rules"
LOADS = ("gpu-alerts.yml", "gpu-recording.yml", "meta-alerts.yml")  # the replicas' rule files


def rfc3339(epoch: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).isoformat().replace("+00:00", "Z")


def expectation(**kw: Any) -> StackExpectation:
    exp = StackExpectation(
        replicas=[
            Replica("prom01", P1, "prom01", "c1", "replica", "cluster", loads=LOADS),
            Replica("prom02", P2, "prom02", "c1", "replica", "cluster", loads=LOADS),
        ],
        alertmanagers=[Peer(h, f"http://{a}:9093", f"{a}:9094") for h, a in AMS.items()],
        targets=[
            Target("dcgm", "10.0.0.11:9400", "gpu01"),
            Target("node", "10.0.0.11:9100", "gpu01"),
            Target("prometheus", "10.0.0.21:9090", "prom01"),
            Target("prometheus", "10.0.0.22:9090", "prom02"),
        ],
        gpus={"gpu01": 8},
        gpu_hosts=["gpu01"],
    )
    for k, v in kw.items():
        setattr(exp, k, v)
    return exp


def gpu_series(node: str, n: int) -> list[dict[str, str]]:
    return [{"node": node, "UUID": f"GPU-{node}-{i}"} for i in range(n)]


class CannedStack:
    """A fetch function answering like a healthy stack; tests break one piece at a time."""

    def __init__(self) -> None:
        self.down: set[str] = set()  # base URLs with no answer
        self.not_ready: set[str] = set()  # base URLs answering /-/ready with 503
        self.labels = {
            P1: {"cluster": "c1", "replica": "prom01"},
            P2: {"cluster": "c1", "replica": "prom02"},
        }
        keys = [("dcgm", "10.0.0.11:9400"), ("node", "10.0.0.11:9100"),
                ("prometheus", "10.0.0.21:9090"), ("prometheus", "10.0.0.22:9090")]  # fmt: skip
        # per replica: (job, instance) -> (health, lastScrape, lastError)
        self.targets = {base: {k: ("up", NOW - 5, "") for k in keys} for base in (P1, P2)}
        self.rule_files = list(LOADS)
        self.rule_files_of: dict[str, list[str]] = {}  # a replica loading other files
        self.rules: dict[str, list[dict[str, Any]]] = {
            base: [{"name": "R", "query": "up == 0", "health": "ok", "type": "alerting"}]
            for base in (P1, P2)
        }
        self.gpus = {P1: gpu_series("gpu01", 8), P2: gpu_series("gpu01", 8)}
        self.global_gpus: dict[str, list[float]] = {}  # global replica -> its count's samples
        self.shard_gpus: dict[str, dict[str, float]] = {}  # global replica -> shard -> GPUs
        self.sampled: dict[str, float] = {}  # UUID -> time of its last sample (default: just now)
        self.started = {P1: STARTED, P2: STARTED} | {
            f"http://{a}:9093": STARTED for a in AMS.values()
        }
        # runtimeinfo's startTime, where a test sets one apart from the process gauge
        self.birth: dict[str, float | None] = {}
        self.reload_ok = dict.fromkeys(self.started, 1.0)
        self.am_hash = {a: md5_metric_value(md5_of(AM_CONFIG)) for a in AMS.values()}
        self.am_status = dict.fromkeys(AMS.values(), "ready")
        self.am_peers = {a: [f"{p}:9094" for p in AMS.values()] for a in AMS.values()}
        self.asked: list[str] = []

    def __call__(self, url: str) -> Response:
        self.asked.append(url)
        parts = urllib.parse.urlsplit(url)
        base = f"{parts.scheme}://{parts.netloc}"
        if base in self.down:
            return Response(0, error=f"no answer from {url}: [Errno 111] Connection refused")
        if parts.path == "/-/ready":
            if base in self.not_ready:
                return Response(503, "Service Unavailable")
            return Response(200, "Prometheus Server is Ready.\n")
        if parts.path == "/metrics":
            return Response(200, self.metrics(base, parts.port == 9093))
        if parts.path == "/api/v1/status/config":
            config = {"global": {"external_labels": self.labels[base]}}
            return ok({"status": "success", "data": {"yaml": yaml.safe_dump(config)}})
        if parts.path == "/api/v1/rules":
            groups = [
                {
                    "file": f"{RULES}/{f}",
                    "name": f"g-{f}",
                    "interval": 15,
                    "rules": self.rules[base],
                }
                for f in self.rule_files_of.get(base, self.rule_files)
            ]
            return ok({"status": "success", "data": {"groups": groups}})
        if parts.path == "/api/v1/targets":
            active = [
                {
                    "labels": {"job": j, "instance": i},
                    "health": h,
                    "lastScrape": rfc3339(last) if last else "0001-01-01T00:00:00Z",
                    "lastError": err,
                    "scrapeInterval": "15s",
                }
                for (j, i), (h, last, err) in self.targets[base].items()
            ]
            return ok({"status": "success", "data": {"activeTargets": active}})
        if parts.path == "/api/v1/status/runtimeinfo":
            birth = self.birth.get(base, self.started[base])
            if birth is None:
                return Response(404, "404 page not found\n")
            return ok({"status": "success", "data": {"startTime": rfc3339(birth), "CWD": "/"}})
        if parts.path == "/api/v1/query":
            query = urllib.parse.parse_qs(parts.query)["query"][0]
            if query == checks_global.QUERY:
                result = [{"metric": {}, "value": [NOW, f"{v:g}"]} for v in self.global_gpus[base]]
                return ok({"status": "success", "data": {"resultType": "vector", "result": result}})
            if query == checks_global.SHARD_RECORD:
                result = [
                    {"metric": {"__name__": query, "shard": k}, "value": [NOW, f"{v:g}"]}
                    for k, v in self.shard_gpus.get(base, {}).items()
                ]
                return ok({"status": "success", "data": {"resultType": "vector", "result": result}})
            m = re.fullmatch(
                r'group by \(node, UUID\) \(timestamp\(DCGM_FI_DEV_GPU_TEMP\{job="dcgm"\}\) >= ([0-9.]+)\)',
                query,
            )
            assert m, query
            since = float(m.group(1))
            result = [
                {"metric": labels, "value": [NOW, "1"]}
                for labels in self.gpus[base]
                if self.sampled.get(labels.get("UUID", ""), NOW - 5) >= since
            ]
            return ok({"status": "success", "data": {"resultType": "vector", "result": result}})
        if parts.path == "/api/v2/status":
            addr = parts.hostname
            peers = [{"name": p, "address": p} for p in self.am_peers[addr]]
            return ok(
                {
                    "cluster": {"status": self.am_status[addr], "peers": peers},
                    "uptime": rfc3339(self.started[base]),
                }
            )
        return Response(404, "not found")

    def metrics(self, base: str, alertmanager: bool) -> str:
        prefix = "alertmanager" if alertmanager else "prometheus"
        lines = [
            "# HELP process_start_time_seconds Start time of the process since unix epoch.",
            "# TYPE process_start_time_seconds gauge",
            f"process_start_time_seconds {self.started[base]!r}",
            f"{prefix}_config_last_reload_successful {self.reload_ok[base]!r}",
            f"{prefix}_config_last_reload_success_timestamp_seconds {LOADED!r}",
            'go_info{version="go1.19.8"} 1',
        ]
        if alertmanager:
            lines.append(
                f"alertmanager_config_hash {self.am_hash[urllib.parse.urlsplit(base).hostname]!r}"
            )
        return "\n".join(lines) + "\n"


class CannedHosts:
    """The hosts' answers to status' read-only commands, by inventory name."""

    def __init__(self) -> None:
        self.unreachable: set[str] = set()
        self.files = {
            h: [(WRITTEN, "/etc/prometheus/prometheus.yml")]
            + [(WRITTEN, f"{RULES}/{f}") for f in ("gpu-alerts.yml", "gpu-recording.yml", "meta-alerts.yml")]
            for h in ("prom01", "prom02")
        }  # fmt: skip
        self.am_config = dict.fromkeys(AMS, AM_CONFIG)
        self.templates: dict[str, list[tuple[float, str]]] = {h: [] for h in AMS}
        self.smi = dict.fromkeys(["gpu01"], SMI_OK)
        self.conns: dict[str, ScriptedConnection] = {}

    def __call__(self, host: str) -> ScriptedConnection:
        if host in self.unreachable:
            raise HostUnreachable(f"{host}: ssh: connect to host: Connection timed out")
        conn = ScriptedConnection(name=host)
        if host in self.smi:
            conn.on("@@nvswitch", stdout=facts_output(self.smi[host]))
        if host in self.am_config:
            md5 = md5_of(self.am_config[host])
            files = "".join(f"{m}\t{p}\n" for m, p in self.templates[host])
            conn.on(
                "md5sum",
                stdout=f"@@md5\n{md5}  /etc/alertmanager/alertmanager.yml\n@@files\n{files}",
            )
        if host in self.files:
            conn.on("find ", stdout="".join(f"{m}\t{p}\n" for m, p in self.files[host]))
        self.conns[host] = conn
        return conn


SMI_OK = """@@smi
0, GPU-a, NVIDIA H100 80GB HBM3, 81559, 00000000:18:00.0, Disabled, 580.65.06
1, GPU-b, NVIDIA H100 80GB HBM3, 81559, 00000000:2A:00.0, Disabled, 580.65.06
@@smi_rc
rc=0
"""


def facts_output(smi: str, loaded: str = "580.65.06", installed: str = "580.65.06") -> str:
    return (
        "@@os\nid=debian\nversion_id=12\n@@pci\n"
        + smi
        + f"@@proc\nNVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {loaded}  Release Build\n"
        + f"@@pkgs\nnvidia-open\t{installed}-1\tii\n@@nvswitch\n0\n"
    )


def ok(data: Any) -> Response:
    return Response(200, json.dumps(data))


def failed(checks: list[Check]) -> list[tuple[str, str, str]]:
    return [(c.component, c.host, c.check) for c in checks if c.state == FAILED]


def pending(checks: list[Check]) -> list[tuple[str, str, str]]:
    return [(c.component, c.host, c.check) for c in checks if c.state == PENDING]


def row(checks: list[Check], host: str, check: str, component: str | None = None) -> Check:
    return next(
        c
        for c in checks
        if c.host == host and c.check == check and component in (None, c.component)
    )


def detail(checks: list[Check], host: str, check: str, component: str | None = None) -> str:
    return row(checks, host, check, component).detail


@pytest.fixture
def stack() -> CannedStack:
    return CannedStack()


@pytest.fixture
def hosts() -> CannedHosts:
    return CannedHosts()


def run(stack: CannedStack, hosts: CannedHosts | None = None, **kw: Any) -> list[Check]:
    return status.collect(expectation(**kw), stack, hosts, now=lambda: NOW)


# ---------------------------------------------------------------- green, and what fails


def test_a_healthy_stack_is_all_green(stack, hosts):
    checks = run(stack, hosts)
    assert failed(checks) == [] and pending(checks) == []
    names = {(c.host, c.check) for c in checks}
    for host in ("prom01", "prom02"):
        for check in ("ready", "external labels", "rules loaded", "loaded config = on disk",
                      "scraping job dcgm"):  # fmt: skip
            assert (host, check) in names
    assert ("*", "replicas evaluate the same rules") in names
    assert ("mon01", "cluster ready with every peer") in names
    assert ("mon01", "loaded config = on disk") in names
    assert ("*", "peers run the same config") in names
    assert ("gpu01", "8 GPUs in the exporter's metrics") in names
    assert ("gpu01", "NVML: loaded driver = installed") in names


def test_a_stopped_replica_fails_naming_it_and_the_other_still_checks(stack, hosts):
    stack.down.add(P2)
    checks = run(stack, hosts)
    assert ("prometheus", "prom02", "ready") in failed(checks)
    assert "Connection refused" in detail(checks, "prom02", "ready")
    prom02 = [c.check for c in checks if c.component == "prometheus" and c.host == "prom02"]
    assert prom02 == ["ready"]
    assert not [f for f in failed(checks) if f[1] == "prom01"]


def test_identical_external_labels_fail_the_distinct_check(stack):
    stack.labels[P2] = {"cluster": "c1", "replica": "prom01"}
    checks = run(stack)
    assert ("prometheus", "*", "external labels distinct") in failed(checks)
    assert "prom01 and prom02" in detail(checks, "*", "external labels distinct")
    assert "replica='prom01'" in detail(checks, "prom02", "external labels")


def test_a_down_target_fails_its_job_naming_node_instance_and_the_scrape_error(stack):
    stack.targets[P1][("dcgm", "10.0.0.11:9400")] = ("down", NOW - 5, "connection refused")
    checks = run(stack)
    assert ("prometheus", "prom01", "scraping job dcgm") in failed(checks)
    assert detail(checks, "prom01", "scraping job dcgm") == (
        "gpu01 (10.0.0.11:9400) down: connection refused"
    )
    assert detail(checks, "prom01", "scraping job node") == "1/1 up"


def test_a_target_missing_from_a_long_running_replica_fails(stack):
    del stack.targets[P2][("node", "10.0.0.11:9100")]
    checks = run(stack)
    assert ("prometheus", "prom02", "scraping job node") in failed(checks)
    assert detail(checks, "prom02", "scraping job node") == (
        "gpu01 (10.0.0.11:9100) not among the replica's targets (file_sd)"
    )


def test_a_missing_rule_file_fails_rules_loaded(stack):
    stack.rule_files = ["gpu-alerts.yml"]
    checks = run(stack)
    assert ("prometheus", "prom01", "rules loaded") in failed(checks)
    assert "gpu-recording.yml, meta-alerts.yml" in detail(checks, "prom01", "rules loaded")


def test_a_rule_failing_to_evaluate_is_named_with_its_error(stack):
    stack.rules[P1] = [{"name": "R", "query": "x", "health": "err", "lastError": "many-to-many"}]
    checks = run(stack)
    assert ("prometheus", "prom01", "rules loaded") in failed(checks)
    assert "R (many-to-many)" in detail(checks, "prom01", "rules loaded")


def test_rules_not_yet_evaluated_after_a_start_are_fine(stack):
    stack.rules[P2] = [{"name": "R", "query": "up == 0", "health": "unknown", "type": "alerting"}]
    assert row(run(stack), "prom02", "rules loaded").ok


def test_missing_gpus_fail_naming_the_replica_and_count(stack):
    stack.gpus[P1] = gpu_series("gpu01", 7)
    checks = run(stack)
    assert failed(checks) == [("gpus", "gpu01", "8 GPUs in the exporter's metrics")]
    assert detail(checks, "gpu01", "8 GPUs in the exporter's metrics") == "prom01 sees 7"


def test_gpus_not_sampled_since_the_replica_started_are_not_counted(stack):
    # A GPU gone while prom02 was stopped: its series, replayed from the WAL, carry no stale
    # marker, but their last sample is older than prom02's start.
    stack.started[P2] = NOW - 60
    stack.sampled["GPU-gpu01-0"] = NOW - 90
    stack.gpus[P1] = gpu_series("gpu01", 8)[1:]
    checks = run(stack)
    assert detail(checks, "gpu01", "8 GPUs in the exporter's metrics") == (
        "prom01 sees 7; prom02 sees 7"
    )


@pytest.mark.parametrize(
    "birth",
    [
        pytest.param(NOW - 60, id="runtimeinfo-start-time"),
        pytest.param(None, id="no-runtimeinfo-the-gauge-and-one-second"),
    ],
)
def test_the_replicas_start_is_not_the_process_gauge_which_btime_cuts_to_seconds(stack, birth):
    # prom02 took its last sample of the lost GPU 0.4 s before its stop; the new process
    # started 0.3 s after. process_start_time_seconds says 0.9 s earlier than that (btime is
    # whole seconds), which the old sample passes; runtimeinfo's startTime it does not, nor,
    # where runtimeinfo answers 404 (birth None), the gauge plus the second it can be early.
    stack.birth[P2] = birth
    stack.started[P2] = NOW - 60.9
    stack.sampled["GPU-gpu01-0"] = NOW - 60.7
    stack.gpus[P1] = gpu_series("gpu01", 8)[1:]
    checks = run(stack)
    assert detail(checks, "gpu01", "8 GPUs in the exporter's metrics") == (
        "prom01 sees 7; prom02 sees 7"
    )


def test_gpu_series_without_a_uuid_label_fail_and_are_not_counted(stack):
    stack.gpus[P2] = [{"node": "gpu01"}]
    checks = run(stack)
    assert "prom02: 1 series without a UUID label" in detail(
        checks, "gpu01", "8 GPUs in the exporter's metrics"
    )


def test_an_alertmanager_missing_a_peer_names_the_peer(stack):
    stack.am_peers["10.0.0.21"] = ["10.0.0.21:9094", "10.0.0.22:9094"]
    checks = run(stack)
    assert ("alertmanager", "prom01", "cluster ready with every peer") in failed(checks)
    assert "peers missing: 10.0.0.23:9094" in detail(
        checks, "prom01", "cluster ready with every peer"
    )


def test_an_unreachable_alertmanager_fails(stack):
    stack.down.add("http://10.0.0.22:9093")
    checks = run(stack)
    assert ("alertmanager", "prom02", "cluster ready with every peer") in failed(checks)


# ---------------------------------------------------------------- pending: not yet known


def test_a_replica_that_just_started_is_pending_until_it_has_scraped(stack):
    stack.started[P2] = NOW - 10
    for key in stack.targets[P2]:
        stack.targets[P2][key] = ("unknown", None, "")
    checks = run(stack)
    assert failed(checks) == []
    assert ("prometheus", "prom02", "scraping job dcgm") in pending(checks)
    assert detail(checks, "prom02", "scraping job node") == (
        "gpu01 (10.0.0.11:9100) not scraped yet since the replica started 2027-01-15 07:59:50Z"
    )
    assert overall(checks) == PENDING


def test_targets_not_yet_discovered_by_a_young_replica_are_pending(stack):
    stack.started[P2] = NOW - 3
    stack.targets[P2] = {}
    checks = run(stack)
    assert failed(checks) == []
    assert "not discovered yet" in detail(checks, "prom02", "scraping job dcgm")


def test_a_restarted_daemon_seen_down_before_its_start_is_pending(stack):
    stack.started[P2] = NOW - 8  # prom02 started again after prom01's last (failed) scrape of it
    stack.targets[P1][("prometheus", "10.0.0.22:9090")] = ("down", NOW - 12, "connection refused")
    checks = run(stack)
    assert ("prometheus", "prom01", "scraping job prometheus") in pending(checks)
    assert "prom02 (10.0.0.22:9090) restarted" in detail(
        checks, "prom01", "scraping job prometheus"
    )


def test_a_daemon_seen_down_while_it_was_still_starting_is_pending(stack):
    stack.started[P2] = NOW - 20
    stack.targets[P1][("prometheus", "10.0.0.22:9090")] = ("down", NOW - 19, "connection refused")
    checks = run(stack)
    assert ("prometheus", "prom01", "scraping job prometheus") in pending(checks)


def test_a_daemon_still_down_well_after_its_start_fails(stack):
    stack.started[P2] = NOW - 120
    stack.targets[P1][("prometheus", "10.0.0.22:9090")] = ("down", NOW - 3, "connection refused")
    checks = run(stack)
    assert ("prometheus", "prom01", "scraping job prometheus") in failed(checks)


def test_gpus_are_pending_on_a_replica_that_has_not_scraped_the_exporter_yet(stack):
    stack.started[P2] = NOW - 10
    stack.targets[P2][("dcgm", "10.0.0.11:9400")] = ("unknown", None, "")
    stack.gpus[P2] = []
    checks = run(stack)
    gpu_row = row(checks, "gpu01", "8 GPUs in the exporter's metrics")
    assert gpu_row.state == PENDING
    assert gpu_row.detail == "prom02 has not scraped the exporter yet"


def test_a_replica_answering_503_is_starting_not_failed(stack):
    stack.not_ready.add(P2)
    checks = run(stack)
    assert row(checks, "prom02", "ready").state == PENDING
    assert "starting" in detail(checks, "prom02", "ready")


def test_a_settling_alertmanager_is_pending(stack):
    stack.am_status["10.0.0.23"] = "settling"
    checks = run(stack)
    assert pending(checks) == [("alertmanager", "mon01", "cluster ready with every peer")]
    assert "settling" in detail(checks, "mon01", "cluster ready with every peer")


def test_a_just_started_alertmanager_missing_peers_is_pending(stack):
    stack.started["http://10.0.0.23:9093"] = NOW - 5
    stack.am_peers["10.0.0.23"] = ["10.0.0.23:9094"]
    checks = run(stack)
    assert row(checks, "mon01", "cluster ready with every peer").state == PENDING


def test_wait_checks_again_until_green(stack):
    stack.not_ready.add(P2)
    rounds, slept = [], []

    def fetch(url: str) -> Response:
        if url.endswith("/-/ready") and url.startswith(P2):
            rounds.append(url)
            if len(rounds) == 3:
                stack.not_ready.clear()
        return stack(url)

    clock = iter(range(0, 1000, 5))
    checks = status.collect_until(
        expectation(), fetch, wait_s=60, now=lambda: NOW, sleep=slept.append,
        monotonic=lambda: next(clock),
    )  # fmt: skip
    assert overall(checks) == OK
    assert len(rounds) == 3 and slept == [5.0, 5.0]


def test_wait_gives_up_at_the_deadline_with_the_last_round(stack):
    stack.down.add(P2)
    clock = iter([0, 30, 61])
    slept: list[float] = []
    checks = status.collect_until(
        expectation(), stack, wait_s=60, now=lambda: NOW, sleep=slept.append,
        monotonic=lambda: next(clock),
    )  # fmt: skip
    assert ("prometheus", "prom02", "ready") in failed(checks)
    assert slept == [5.0]


def test_without_wait_there_is_one_round(stack):
    stack.down.add(P2)
    status.collect_until(expectation(), stack, now=lambda: NOW, sleep=pytest.fail)
    assert sum(1 for u in stack.asked if u == f"{P1}/-/ready") == 1


# ---------------------------------------------------------------- loaded = on disk


def test_a_rule_file_changed_after_the_last_reload_is_a_reload_owed(stack, hosts):
    hosts.files["prom01"][1] = (LOADED + 60, f"{RULES}/gpu-alerts.yml")
    checks = run(stack, hosts)
    assert failed(checks) == [("prometheus", "prom01", "loaded config = on disk")]
    assert detail(checks, "prom01", "loaded config = on disk") == (
        f"reload owed: {RULES}/gpu-alerts.yml changed on disk after the config it runs was "
        "loaded (2027-01-15 07:30:00Z)"
    )


def test_a_failed_last_reload_fails_naming_the_replica(stack, hosts):
    stack.reload_ok[P2] = 0.0
    checks = run(stack, hosts)
    assert ("prometheus", "prom02", "loaded config = on disk") in failed(checks)
    assert "the last reload failed" in detail(checks, "prom02", "loaded config = on disk")


def test_a_rule_file_loaded_but_gone_from_disk_is_a_reload_owed(stack, hosts):
    del hosts.files["prom01"][3]  # meta-alerts.yml removed, still loaded
    checks = run(stack, hosts)
    assert f"evaluates {RULES}/meta-alerts.yml, no longer on disk" in detail(
        checks, "prom01", "loaded config = on disk"
    )


def test_a_host_unreachable_over_ssh_fails_its_on_disk_and_driver_checks(stack, hosts):
    hosts.unreachable |= {"prom02", "gpu01"}
    checks = run(stack, hosts)
    assert ("prometheus", "prom02", "loaded config = on disk") in failed(checks)
    assert ("alertmanager", "prom02", "loaded config = on disk") in failed(checks)
    assert ("driver", "gpu01", "NVML: loaded driver = installed") in failed(checks)
    assert "Connection timed out" in detail(checks, "gpu01", "NVML: loaded driver = installed")


def test_an_alertmanager_config_changed_on_disk_is_a_reload_owed(stack, hosts):
    hosts.am_config["mon01"] = AM_CONFIG + b"# edited\n"
    checks = run(stack, hosts)
    assert failed(checks) == [("alertmanager", "mon01", "loaded config = on disk")]
    assert "alertmanager.yml on disk differs from the config it runs" in detail(
        checks, "mon01", "loaded config = on disk"
    )


def test_an_alertmanager_template_newer_than_its_reload_is_a_reload_owed(stack, hosts):
    template = "/etc/alertmanager/templates/slack.tmpl"
    hosts.templates["prom01"] = [(LOADED + 5, template)]
    peers = [
        Peer(h, f"http://{a}:9093", f"{a}:9094", templates=(template,)) for h, a in AMS.items()
    ]
    checks = run(stack, hosts, alertmanagers=peers)
    assert f"templates {template} changed" in detail(
        checks, "prom01", "loaded config = on disk", "alertmanager"
    )
    assert row(checks, "prom02", "loaded config = on disk", "alertmanager").ok


def test_alertmanager_config_hash_is_the_md5_of_the_file_as_alertmanager_computes_it():
    # Observed: Alertmanager 0.25.0 (the lab's) serving exactly AM_CONFIG exported
    # alertmanager_config_hash 1.7996757767074e+13.
    assert md5_metric_value(md5_of(AM_CONFIG)) == 1.7996757767074e13


def test_replicas_evaluating_different_rules_fail_naming_group_and_rule(stack):
    stack.rules[P2] = [{"name": "R", "query": "up == 1", "health": "ok", "type": "alerting"}]
    checks = run(stack)
    assert ("prometheus", "*", "replicas evaluate the same rules") in failed(checks)
    assert detail(checks, "*", "replicas evaluate the same rules").startswith(
        "prom01 and prom02 evaluate different rules: differ: gpu-alerts.yml:g-gpu-alerts.yml (R)"
    )


def test_alertmanagers_running_different_configs_fail(stack):
    stack.am_hash["10.0.0.23"] = 1.0
    checks = run(stack)
    assert ("alertmanager", "*", "peers run the same config") in failed(checks)
    assert detail(checks, "*", "peers run the same config") == (
        "different configs loaded: prom01+prom02 vs mon01"
    )


class DeadSession:
    """A pooled connection whose session died: every command fails until it is closed."""

    def __init__(self, name: str) -> None:
        self.name, self.closed = name, False

    def run(self, command: str, **kw: Any) -> Any:
        raise HostUnreachable(f"{self.name}: connection lost")

    def close(self) -> None:
        self.closed = True


def test_a_dead_ssh_session_is_closed_so_the_next_round_reconnects(stack, hosts):
    from deployer.connection import ConnectionPool

    opened: list[str] = []

    def opener(host: str) -> Any:
        opened.append(host)
        return DeadSession(host) if opened.count(host) == 1 and host == "prom02" else hosts(host)

    pool = ConnectionPool(opener)
    clock = iter(range(0, 1000, 5))
    checks = status.collect_until(
        expectation(), stack, pool.get, wait_s=60, now=lambda: NOW, sleep=lambda s: None,
        monotonic=lambda: next(clock),
    )  # fmt: skip
    assert overall(checks) == OK
    assert opened.count("prom02") == 2 and opened.count("prom01") == 1


def test_api_only_reads_no_host_and_says_so(stack):
    checks = run(stack, None)
    assert not [c for c in checks if c.check in ("loaded config = on disk",)]
    assert not [c for c in checks if c.component == "driver"]
    assert "skipped (--api-only)" in detail(checks, "-", "over SSH")


def test_the_host_commands_are_read_only(stack, hosts):
    run(stack, hosts)
    commands = [c for conn in hosts.conns.values() for c in conn.commands]
    assert FACTS_SCRIPT in commands
    others = [c for c in commands if c != FACTS_SCRIPT]
    assert others and all(c.startswith(("find ", "echo @@md5; md5sum")) for c in others)


# ---------------------------------------------------------------- the driver seen on GPU hosts


def test_an_nvml_version_mismatch_fails_naming_the_host(stack, hosts):
    hosts.smi["gpu01"] = (
        "@@smi\nFailed to initialize NVML: Driver/library version mismatch\n"
        "NVML library version: 595.45.04\n@@smi_rc\nrc=18\n"
    )
    checks = run(stack, hosts)
    assert failed(checks) == [("driver", "gpu01", "NVML: loaded driver = installed")]
    assert detail(checks, "gpu01", "NVML: loaded driver = installed").startswith(
        "NVML version mismatch: nvidia-smi: Failed to initialize NVML: Driver/library version "
        "mismatch (installed 580.65.06, kernel module loaded 580.65.06)"
    )


# ---------------------------------------------------------------- Thanos


def test_thanos_not_deployed_is_reported_but_not_a_failure(stack):
    checks = run(stack)
    r = next(c for c in checks if c.component == "thanos")
    assert r.ok and "not deployed" in r.detail


def test_thanos_components_must_be_ready_when_deployed(stack):
    exp = expectation(
        thanos_active=True,
        thanos_sidecars=[Endpoint("prom01", "http://10.0.0.21:10902")],
        thanos_queries=[Endpoint("mon01", "http://10.0.0.23:19192")],
    )
    stack.down.add("http://10.0.0.23:19192")
    checks = status.collect(exp, stack, now=lambda: NOW)
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
    checks = status.collect(thanos_expectation(), fetch, now=lambda: NOW)
    assert failed(checks) == []
    assert detail(checks, "mon01", "every sidecar a store") == "2/2 sidecars"


def test_query_missing_or_failing_a_sidecar_store_fails_naming_it(stack):
    fetch = stores_answer(
        stack,
        [{"name": "10.0.0.21:10901", "lastError": "connection refused"}],
    )
    checks = status.collect(thanos_expectation(), fetch, now=lambda: NOW)
    assert failed(checks) == [("thanos query", "mon01", "every sidecar a store")]
    assert detail(checks, "mon01", "every sidecar a store") == (
        "not healthy stores: 10.0.0.21:10901, 10.0.0.22:10901"
    )


# ---------------------------------------------------------------- where it asks, what it prints


def test_only_the_expected_addresses_are_asked(stack, hosts):
    run(stack, hosts)
    asked = {urllib.parse.urlsplit(u).hostname for u in stack.asked}
    assert asked == {"10.0.0.21", "10.0.0.22", "10.0.0.23"}
    assert set(hosts.conns) == {"prom01", "prom02", "mon01", "gpu01"}


def test_json_names_failures_and_pending_with_their_state(stack):
    stack.down.add(P2)
    stack.am_status["10.0.0.23"] = "settling"
    checks = run(stack)
    data = to_json(checks)
    assert data["ok"] is False and data["state"] == FAILED
    assert data["failed"] == [
        {
            "component": "prometheus",
            "host": "prom02",
            "check": "ready",
            "state": "failed",
            "ok": False,
            "detail": detail(checks, "prom02", "ready"),
        }
    ]
    assert [(p["host"], p["state"]) for p in data["pending"]] == [("mon01", "pending")]
    text = table(checks)
    assert text.splitlines()[0].split()[:4] == ["COMPONENT", "HOST", "CHECK", "RESULT"]
    assert any("prom02" in ln and "FAILED" in ln for ln in text.splitlines())
    assert any("mon01" in ln and "PENDING" in ln for ln in text.splitlines())


# ---------------------------------------------------------------- expectation from an inventory

INVENTORY = """\
all:
  hosts:
    gpu01: {ansible_host: 192.0.2.11, gpu_model: H100, gpu_count: 8}
    gpu02: {ansible_host: 192.0.2.12, gpu_model: A100, gpu_count: 4}
    prom01: {ansible_host: 192.0.2.21}
    prom02: {ansible_host: 192.0.2.22, ansible_user: ops}
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
    exp = status.load_expectation(
        inv, ["prometheus_port=9091", "prometheus_rule_files_dir=/srv/rules"]
    )
    assert [(r.host, r.url, r.replica) for r in exp.replicas] == [
        ("prom01", "http://192.0.2.21:9091", "prom01"),
        ("prom02", "http://192.0.2.22:9091", "prom02"),
    ]
    assert exp.replicas[0].config_file == "/etc/prometheus/prometheus.yml"
    assert exp.replicas[0].rule_files == "/srv/rules/*.yml"
    assert [p.cluster_address for p in exp.alertmanagers] == [
        "192.0.2.21:9094",
        "192.0.2.22:9094",
        "192.0.2.23:9094",
    ]
    assert exp.alertmanagers[0].config_file == "/etc/alertmanager/alertmanager.yml"
    assert exp.gpus == {"gpu01": 8, "gpu02": 4}
    assert exp.gpu_hosts == ["gpu01", "gpu02"]
    assert Target("dcgm", "192.0.2.12:9400", "gpu02") in exp.targets
    assert not exp.thanos_active


def test_expectation_knows_how_to_reach_every_host_it_reads(tmp_path: Path):
    inv = tmp_path / "inventory.yml"
    inv.write_text(INVENTORY)
    exp = status.load_expectation(inv)
    assert set(exp.ssh) == {"gpu01", "gpu02", "prom01", "prom02", "mon01"}
    assert (exp.ssh["prom02"].address, exp.ssh["prom02"].user) == ("192.0.2.22", "ops")


def test_alertmanager_templates_relative_to_the_config_directory(tmp_path: Path):
    inv = tmp_path / "inventory.yml"
    inv.write_text(INVENTORY)
    exp = status.load_expectation(
        inv, [json.dumps({"alertmanager_templates": ["t/*.tmpl", "/srv/x.tmpl"]})]
    )
    assert exp.alertmanagers[0].templates == ("/etc/alertmanager/t/*.tmpl", "/srv/x.tmpl")


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


# ---------------------------------------------------------------- the command


@pytest.mark.parametrize(
    ("states", "exit_code"),
    [([OK, OK], 0), ([OK, PENDING], 3), ([PENDING, FAILED], 1)],
    ids=["green", "only-pending", "failed"],
)
def test_the_status_command_exit_code_says_green_pending_or_failed(
    monkeypatch, tmp_path: Path, states: list[str], exit_code: int
):
    from click.testing import CliRunner

    from deployer.cli import cli

    rows = [Check("prometheus", f"prom0{i}", "ready", s, "d") for i, s in enumerate(states)]
    asked: dict[str, Any] = {}

    def collect_until(exp: Any, fetch: Any, hosts: Any, *, wait_s: float, replan) -> list[Check]:
        asked.update(hosts=hosts, wait_s=wait_s, replanned=replan())
        return rows

    monkeypatch.setattr(status, "load_expectation", lambda inv, extra: expectation())
    monkeypatch.setattr(status, "collect_until", collect_until)
    result = CliRunner().invoke(
        cli, ["status", "-i", str(tmp_path), "--api-only", "--wait", "7", "--output", "json"]
    )
    assert result.exit_code == exit_code, result.output
    # each round of a re-shard under way is planned anew, from the same inventory
    assert asked == {"hosts": None, "wait_s": 7, "replanned": expectation()}
    assert json.loads(result.stdout)["state"] == max(states, key=[OK, PENDING, FAILED].index)


# ---------------------------------------------------------------- the federation tier's global pair

G1, G2 = "http://10.0.0.31:9090", "http://10.0.0.32:9090"
GLOBAL_LOADS = ("global-federation.yml",)


def global_stack(stack: CannedStack, hosts: CannedHosts) -> dict[str, Any]:
    """The canned stack with a global pair, mon01 and mon02: each scrapes /federate of both
    replicas and loads the global rules; the expectation's fields for ``run``."""
    for base, name in ((G1, "mon01"), (G2, "mon02")):
        stack.labels[base] = {"cluster": "global", "replica": name}
        stack.targets[base] = {
            ("federate", "10.0.0.21:9090"): ("up", NOW - 5, ""),
            ("federate", "10.0.0.22:9090"): ("up", NOW - 5, ""),
        }
        stack.rule_files_of[base] = list(GLOBAL_LOADS)
        stack.rules[base] = [{"name": "G", "query": "sum(x)", "health": "ok", "type": "recording"}]
        stack.started[base] = STARTED
        stack.reload_ok[base] = 1.0
        stack.global_gpus[base] = [8.0]  # gpu01's 8 GPUs, each once
        hosts.files[name] = [(WRITTEN, "/etc/prometheus/prometheus.yml")] + [
            (WRITTEN, f"{RULES}/{f}") for f in GLOBAL_LOADS
        ]
    return {
        "global_replicas": [
            Replica(h, b, h, "global", "replica", "cluster", loads=GLOBAL_LOADS)
            for h, b in (("mon01", G1), ("mon02", G2))
        ],
        "global_targets": [
            Target("federate", "10.0.0.21:9090", "prom01"),
            Target("federate", "10.0.0.22:9090", "prom02"),
        ],
    }


def global_rows(checks: list[Check]) -> dict[tuple[str, str], Check]:
    return {(c.host, c.check): c for c in checks if c.component == status.GLOBAL}


def test_the_global_pair_is_checked_as_a_pair_of_its_own(stack, hosts):
    checks = run(stack, hosts, **global_stack(stack, hosts))
    assert failed(checks) == [] and pending(checks) == []
    rows = global_rows(checks)
    for host in ("mon01", "mon02"):
        for check in ("ready", "external labels", "rules loaded", "loaded config = on disk",
                      "scraping job federate"):  # fmt: skip
            assert rows[(host, check)].ok, rows[(host, check)]
    assert rows[("mon01", "scraping job federate")].detail == "2/2 up"
    assert "global-federation" not in detail(checks, "prom01", "rules loaded", "prometheus")
    # its rules are compared with each other's, not with the shards' (which differ)
    assert rows[("*", "replicas evaluate the same rules")].detail.startswith("2 replicas")
    assert rows[("*", "external labels distinct")].detail == "2 replicas"
    assert row(checks, "*", "replicas evaluate the same rules", "prometheus").ok
    assert rows[("mon01", "every GPU once")].detail == "8/8 GPUs (global_cluster:gpus:count)"
    # a global replica samples no GPU: it is not asked for them
    assert not [u for u in stack.asked if u.startswith((G1, G2)) and "DCGM_FI" in u]


def test_a_stopped_global_replica_fails_naming_it(stack, hosts):
    fields = global_stack(stack, hosts)
    stack.down.add(G2)
    checks = run(stack, hosts, **fields)
    assert (status.GLOBAL, "mon02", "ready") in failed(checks)
    assert "Connection refused" in detail(checks, "mon02", "ready", status.GLOBAL)
    assert not [c for c in failed(checks) if c[0] == "prometheus"]


def test_a_shard_replica_the_global_pair_cannot_federate_fails_there_naming_it(stack, hosts):
    fields = global_stack(stack, hosts)
    refused = 'Get "http://10.0.0.22:9090/federate": connect: connection refused'
    stack.targets[G1][("federate", "10.0.0.22:9090")] = ("down", NOW - 5, refused)
    checks = run(stack, hosts, **fields)
    assert failed(checks) == [(status.GLOBAL, "mon01", "scraping job federate")]
    got = detail(checks, "mon01", "scraping job federate", status.GLOBAL)
    assert got == f"prom02 (10.0.0.22:9090) down: {refused} (1/2 up)"


def test_a_shard_replica_that_just_restarted_is_pending_for_the_global_pair(stack, hosts):
    fields = global_stack(stack, hosts)
    stack.started[P2] = NOW - 10  # restarted after mon01's last (failed) federate scrape
    stack.targets[G1][("federate", "10.0.0.22:9090")] = ("down", NOW - 12, "connection refused")
    checks = run(stack, hosts, **fields)
    assert (status.GLOBAL, "mon01", "scraping job federate") in pending(checks)
    assert not [c for c in failed(checks) if c[0] == status.GLOBAL]


def test_a_global_replica_missing_its_rules_or_running_the_shards_fails(stack, hosts):
    fields = global_stack(stack, hosts)
    stack.rule_files_of[G2] = list(LOADS)  # left loading the shard rules
    checks = run(stack, hosts, **fields)
    rows = global_rows(checks)
    assert "rule files not loaded: global-federation.yml" in rows[("mon02", "rules loaded")].detail
    assert not rows[("*", "replicas evaluate the same rules")].ok


def test_global_replicas_sharing_external_labels_fail_the_distinct_check(stack, hosts):
    fields = global_stack(stack, hosts)
    stack.labels[G2] = dict(stack.labels[G1])
    checks = run(stack, hosts, **fields)
    rows = global_rows(checks)
    assert not rows[("*", "external labels distinct")].ok
    assert (
        "mon01 and mon02 have identical external labels"
        in rows[("*", "external labels distinct")].detail
    )
    # the wrong replica label is also named on the host's own row
    assert "replica='mon01' (want 'mon02')" in rows[("mon02", "external labels")].detail


def test_a_global_replica_owing_a_reload_fails_loaded_config(stack, hosts):
    fields = global_stack(stack, hosts)
    hosts.files["mon01"][1] = (LOADED + 60, f"{RULES}/global-federation.yml")
    checks = run(stack, hosts, **fields)
    assert failed(checks) == [(status.GLOBAL, "mon01", "loaded config = on disk")]


@pytest.mark.parametrize(
    ("samples", "said"),
    [
        ([4.0], "counts 4 of 8 GPUs (a shard missing from the view)"),
        ([16.0], "counts 16 of 8 GPUs (a GPU counted twice)"),
        ([], "no global_cluster:gpus:count yet"),
    ],
    ids=["a-shard-lost", "counted-twice", "no-record"],
)
def test_a_global_replica_not_counting_every_gpu_once_fails_there(stack, hosts, samples, said):
    """The global view is held to the GPUs the shard replicas' own rows hold the nodes to."""
    fields = global_stack(stack, hosts)
    stack.global_gpus[G2] = samples
    checks = run(stack, hosts, **fields)
    assert failed(checks) == [(status.GLOBAL, "mon02", "every GPU once")]
    assert said in detail(checks, "mon02", "every GPU once", status.GLOBAL)


def test_a_global_count_that_lags_a_restart_is_pending(stack, hosts):
    fields = global_stack(stack, hosts)
    stack.global_gpus[G1] = [4.0]
    stack.started[P2] = NOW - 40  # a shard replica just restarted: its records not yet federated
    checks = run(stack, hosts, **fields)
    assert (status.GLOBAL, "mon01", "every GPU once") in pending(checks)
    assert "replicas just started" in detail(checks, "mon01", "every GPU once", status.GLOBAL)
    assert not [c for c in failed(checks) if c[0] == status.GLOBAL]


def test_the_global_count_is_not_judged_while_a_node_s_gpus_are_unknown():
    row = checks_global.global_gpu_check("mon01", [], {"gpu01": 8, "gpu02": None}, [], False)
    assert row is not None and row.state == "pending"
    assert "gpu02" in row.detail
    assert checks_global.global_gpu_check("mon01", None, {"gpu01": 8}, [], False) is None


REBOOTING = "out of service in upgrade-driver run R (rebooting)"
INSTALLING = "out of service in upgrade-driver run R (installing)"


@pytest.mark.parametrize(
    ("have", "away", "state"),
    [
        ([4.0], {"gpu02": REBOOTING}, "pending"),  # gpu02's 8 GPUs gone while it reboots
        ([], {"gpu01": INSTALLING, "gpu02": REBOOTING}, "pending"),  # every host away
        ([2.0], {"gpu02": REBOOTING}, "failed"),  # 2 more missing than gpu02 holds
        ([4.0], {}, "failed"),
    ],
    ids=["one-host-away", "every-host-away", "short-by-more", "no-rollout"],
)
def test_the_global_count_short_by_what_a_rollout_has_out_of_service_is_pending(have, away, state):
    """Hosts a driven rollout has out of service (their exporters stopped, rebooting) take
    their GPUs out of the count until they are back; a shortfall beyond theirs still fails."""
    counts = {"gpu01": 4, "gpu02": 8}
    answer = [{"metric": {}, "value": [0, str(v)]} for v in have]
    row = checks_global.global_gpu_check("mon01", answer, counts, ["ok"], False, away)
    assert row is not None and row.state == state
    if state == "pending":
        assert all(f"{h} {why}" in row.detail for h, why in away.items()), row.detail


SHARDS = {"gpu01": "s1", "gpu02": "s1", "gpu03": "s2"}


@pytest.mark.parametrize(
    ("have", "by_shard", "away", "state", "said"),
    [
        # gpu02 (s1) rebooting, s1 short by its 8 GPUs: the rollout's, pending
        (12.0, {"s1": 4.0, "s2": 8.0}, {"gpu02": REBOOTING}, "pending", "gpu02 " + REBOOTING),
        # the same total, but s2 lost its 8 while gpu02 (8, in s1) is away: failed, naming s2
        (12.0, {"s1": 12.0, "s2": 4.0}, {"gpu02": REBOOTING}, "failed",
         "shard s2 4 of 8 GPUs"),
        # s2 gone from the view altogether while s1's gpu02 is away
        (4.0, {"s1": 4.0}, {"gpu02": REBOOTING, "gpu01": INSTALLING}, "failed",
         "shard s2 0 of 8 GPUs"),
        # no rollout: the shard the view lost is named
        (12.0, {"s1": 12.0, "s2": 0.0}, {}, "failed",
         "(a shard missing from the view): shard s2 0 of 8 GPUs"),
    ],
    ids=["own-shard-away", "other-shard-lost", "shard-gone", "no-rollout"],
)  # fmt: skip
def test_a_rollout_excuses_only_its_own_shard_s_missing_gpus(have, by_shard, away, state, said):
    """The global pair's view of each shard is held to that shard's nodes: hosts a rollout has
    out of service in one shard do not cover GPUs another shard lost, though the sum would."""
    counts = {"gpu01": 4, "gpu02": 8, "gpu03": 8}
    answer = [{"metric": {}, "value": [0, str(have)]}]
    row = checks_global.global_gpu_check(
        "mon01", answer, counts, ["ok"], False, away, by_shard, SHARDS
    )
    assert row is not None and (row.state, said in row.detail) == (state, True), row.detail


def test_the_global_pair_is_asked_for_each_shard_s_gpus_and_a_lost_shard_is_named(stack, hosts):
    """A sharded tier's global replicas are asked for their rules' own record of each shard's
    GPUs (global_shard:gpus:count: once per shard, over the replicas); a shard missing is named.
    A global pair whose rules predate the record answers nothing: judged on the sum alone."""
    fields = global_stack(stack, hosts)
    assert checks_global.SHARD_RECORD == "global_shard:gpus:count"
    stack.shard_gpus = {G1: {"s1": 8.0}, G2: {"s2": 8.0}}
    fields |= {"node_shards": {"gpu01": "s1"}, "global_shard_label": "shard"}
    stack.global_gpus[G2] = [0.0]
    checks = run(stack, hosts, **fields)
    assert row(checks, "mon01", "every GPU once", status.GLOBAL).state == OK
    assert (status.GLOBAL, "mon02", "every GPU once") in failed(checks)
    assert detail(checks, "mon02", "every GPU once", status.GLOBAL).endswith(
        "counts 0 of 8 GPUs (a shard missing from the view): shard s1 0 of 8 GPUs"
    )

    stack.shard_gpus = {G1: {"s1": 8.0}}  # mon02's rules without the record
    checks = run(stack, hosts, **fields)
    assert detail(checks, "mon02", "every GPU once", status.GLOBAL).endswith(
        "counts 0 of 8 GPUs (a shard missing from the view)"
    )


# ---------------------------------------------------------------- the long-term store as a target

STORE = "http://10.0.0.23:8428"


class CannedStore:
    """The store's answers to the status client (url, headers): its start time on /metrics."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.asked: list[tuple[str, dict[str, str]]] = []

    def __call__(self, url: str, headers: Any = None) -> Response:
        self.asked.append((url, dict(headers or {})))
        if url == f"{STORE}/metrics":
            return Response(200, f"process_start_time_seconds {self.started}\n")
        return Response(200, "OK")


def run_with_store(stack: CannedStack, store: CannedStore, refused_at: float) -> list[Check]:
    err = (
        'Get "http://10.0.0.23:8428/metrics": dial tcp 10.0.0.23:8428: connect: connection refused'
    )
    stack.targets[P1][("victoriametrics", "10.0.0.23:8428")] = ("down", refused_at, err)
    stack.targets[P2][("victoriametrics", "10.0.0.23:8428")] = ("up", NOW - 3, "")
    exp = expectation(
        targets=[*expectation().targets, Target("victoriametrics", "10.0.0.23:8428", "mon01")],
        store=StoreExpectation(
            stores=[Store("mon01", STORE, "15s", "1y")], headers={"Authorization": "Basic x"}
        ),
    )
    return status.collect(exp, stack, None, now=lambda: NOW, store_fetch=store)


def test_a_store_that_restarted_after_a_replica_s_failed_scrape_is_pending_there(stack):
    """The store restarted by ``up`` (a flag changed): a replica whose last scrape of it came
    while it was down has not scraped it since it came up; that is not a fault (yet)."""
    store = CannedStore(started=NOW - 6)
    checks = run_with_store(stack, store, refused_at=NOW - 8)
    assert ("prometheus", "prom01", "scraping job victoriametrics") in pending(checks)
    assert "restarted" in detail(checks, "prom01", "scraping job victoriametrics")
    # asked with the store's own credentials
    assert (f"{STORE}/metrics", {"Authorization": "Basic x"}) in store.asked


def test_a_store_refusing_scrapes_long_after_its_start_fails_there(stack):
    store = CannedStore(started=STARTED)
    checks = run_with_store(stack, store, refused_at=NOW - 8)
    assert ("prometheus", "prom01", "scraping job victoriametrics") in failed(checks)
    assert "connection refused" in detail(checks, "prom01", "scraping job victoriametrics")


# ---------------------------------------------------------------- a driver rollout under way


def test_a_host_a_driven_rollout_has_out_of_service_is_pending_until_the_controller_dies(
    stack, hosts, tmp_path, monkeypatch
):
    # gpu01 rebooting in a run a controller drives: its exporters down, its SSH refused
    import fcntl
    import json
    import os

    run_id = "20261205T100000Z-595.45.04-ab12"
    inv = (tmp_path / "inv.yml").resolve()
    monkeypatch.setenv("GPUMON_ROLLOUT_STATE_DIR", str(tmp_path / "runs"))
    run_dir = tmp_path / "runs" / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "state.json").write_text(json.dumps(
        {"status": "running", "inventory": str(inv), "hosts": {"gpu01": {"state": "rebooting"}}}
    ))  # fmt: skip
    for base in (P1, P2):
        stack.targets[base][("dcgm", "10.0.0.11:9400")] = ("down", NOW - 5, "connection refused")
    hosts.unreachable.add("gpu01")
    # a global pair over the shards: gpu01's GPUs gone from its count while gpu01 is away
    fields = global_stack(stack, hosts)
    stack.global_gpus[G1] = stack.global_gpus[G2] = [0.0]
    fd = os.open(run_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the controller, driving the run
    try:
        checks = run(stack, hosts, inventory=str(inv), **fields)
    finally:
        os.close(fd)  # the controller dies
    why = f"out of service in upgrade-driver run {run_id} (rebooting)"
    assert failed(checks) == []
    assert detail(checks, "prom01", "scraping job dcgm") == (
        f"gpu01 (10.0.0.11:9400) down, {why}: connection refused"
    )
    driver = row(checks, "gpu01", "NVML: loaded driver = installed")
    assert driver.state == PENDING and driver.detail.endswith(f"({why})")
    assert ("upgrade-driver", "*", "rollout under way") in pending(checks)
    counted = detail(checks, "mon01", "every GPU once", status.GLOBAL)
    assert counted == f"global_cluster:gpus:count counts 0 of 8 GPUs: gpu01 {why}"

    checks = run(stack, hosts, inventory=str(inv), **fields)
    assert {("prometheus", "prom01", "scraping job dcgm"),
            ("driver", "gpu01", "NVML: loaded driver = installed"),
            (status.GLOBAL, "mon01", "every GPU once"),
            ("upgrade-driver", "*", "no rollout left mid-run")} <= set(failed(checks))  # fmt: skip


def test_a_target_missing_from_the_file_sd_stays_failed_on_a_host_out_of_service():
    # a rollout takes a host's exporters down, never its place in the replicas' file_sd
    from deployer.monitoring.checks_scrape import scrape_checks

    rows, _ = scrape_checks(
        "prom01", [Target("dcgm", "10.0.0.11:9400", "gpu01")], [],
        replica_start=STARTED, daemon_starts={}, now=NOW,
        maintenance={"gpu01": "out of service in upgrade-driver run R (installing)"},
    )  # fmt: skip
    assert [(r.state, r.detail) for r in rows] == [
        (FAILED, "gpu01 (10.0.0.11:9400) not among the replica's targets (file_sd)")
    ]
