"""The default lab's GPU hosts shaped like real hardware, end to end (issue 11, "the lab shows it").

gpu05 is 2xH100 with GPU 0 in MIG mode (GPU instances 3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb: the
layout of the real H100 MIG capture), so its exporter reports GPU 0 once per GPU instance, as the
real 8xA800 scrape does; gpu06 is 2xL40S, whose memory has no temperature sensor (nvidia-smi
N/A, DCGM_FI_DEV_MEMORY_TEMP 0, as the real L40S capture). The real CLI runs against them and the
stack's own APIs judge the result:

- ``up`` converges both, including a MIG host whose driver the run installs (one ``up``: the MIG
  utilization field is in its exporter CSV at once), and a second ``up`` changes nothing;
- ``status`` is green and counts 2 GPUs on each (by UUID, not 5 series) on both replicas;
- an XID on the MIG GPU is ONE alert for that physical GPU, delivered once with the identity
  labels; the power and utilization records count each of gpu05's GPUs once;
- ECC and row-remap faults on the MIG GPU fire as the real exporter makes them: the ECC alert
  once, no row-remap alert (a GPU in MIG mode has no remapped-rows reading: nvidia-smi R590
  prints ``Remapped Rows : N/A`` for it in the H100 MIG capture, and the A800 scrape has no
  row-remap series for its MIG GPU), while the same fault on gpu05's other GPU raises both;
- gpu06 raises no "memory temperature missing" and no HBM alert (a sensor board reading 0 does),
  and its GPU temperature faults fire as on any host;
- ``upgrade-driver`` rolls gpu05 (canary) then gpu06; validation waits the minute DCGM's health
  checks need, passes on gpu05 by what ``dcgmi health``/``diag`` print, and fails gpu06 whose GPU
  reports a double-bit ECC error during its validation.

Set ``GPUMON_REALITY_LAB=<name>`` to run against a lab that is already up (development).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployer import dcgm_fields, rule_pack
from deployer.errors import InputError
from deployer.lab import Lab
from deployer.monitoring.http import http_fetch
from tests.integration.labtools import (
    CLI,
    WebhookReceiver,
    alerting_vars,
    lab_named_by,
    run_cli,
    wait_until,
)

pytestmark = pytest.mark.lab

MIG_HOST, SENSORLESS = "gpu05", "gpu06"
MIG_GPU, PLAIN_GPU = 0, 1  # gpu05: GPU 0 in MIG mode, GPU 1 not
MIG_PROFILES = ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
RULE_VARS = {
    "prometheus_rules_gpu_temp_critical_for": "15s",
    "prometheus_rules_gpu_temp_warning_for": "30s",
    "prometheus_rules_memory_temp_missing_for": "15s",
}
BASELINE, TARGET = "580.65.06", "595.45.04"
M = dcgm_fields.metric

gpumon = functools.partial(run_cli, timeout=1500)


# ---------------------------------------------------------------- the lab and its stack


@pytest.fixture(scope="module")
def rlab(request: pytest.FixtureRequest) -> Lab:
    return lab_named_by("GPUMON_REALITY_LAB", request)


@pytest.fixture(scope="module")
def webhook(rlab: Lab) -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver(rlab.topology.gateway)
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def stack_vars(webhook: WebhookReceiver) -> list[str]:
    alerting = alerting_vars(webhook.url, send_resolved=True, group_interval="30s")
    return ["-e", json.dumps({**alerting, **RULE_VARS})]


def up_json(lab: Lab, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = gpumon("up", "-i", str(lab.inventory_path), "--output", "json", *args)
    assert proc.stdout.strip(), proc.stderr[-4000:]
    return proc.returncode, json.loads(proc.stdout), proc.stderr


@pytest.fixture(scope="module")
def deployed(rlab: Lab, stack_vars: list[str]) -> dict[str, Any]:
    """The whole site converged, gpu05 and gpu06 healed first; the JSON report.
    ``--out-of-service``: another module may have left a GPU host's driver elsewhere than the
    inventory says (the lab runs no GPU work)."""
    for h in (MIG_HOST, SENSORLESS):
        rlab.heal(h)
    rc, report, err = up_json(rlab, "--out-of-service", *stack_vars)
    assert rc == 0, err[-4000:]
    return report


def sh(lab: Lab, host: str, command: str) -> str:
    proc = lab.ssh(host, command, timeout=120)
    assert proc.returncode == 0, f"{host}: {command}: {proc.stderr[-500:]}"
    return proc.stdout


def prometheus_urls(lab: Lab) -> dict[str, str]:
    return {h.name: f"http://{h.address}:9090" for h in lab.hosts if "prometheus" in h.groups}


def query(url: str, promql: str) -> list[dict[str, Any]]:
    r = http_fetch(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    assert r.error is None and r.status == 200, (promql, r)
    return r.json()["data"]["result"]


def alerts(url: str, alertname: str, **labels: str) -> list[dict[str, Any]]:
    """``alertname``'s alerts (pending or firing) in a replica whose labels include ``labels``."""
    r = http_fetch(f"{url}/api/v1/alerts")
    assert r.error is None and r.status == 200, r
    return [
        a
        for a in r.json()["data"]["alerts"]
        if a["labels"].get("alertname") == alertname
        and all(a["labels"].get(k) == v for k, v in labels.items())
    ]


