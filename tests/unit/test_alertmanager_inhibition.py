"""Inhibition in the alertmanager.yml the product renders, checked by a real Alertmanager.

The configuration is taken from the engine's own plan (as ``up`` writes it), checked by amtool,
and loaded by Debian's Alertmanager (0.25, the lab's) listening on 127.0.0.1 with clustering off.
Alerts shaped as the rule pack sends them (severity, alert_family and the identifying labels of
deployer/rule_pack.py) are posted to its API; the API says which ones are inhibited, and a webhook
receiver on 127.0.0.1 records what is delivered. Without the binaries these tests skip, unless CI
is set, where they fail.
"""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer import rule_pack
from tests.unit.test_monitoring_config import content, plan, tool

GPU = {"cluster": "lab", "node": "gpu01", "instance": "10.0.0.11:9400", "job": "dcgm"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Webhook:
    def __init__(self) -> None:
        self.alerts: list[dict[str, Any]] = []
        received = self.alerts

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                received.extend(json.loads(body)["alerts"])
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.server.shutdown()


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory, webhook: Webhook) -> Iterator[str]:
    binary = tool("prometheus-alertmanager")
    amtool = tool("amtool")
    tmp = tmp_path_factory.mktemp("am")
    routing = {
        "alertmanager_receivers": [{"name": "test", "webhook_configs": [{"url": webhook.url}]}],
        "alertmanager_route": {
            "receiver": "test",
            "group_by": ["alertname", "node", "gpu"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
    }
    config = tmp / "alertmanager.yml"
    config.write_text(
        content(plan(tmp, json.dumps(routing)), "mon01", "alertmanager", "alertmanager.yml")
    )
    check = subprocess.run(
        [amtool, "check-config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("Alertmanager did not become ready in 30s")
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def alert(alertname: str, severity: str, family: str, **labels: str) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "labels": {
            "alertname": alertname,
            "severity": severity,
            "alert_family": family,
            **GPU,
            **labels,
        },
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(minutes=10)).isoformat(),
    }


def post(url: str, alerts: list[dict[str, Any]]) -> None:
    req = urllib.request.Request(
        f"{url}/api/v2/alerts",
        data=json.dumps(alerts).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(req, timeout=10)


def states(url: str) -> dict[tuple[str, str], list[str]]:
    """{(alertname, gpu): the alerts inhibiting it} of every alert Alertmanager holds."""
    with urllib.request.urlopen(f"{url}/api/v2/alerts", timeout=10) as r:
        alerts = json.loads(r.read())
    return {
        (a["labels"]["alertname"], a["labels"].get("gpu", "")): a["status"]["inhibitedBy"]
        for a in alerts
    }


def wait_for(what: str, probe: Any, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.25)
    pytest.fail(f"{what}: not within {timeout}s")


def test_the_pack_alerts_carry_the_labels_the_inhibit_rules_compare():
    rules = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "roles/alertmanager/defaults/main.yml").read_text()
    )["alertmanager_inhibit_rules"]
    family_rule = next(r for r in rules if "alert_family" in r["equal"])
    assert set(rule_pack.identity_labels("GPUTemperatureHigh")) <= set(family_rule["equal"])


def test_a_critical_temperature_silences_the_warning_of_the_same_gpu(alertmanager, webhook):
    uuid0 = {"gpu": "0", "UUID": "GPU-aaaa"}
    uuid1 = {"gpu": "1", "UUID": "GPU-bbbb"}
    post(
        alertmanager,
        [
            alert("GPUTemperatureCritical", "critical", "gpu_temperature", **uuid0),
            alert("GPUTemperatureHigh", "warning", "gpu_temperature", **uuid0),
            alert("GPUThermalThrottling", "warning", "gpu_temperature", **uuid0),
            alert("GPUTemperatureHigh", "warning", "gpu_temperature", **uuid1),
        ],
    )
    held = wait_for(
        "the warnings of GPU 0 inhibited",
        lambda: (s := states(alertmanager)).get(("GPUTemperatureHigh", "0")) and s,
    )
    assert held[("GPUThermalThrottling", "0")]
    assert held[("GPUTemperatureHigh", "1")] == []  # another GPU
    assert held[("GPUTemperatureCritical", "0")] == []
    delivered = wait_for(
        "the critical alert and GPU 1's warning delivered",
        lambda: (
            {(a["labels"]["alertname"], a["labels"]["gpu"]) for a in webhook.alerts}
            >= {("GPUTemperatureCritical", "0"), ("GPUTemperatureHigh", "1")}
            and webhook.alerts
        ),
    )
    names = {(a["labels"]["alertname"], a["labels"]["gpu"]) for a in delivered}
    assert ("GPUTemperatureHigh", "0") not in names
    assert ("GPUThermalThrottling", "0") not in names


def test_a_critical_alert_does_not_silence_another_familys_warning(alertmanager):
    gpu = {"gpu": "2", "UUID": "GPU-cccc"}
    post(
        alertmanager,
        [
            alert("GPUDoubleBitECCError", "critical", "gpu_memory_errors", **gpu),
            alert("GPUTemperatureHigh", "warning", "gpu_temperature", **gpu),
            alert("GPURetiredPagesHigh", "warning", "gpu_memory_errors", **gpu),
        ],
    )
    held = wait_for(
        "the retired-pages warning inhibited",
        lambda: (s := states(alertmanager)).get(("GPURetiredPagesHigh", "2")) and s,
    )
    assert held[("GPUTemperatureHigh", "2")] == []


def test_a_critical_alert_of_one_node_does_not_silence_another_nodes_warning(alertmanager):
    post(
        alertmanager,
        [
            alert("GPUXidCritical", "critical", "gpu_xid", gpu="3", UUID="GPU-dddd", xid="79"),
            alert(
                "GPUXidWarning",
                "warning",
                "gpu_xid",
                gpu="3",
                UUID="GPU-eeee",
                xid="63",
                node="gpu02",
                instance="10.0.0.12:9400",
            ),
        ],
    )
    time.sleep(2)
    held = states(alertmanager)
    assert ("GPUXidWarning", "3") in held and held[("GPUXidWarning", "3")] == []