def firing_everywhere(lab: Lab, alertname: str, **labels: str) -> bool:
    return all(
        any(a["state"] == "firing" for a in alerts(u, alertname, **labels))
        for u in prometheus_urls(lab).values()
    )


def delete(url: str) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(urllib.request.Request(url, method="DELETE"), timeout=10):
        pass


def uuids(lab: Lab, host: str) -> list[str]:
    """The host's GPU UUIDs by index, as nvidia-smi lists them."""
    out = sh(lab, host, "nvidia-smi --query-gpu=index,uuid --format=csv,noheader")
    return [line.split(",")[1].strip() for line in sorted(out.splitlines())]


def delivered(webhook: WebhookReceiver, alertname: str, **labels: str) -> list[dict[str, Any]]:
    """The alerts named ``alertname`` started since the receiver opened, as delivered, whose
    labels include ``labels`` (one entry per notification that carried it firing)."""
    out = []
    for n in list(webhook.notifications):
        for a in n["alerts"]:
            if (
                a["labels"].get("alertname") == alertname
                and a["status"] == "firing"
                and all(a["labels"].get(k) == v for k, v in labels.items())
            ):
                out.append(a)
    return out


def metrics(lab: Lab, host: str) -> list[tuple[str, dict[str, str]]]:
    """(name, labels) of every sample of the host's exporter."""
    out = []
    for line in sh(lab, host, "curl -fsS http://127.0.0.1:9400/metrics").splitlines():
        if line.startswith("#") or "{" not in line:
            continue
        name, rest = line.split("{", 1)
        body = rest.rsplit("}", 1)[0]
        labels = dict((k, v.strip('"')) for k, v in (p.split("=", 1) for p in _split_labels(body)))
        out.append((name, labels))
    return out


def _split_labels(body: str) -> list[str]:
    parts, cur, quoted = [], "", False
    for ch in body:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [*parts, cur] if cur else parts


# ---------------------------------------------------------------- up and status


def test_up_converges_the_gpu_roles_on_the_mig_and_the_sensorless_host(deployed):
    for host in (MIG_HOST, SENSORLESS):
        tasks = deployed["hosts"][host]["tasks"]
        roles = {t["role"] for t in tasks}
        assert {"nvidia_driver", "dcgm", "dcgm_exporter", "node_exporter"} <= roles, host
        assert [t["task"] for t in tasks if t["status"] not in ("ok", "changed")] == [], host


def test_a_second_up_changes_nothing_on_either_host(deployed, rlab, stack_vars):
    rc, report, err = up_json(rlab, "--limit", f"{MIG_HOST}:{SENSORLESS}", *stack_vars)
    assert rc == 0, err[-3000:]
    changed = [
        (h, t["task"])
        for h, r in report["hosts"].items()
        for t in r["tasks"]
        if t["status"] != "ok"
    ]
    assert changed == []


def test_the_mig_host_exports_its_mig_gpu_per_gpu_instance(deployed, rlab):
    gpu0, gpu1 = uuids(rlab, MIG_HOST)
    series = metrics(rlab, MIG_HOST)
    temps = [lb for n, lb in series if n == M("gpu_temp")]
    per_instance = [lb for lb in temps if lb["UUID"] == gpu0]
    assert sorted(lb["GPU_I_PROFILE"] for lb in per_instance) == MIG_PROFILES
    assert [lb for lb in temps if lb["UUID"] == gpu1 and "GPU_I_ID" not in lb] != []
    # NVML has no utilization for a GPU in MIG mode: only GPU 1 reports one
    assert {lb["UUID"] for n, lb in series if n == M("gpu_util")} == {gpu1}
    # ... and the CSV collects the instances' graphics-engine activity for the records
    active = {lb.get("GPU_I_PROFILE") for n, lb in series if n == M("gr_engine_active")}
    assert set(MIG_PROFILES) <= active
    csv = sh(rlab, MIG_HOST, "cat /etc/dcgm-exporter/gpumon-counters.csv")
    assert M("gr_engine_active") in csv
    assert M("gr_engine_active") not in sh(
        rlab, SENSORLESS, "cat /etc/dcgm-exporter/gpumon-counters.csv"
    )


def test_status_is_green_and_counts_each_hosts_gpus_on_both_replicas(deployed, rlab):
    # status --wait retries until every row is ok (bounded); its last rows say what was not
    proc = gpumon(
        "status", "-i", str(rlab.inventory_path), "--output", "json", "--wait", "300", timeout=420
    )
    data = json.loads(proc.stdout)
    not_ok = [c for c in data["checks"] if not c["ok"]]
    assert proc.returncode == 0, not_ok
    rows = {(c["component"], c["host"]): c for c in data["checks"]}
    for host in (MIG_HOST, SENSORLESS):
        row = rows[("gpus", host)]
        assert row["ok"] and row["check"] == "2 GPUs in the exporter's metrics", row
        assert row["detail"] == "2/2 (distinct UUIDs) on 2 replica(s)", row


def test_a_fresh_mig_host_converges_in_one_up(deployed, rlab, stack_vars):
    # gpu05 as a new host: no NVIDIA package, no exporter CSV. The facts of the run cannot see
    # MIG mode (no nvidia-smi until the driver play); the CSV must still come out right.
    sh(rlab, MIG_HOST, "apt-mark unhold $(apt-mark showhold) >/dev/null; "
       "systemctl stop dcgm-exporter nvidia-dcgm nvidia-persistenced 2>/dev/null; "
       "apt-get purge -y -q $(dpkg-query -W -f='${Package}\\n' | grep -E "
       "'^(nvidia-|libnvidia-|libcuda|cuda-drivers|datacenter-gpu-manager)') >/dev/null; "
       "rm -f /etc/dcgm-exporter/gpumon-counters.csv /var/lib/gpumon/nvidia-driver.json; "
       "! command -v nvidia-smi")  # fmt: skip
    # Without a driver the facts read the GPUs off the (simulated) PCI bus, as on bare metal
    proc = gpumon("facts", "-i", str(rlab.inventory_path), "--limit", MIG_HOST, "--output", "json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout)["hosts"][MIG_HOST]
    assert found["gpus"] == [] and found["nvidia_smi"] == "absent", found
    assert (found["nvidia_pci_gpus"], found["nvidia_pci_gpu_ids"]) == (2, ["2330", "2330"]), found
    rc, report, err = up_json(rlab, "--limit", MIG_HOST, "--out-of-service", *stack_vars)
    assert rc == 0, err[-3000:]
    assert M("gr_engine_active") in sh(rlab, MIG_HOST, "cat /etc/dcgm-exporter/gpumon-counters.csv")
    rc, report, err = up_json(rlab, "--limit", MIG_HOST, *stack_vars)
    assert rc == 0, err[-3000:]
    changed = [t["task"] for t in report["hosts"][MIG_HOST]["tasks"] if t["status"] != "ok"]
    assert changed == []


# ---------------------------------------------------------------- alerts and records


def test_an_xid_on_the_mig_gpu_is_one_alert_for_the_physical_gpu(deployed, rlab, webhook):
    gpu0 = uuids(rlab, MIG_HOST)[MIG_GPU]
    want = {"node": MIG_HOST, "gpu": str(MIG_GPU)}
    rlab.fault(MIG_HOST, "xid", gpu=MIG_GPU, xid=64)  # row remapper failure: critical
    try:
        wait_until(
            "GPUXidCritical firing in both replicas",
            lambda: firing_everywhere(rlab, "GPUXidCritical", **want),
            240,
        )
        for url in prometheus_urls(rlab).values():
            found = alerts(url, "GPUXidCritical", node=MIG_HOST)
            assert len(found) == 1, found  # not one per GPU instance (4)
            assert found[0]["labels"]["UUID"] == gpu0 and found[0]["labels"]["xid"] == "64"
        wait_until("the notification", lambda: delivered(webhook, "GPUXidCritical", **want), 120)
        time.sleep(45)  # a duplicate from another Alertmanager peer would be here by now
        sent = delivered(webhook, "GPUXidCritical", node=MIG_HOST)
        assert len(sent) == 1, sent
        labels = sent[0]["labels"]
        for key in rule_pack.identity_labels("GPUXidCritical"):
            assert labels.get(key), (key, labels)
        assert (labels["cluster"], labels["UUID"]) == ("lab", gpu0)
        assert labels["instance"].endswith(":9400")
        assert not {"GPU_I_ID", "GPU_I_PROFILE", "Hostname", "hostname"} & set(labels)
    finally:
        rlab.heal(MIG_HOST)


def test_power_and_utilization_records_count_each_mig_gpu_once(deployed, rlab):
    node = f'node="{MIG_HOST}"'
    for name, url in prometheus_urls(rlab).items():
        wait_until(
            f"gpu records of {MIG_HOST} in {name}",
            lambda u=url: query(u, f"gpu:gpu_utilization:percent{{{node}}}"),
            180,
        )
        assert len(query(url, f"gpu:gpu_power_usage_watts:max{{{node}}}")) == 2
        assert len(query(url, f"gpu:gpu_utilization:percent{{{node}}}")) == 2  # MIG GPU too
        # the node's power: its 2 GPUs once each, not GPU 0 once per GPU instance
        per_gpu = f"sum(max by (UUID) ({M('power_usage')}{{{node}}}))"
        per_series = f"sum({M('power_usage')}{{{node}}})"
        record = f"sum(node:gpu_power_usage_watts:sum{{{node}}})"
        values = {q: float(query(url, q)[0]["value"][1]) for q in (per_gpu, per_series, record)}
        assert values[record] == pytest.approx(values[per_gpu], rel=0.2), values
        assert values[per_series] > values[record] * 1.5, values
        avg = query(url, f"node:gpu_utilization:avg{{{node}}}")
        assert len(avg) == 1, avg


def test_ecc_and_row_remap_faults_on_the_mig_gpu_fire_as_the_real_exporter_shows_them(
    deployed, rlab
):
    for gpu in (MIG_GPU, PLAIN_GPU):
        rlab.fault(MIG_HOST, "ecc-dbe", gpu=gpu, count=2, row_remap_failure=True)
    try:
        for gpu in (MIG_GPU, PLAIN_GPU):
            wait_until(
                f"GPUDoubleBitECCError for GPU {gpu}",
                lambda g=gpu: firing_everywhere(
                    rlab, "GPUDoubleBitECCError", node=MIG_HOST, gpu=str(g)
                ),
                240,
            )
        wait_until(
            "GPURowRemapFailure for the GPU without MIG",
            lambda: firing_everywhere(
                rlab, "GPURowRemapFailure", node=MIG_HOST, gpu=str(PLAIN_GPU)
            ),
            120,
        )
        for url in prometheus_urls(rlab).values():
            dbe = alerts(url, "GPUDoubleBitECCError", node=MIG_HOST)
            assert sorted(a["labels"]["gpu"] for a in dbe) == ["0", "1"], dbe  # once per GPU
            remap = alerts(url, "GPURowRemapFailure", node=MIG_HOST)
            assert [a["labels"]["gpu"] for a in remap] == [str(PLAIN_GPU)], remap
            # no remapped-rows reading for a GPU in MIG mode, as on real hardware
            gpu0 = f'{M("row_remap_failure")}{{node="{MIG_HOST}",gpu="{MIG_GPU}"}}'
            assert query(url, gpu0) == []
    finally:
        rlab.heal(MIG_HOST)


def test_the_sensorless_board_raises_no_memory_temperature_alert_and_a_sensor_board_does(
    deployed, rlab
):
    with pytest.raises(InputError) as refused:
        rlab.fault(SENSORLESS, "memory-temp", gpu=0, value=99)
    assert refused.value.key == "gpu"
    rlab.fault(MIG_HOST, "memory-temp", gpu=PLAIN_GPU, value=0)  # an H100 whose reading is 0
    try:
        wait_until(
            "GPUMemoryTemperatureMissing for the H100 reading 0",
            lambda: firing_everywhere(
                rlab, "GPUMemoryTemperatureMissing", node=MIG_HOST, gpu=str(PLAIN_GPU)
            ),
            240,
        )
        for url in prometheus_urls(rlab).values():
            for name in ("GPUMemoryTemperatureMissing", "GPUMemoryTemperatureHigh"):
                assert alerts(url, name, node=SENSORLESS) == [], name
            # gpu06's exporter does export the 0 the real L40S scrape shows
            zero = query(url, f'{M("memory_temp")}{{node="{SENSORLESS}"}} == 0')
            assert len(zero) == 2, zero
    finally:
        rlab.heal(MIG_HOST)


def test_gpu_temperature_faults_fire_on_the_sensorless_board(deployed, rlab, webhook):
    want = {"node": SENSORLESS, "gpu": "1"}
    rlab.fault(SENSORLESS, "gpu-temp", gpu=1, value=99)
    try:
        wait_until(
            "GPUTemperatureCritical delivered for gpu06",
            lambda: delivered(webhook, "GPUTemperatureCritical", **want),
            240,
        )
        labels = delivered(webhook, "GPUTemperatureCritical", **want)[0]["labels"]
        assert labels["UUID"] == uuids(rlab, SENSORLESS)[1]
        assert labels["modelName"] == "NVIDIA L40S"
    finally:
        rlab.heal(SENSORLESS)


# ---------------------------------------------------------------- upgrade-driver


class FaultOnValidation(threading.Thread):
    """Watches the run's state file; when ``host`` starts validating (after its reboot), gives
    its GPU 0 a double-bit ECC error: a GPU that goes bad right after the upgrade."""

    def __init__(self, lab: Lab, root: Path, host: str) -> None:
        super().__init__(daemon=True)
        self.lab, self.root, self.host = lab, root, host
        self.done = threading.Event()
        self.injected_at: float | None = None

    def run(self) -> None:
        while not self.done.is_set() and self.injected_at is None:
            for path in self.root.glob("*/state.json"):
                try:
                    state = json.loads(path.read_text())["hosts"][self.host]["state"]
                except (ValueError, KeyError):
                    continue
                if state == "validating":
                    self.lab.fault(self.host, "ecc-dbe", gpu=0, count=1)
                    self.injected_at = time.time()
            time.sleep(0.5)


def test_upgrade_driver_rolls_the_mig_and_the_sensorless_host_judging_dcgms_output(
    deployed, rlab, tmp_path
):
    hosts = f"{MIG_HOST}:{SENSORLESS}"
    rc, _, err = up_json(
        rlab, "--limit", hosts, "-e", f"nvidia_driver_version={BASELINE}",
        "-e", "nvidia_driver_reboot=if_required", "--out-of-service",
    )  # fmt: skip
    assert rc == 0, err[-3000:]
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {"GPUMON_ROLLOUT_STATE_DIR": str(runs)}
    watcher = FaultOnValidation(rlab, runs, SENSORLESS)
    watcher.start()
    args = (
        "upgrade-driver", "-i", str(rlab.inventory_path), "--to", "595", "--limit", hosts,
        "--canary", "1", "--batch-size", "1", "--max-failures", "1", "--output", "json",
    )  # fmt: skip
    try:
        proc = subprocess.run(
            [*CLI, *args], capture_output=True, text=True, timeout=1500, env={**os.environ, **env}
        )
    finally:
        watcher.done.set()
        watcher.join(10)
    try:
        assert proc.returncode == 1, proc.stderr[-3000:]
        report = json.loads(proc.stdout)
        assert report["batches"] == [[MIG_HOST], [SENSORLESS]]

        # the canary, in MIG mode: every check passed on what nvidia-smi and dcgmi printed
        mig = report["hosts"][MIG_HOST]
        assert mig["state"] == "done", mig["reason"]
        checks = {c["check"]: c for c in mig["validation"]}
        assert all(c["ok"] for c in checks.values()), checks
        assert checks["nvidia-smi sees every GPU"]["detail"] == f"2 GPUs at {TARGET}"
        assert checks["dcgmi health"]["detail"].startswith("Overall Health: Healthy")
        assert checks["dcgmi diag -r 2"]["ok"]
        assert checks["Prometheus replicas see the host"]["ok"]
        steps = dict(mig["history"])
        assert steps["recording"] - steps["validating"] >= 60  # DCGM's minute of samples
        smi = "nvidia-smi --query-gpu=mig.mode.current --format=csv,noheader"
        assert sh(rlab, MIG_HOST, smi).split() == ["Enabled", "Disabled"]
        assert M("gr_engine_active") in sh(
            rlab, MIG_HOST, "cat /etc/dcgm-exporter/gpumon-counters.csv"
        )

        # the sensorless host: its GPU 0 went bad during validation; dcgmi said so (exit 0)
        assert watcher.injected_at is not None
        bad = report["hosts"][SENSORLESS]
        assert (bad["state"], bad["failed_step"]) == ("failed", "validating"), bad
        assert "dcgmi health: Overall Health: Failure" in bad["reason"]
        assert "double-bit ECC" in bad["reason"]
        assert report["summary"]["failed"] == {SENSORLESS: bad["reason"]}
    finally:
        rlab.heal(SENSORLESS)
        if proc.stdout.strip():  # a failed host stays silenced: lift its silences here
            am = next(h.address for h in rlab.hosts if "alertmanager" in h.groups)
            for sid in json.loads(proc.stdout)["hosts"][SENSORLESS]["silence_ids"]:
                delete(f"http://{am}:9093/api/v2/silence/{sid}")
