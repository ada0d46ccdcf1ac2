"""Long-term storage and the global view on the lab, for real: Debian's VictoriaMetrics 1.79.5 on
mon01 (group metrics_store), both Prometheus replicas remote-writing to it, vmbackup to the lab's
moto S3 server on the bridge, and ``gpumon-deploy restore``.

- both replicas write; the global view returns every simulated GPU exactly once with its cluster;
- one replica stopped for two minutes and started again: no gap in the global view's series for
  that time (and the stopped replica's own series do show the gap: the check can see one);
- the store unreachable for a while: the replicas keep scraping, and once it is back they replay
  the outage from their WAL, so the store has no gap either;
- the store's data deleted and restored from the bucket: the series of the last backup are back;
- the store's credentials and the S3 keys appear in no output, no journal and no file other than
  the 0600 ones that must hold them.

The test switches the store's basic auth on (credentials of its own, in a 0600 extra-vars file).
Runs on the session ``lab`` fixture; ``GPUMON_GLOBAL_VIEW_LAB=<name>`` runs it on a lab of that
name that is already up instead.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import secrets
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployer.lab import Lab, s3
from deployer.monitoring.http import http_fetch
from tests.integration.labtools import WallClock, lab_named_by, run_cli, wait_until

pytestmark = pytest.mark.lab

gpumon = functools.partial(run_cli, timeout=900)
METRIC = "DCGM_FI_DEV_GPU_TEMP"
STORE_PORT = 8428
# Every output any test here produced, checked for secrets at the end.
OUTPUTS: list[tuple[str, str]] = []


def record(what: str, proc: Any) -> Any:
    OUTPUTS.append((what, proc.stdout + proc.stderr))
    return proc


@pytest.fixture(scope="module")
def glab(request: pytest.FixtureRequest) -> Lab:
    return lab_named_by("GPUMON_GLOBAL_VIEW_LAB", request)


@pytest.fixture(scope="module")
def credentials() -> dict[str, str]:
    return {
        "metrics_store_username": "gpumon-" + secrets.token_hex(4),
        "metrics_store_password": "pw-" + secrets.token_urlsafe(18) + '"\\$x',
    }


@pytest.fixture(scope="module")
def vars_file(tmp_path_factory: pytest.TempPathFactory, credentials: dict[str, str]) -> Path:
    path = tmp_path_factory.mktemp("global-view") / "store-credentials.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(credentials, f)
    return path


@pytest.fixture(scope="module")
def extra(vars_file: Path) -> list[str]:
    return ["-e", f"@{vars_file}"]


@pytest.fixture(scope="module")
def deployed(glab: Lab, extra: list[str]) -> Lab:
    proc = record("up", gpumon("up", "-i", str(glab.inventory_path), *extra))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return glab


def host(lab: Lab, name: str) -> Any:
    topo = lab.topology
    assert topo is not None
    return topo.host(name)


def store_url(lab: Lab) -> str:
    return f"http://{host(lab, 'mon01').address}:{STORE_PORT}"


def auth(credentials: dict[str, str]) -> dict[str, str]:
    token = f"{credentials['metrics_store_username']}:{credentials['metrics_store_password']}"
    return {"Authorization": "Basic " + base64.b64encode(token.encode()).decode()}


def api(base: str, path: str, headers: dict[str, str], **params: Any) -> Any:
    r = http_fetch(f"{base}{path}?{urllib.parse.urlencode(params)}", headers, timeout=30)
    assert r.error is None and r.status == 200, (path, params, r.status, r.error, r.body[:300])
    data = r.json()
    assert data["status"] == "success", data
    return data["data"]["result"]


def ssh_ok(lab: Lab, name: str, command: str, timeout: float = 120) -> str:
    proc = lab.ssh(name, command, timeout=timeout)
    assert proc.returncode == 0, (name, command, proc.stdout[-2000:], proc.stderr[-2000:])
    return proc.stdout


def status(lab: Lab, extra: list[str]) -> dict[str, Any]:
    proc = record(
        "status", gpumon("status", "-i", str(lab.inventory_path), "--output", "json", *extra)
    )
    return json.loads(proc.stdout)


def store_checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    comps = ("metrics store", "remote write", "global view")
    return [c for c in report["checks"] if c["component"] in comps]


def gpus_by_node(lab: Lab) -> dict[str, int]:
    return {h.name: h.gpu_count for h in lab.hosts if h.is_gpu}


def steps_with_every_gpu(
    base: str, headers: dict[str, str], node: str, gpus: int, start: float, end: float
) -> tuple[int, list[float]]:
    """(steps, the steps where not every GPU of ``node`` had a sample in the 30 s before)."""
    result = api(
        base,
        "/api/v1/query_range",
        headers,
        query=f'count(count_over_time({METRIC}{{node="{node}"}}[30s]))',
        start=int(start),
        end=int(end),
        step="15s",
    )
    have = {float(t): float(v) for t, v in (result[0]["values"] if result else [])}
    steps = [start + 15 * i for i in range(int((end - start) // 15) + 1)]
    missing = [t for t in steps if have.get(float(int(t)), 0) < gpus]
    return len(steps), missing


def _settled_minute() -> tuple[float, float]:
    """The last minute the store shows (it hides the newest 30 s: -search.latencyOffset)."""
    now = time.time()
    return now - 90, now - 30


# ---------------------------------------------------------------- both replicas, one view


def test_both_replicas_write_to_the_store(deployed: Lab, extra: list[str]) -> None:
    def sent() -> dict[str, float]:
        out = {}
        for name in ("prom01", "prom02"):
            r = http_fetch(f"http://{host(deployed, name).address}:9090/metrics", {})
            out[name] = sum(
                float(line.rsplit(" ", 1)[1])
                for line in r.body.splitlines()
                if line.startswith("prometheus_remote_storage_samples_total{")
                and 'remote_name="store-mon01"' in line
            )
        return out

    first = wait_until("both replicas sending", lambda: all(sent().values()) and sent(), 120)
    time.sleep(20)
    later = sent()
    assert all(later[n] > first[n] for n in first), (first, later)
    rows = wait_until(
        "remote write checks green",
        lambda: (
            (
                rw := [
                    c
                    for c in store_checks(status(deployed, extra))
                    if c["component"] == "remote write"
                ]
            )
            and all(c["ok"] for c in rw)
            and rw
        ),
        120,
        every=5,
    )
    assert {c["host"] for c in rows} == {"prom01", "prom02"}


def test_global_view_returns_every_gpu_once_with_its_cluster(
    deployed: Lab, credentials: dict[str, str], extra: list[str]
) -> None:
    want = gpus_by_node(deployed)

    def per_gpu() -> list[dict[str, Any]]:
        rows = api(
            store_url(deployed),
            "/api/v1/query",
            auth(credentials),
            query=f"count by (node, UUID, cluster) (count by (node, UUID, GPU_I_ID, cluster) ({METRIC}))",
        )
        return rows if len(rows) == sum(want.values()) else []

    # one series per GPU, or per GPU instance of a MIG GPU (gpu05's GPU 0: 4 instances)
    rows = wait_until("every GPU in the global view", per_gpu, 120)
    instances = api(
        store_url(deployed),
        "/api/v1/query",
        auth(credentials),
        query=f"count by (node, UUID, GPU_I_ID) ({METRIC})",
    )
    assert all(r["value"][1] == "1" for r in instances), instances
    assert {r["metric"]["cluster"] for r in rows} == {"lab"}
    seen: dict[str, set[str]] = {}
    for r in rows:
        seen.setdefault(r["metric"]["node"], set()).add(r["metric"]["UUID"])
    assert {n: len(u) for n, u in seen.items()} == want
    # no series keeps the replica label
    replicas = api(
        store_url(deployed),
        "/api/v1/query",
        auth(credentials),
        query=f"count by (replica) ({METRIC})",
    )
    assert [r["metric"] for r in replicas] == [{}]
    view = [c for c in store_checks(status(deployed, extra)) if c["component"] == "global view"]
    assert view and all(c["ok"] for c in view), view


def test_store_refuses_queries_without_its_credentials(deployed: Lab) -> None:
    r = http_fetch(f"{store_url(deployed)}/api/v1/query?query=up", {})
    assert r.status == 401


def test_no_gap_in_the_global_view_while_one_replica_is_down_two_minutes(
    deployed: Lab, credentials: dict[str, str]
) -> None:
    headers = auth(credentials)
    base = store_url(deployed)
    node, gpus = "gpu01", gpus_by_node(deployed)["gpu01"]
    # The window judged starts 30 s before the stop: the store has every GPU in the minute before
    # (run alone right after `up`, the first steps would predate the first sample).
    wait_until(
        "the global view has every GPU for a minute",
        lambda: not steps_with_every_gpu(base, headers, node, gpus, *_settled_minute())[1],
        240,
        every=5,
    )
    clock = WallClock()
    stopped = time.time()
    ssh_ok(deployed, "prom01", "systemctl stop prometheus.service", timeout=180)
    try:
        time.sleep(120)
    finally:
        ssh_ok(deployed, "prom01", "systemctl start prometheus.service")
    started = time.time()
    prom01 = f"http://{host(deployed, 'prom01').address}:9090"
    wait_until("prom01 ready", lambda: http_fetch(f"{prom01}/-/ready", {}).status == 200, 300)
    # VictoriaMetrics shows a sample 30 s after it arrives (-search.latencyOffset).
    time.sleep(max(0.0, started + 75 - time.time()))
    steps, missing = steps_with_every_gpu(base, headers, node, gpus, stopped - 30, started + 30)
    assert steps >= 10
    if missing and abs(step := clock.stepped()) > 5:
        pytest.skip(
            f"the machine's wall clock stepped {step:+.0f}s against the monotonic clock while the "
            f"replica was down ({len(missing)}/{steps} steps without every GPU): every daemon "
            "saw the step, so this window cannot judge the pair"
        )
    assert missing == [], f"global view: {len(missing)}/{steps} steps without every GPU"
    # The stopped replica's own data has the gap this test would have seen.
    _, own = steps_with_every_gpu(prom01, {}, node, gpus, stopped + 30, started - 30)
    assert len(own) >= 4, own
    print(
        f"replica down {started - stopped:.0f}s: global view {steps - len(missing)}/{steps} steps "
        f"with all {gpus} GPUs of {node}; the stopped replica itself missed {len(own)} steps"
    )


def test_replicas_replay_a_store_outage_from_their_wal(
    deployed: Lab, credentials: dict[str, str], extra: list[str]
) -> None:
    headers = auth(credentials)
    down = time.time()
    ssh_ok(deployed, "mon01", "systemctl stop victoria-metrics.service", timeout=360)
    try:
        time.sleep(60)
        report = status(deployed, extra)
        replicas = [
            c
            for c in report["checks"]
            if c["component"] == "prometheus" and c["check"] != "scraping job victoriametrics"
        ]
        assert all(c["ok"] for c in replicas), [c for c in replicas if not c["ok"]]
        assert not next(c for c in store_checks(report) if c["check"] == "healthy")["ok"]
    finally:
        ssh_ok(deployed, "mon01", "systemctl start victoria-metrics.service")
    up_again = time.time()
    wait_until(
        "both replicas caught up",
        lambda: (
            (
                rw := [
                    c
                    for c in store_checks(status(deployed, extra))
                    if c["component"] == "remote write"
                ]
            )
            and all(c["ok"] for c in rw)
        ),
        300,
        every=5,
    )
    time.sleep(max(0.0, up_again + 45 - time.time()))
    node, gpus = "gpu02", gpus_by_node(deployed)["gpu02"]
    steps, missing = steps_with_every_gpu(
        store_url(deployed), headers, node, gpus, down - 15, up_again
    )
    assert missing == [], f"{len(missing)}/{steps} steps of the outage not replayed"
    print(f"store down {up_again - down:.0f}s: {steps}/{steps} steps of {node} replayed")


# ---------------------------------------------------------------- disaster recovery


def test_store_restored_from_the_bucket_has_the_series_of_the_last_backup(
    deployed: Lab, credentials: dict[str, str], extra: list[str]
) -> None:
    headers = auth(credentials)
    base = store_url(deployed)
    reference = time.time() - 90  # before the backup, well inside what the store has
    # GPUs, not series: gpu05's MIG GPU has one series per GPU instance, all with its UUID
    query = f"count(count by (UUID) (count_over_time({METRIC}[60s] @ {int(reference)})))"
    total = sum(gpus_by_node(deployed).values())
    assert api(base, "/api/v1/query", headers, query=query)[0]["value"][1] == str(total)

    ssh_ok(deployed, "mon01", "systemctl start gpumon-vmbackup.service", timeout=600)
    # Incremental: a second backup right after the first uploads only what changed since.
    ssh_ok(deployed, "mon01", "systemctl start gpumon-vmbackup.service", timeout=600)
    journal = ssh_ok(deployed, "mon01", "journalctl -u gpumon-vmbackup -o cat --no-pager")
    done = [ln for ln in journal.splitlines() if "is complete; backed up" in ln][-1]
    backed_up = int(re.search(r"backed up (\d+) bytes", done).group(1))
    uploaded = int(re.search(r"uploaded (\d+) bytes", done).group(1))
    assert 0 <= uploaded < backed_up, done
    # status sees the backup (its time via node_exporter's textfile collector on the store host)
    wait_until(
        "status: the store backed up",
        lambda: [
            c
            for c in store_checks(status(deployed, extra))
            if c["check"] == "backed up" and c["ok"] and c["detail"].startswith("last backup")
        ],
        90,
        every=5,
    )
    topo = deployed.topology
    assert topo is not None
    creds = s3.credentials(deployed.dir)
    keys = s3.objects(s3.endpoint(topo.gateway), creds, prefix="gpumon/mon01/latest/")
    assert "gpumon/mon01/latest/backup_complete.ignore" in keys, keys[:10]

    ssh_ok(
        deployed,
        "mon01",
        "systemctl stop victoria-metrics.service && rm -rf /var/lib/victoria-metrics/* && "
        "systemctl start victoria-metrics.service",
        timeout=360,
    )
    wait_until("empty store up", lambda: http_fetch(f"{base}/health", {}).status == 200, 60)
    assert api(base, "/api/v1/query", headers, query=query) == []

    began = time.monotonic()
    proc = record("restore", gpumon("restore", "-i", str(deployed.inventory_path), *extra, "--yes"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    print(
        f"backup: {backed_up} bytes, second backup uploaded {uploaded}; "
        f"restore {time.monotonic() - began:.1f}s; {len(keys)} objects in the bucket"
    )
    back = wait_until(
        "the backup's series back",
        lambda: api(base, "/api/v1/query", headers, query=query),
        60,
    )
    assert back[0]["value"][1] == str(total)
    report = wait_until(
        "store checks green after the restore",
        lambda: (r := status(deployed, extra)) and all(c["ok"] for c in store_checks(r)) and r,
        300,
        every=5,
    )
    assert store_checks(report)


def test_archive_install_serves_the_same_store(
    deployed: Lab, credentials: dict[str, str], extra: list[str]
) -> None:
    """The upstream archives (the lab mirror repacks Debian's binaries in VictoriaMetrics' own
    release layout, checksums files included) replace the package's binaries on the same data."""
    inv = str(deployed.inventory_path)
    archive = ["-e", "victoriametrics_install=archive"]
    try:
        proc = record("up archive", gpumon("up", "-i", inv, "--limit", "mon01", *extra, *archive))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        running = ssh_ok(deployed, "mon01", "systemctl show -p ExecStart victoria-metrics.service")
        assert "path=/usr/local/bin/victoria-metrics " in running, running
        target = ssh_ok(deployed, "mon01", "readlink -f /usr/local/bin/victoria-metrics").strip()
        assert target == "/opt/victoriametrics/1.79.5/server/victoria-metrics-prod"
        report = wait_until(
            "store checks green on the archive install",
            lambda: (r := status(deployed, extra)) and all(c["ok"] for c in store_checks(r)) and r,
            180,
            every=5,
        )
        assert any(c["component"] == "global view" for c in store_checks(report))
    finally:
        proc = record("up package", gpumon("up", "-i", inv, "--limit", "mon01", *extra))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    running = ssh_ok(deployed, "mon01", "systemctl show -p ExecStart victoria-metrics.service")
    assert "path=/usr/bin/victoria-metrics " in running


# ---------------------------------------------------------------- secrets


@pytest.fixture(scope="module")
def secret_values(glab: Lab, credentials: dict[str, str]) -> list[str]:
    creds = s3.credentials(glab.dir)
    # The password without its quote/backslash/dollar tail: files that must hold it hold it
    # escaped (systemd EnvironmentFile, curl config), and the tail is no secret on its own.
    core = credentials["metrics_store_password"].split('"', 1)[0]
    return [
        core,
        base64.b64encode(
            f"{credentials['metrics_store_username']}:{credentials['metrics_store_password']}".encode()
        ).decode(),
        creds.secret_access_key,
        creds.access_key_id,
    ]


ALLOWED = {
    "mon01": {
        "/etc/victoria-metrics/victoria-metrics.env",
        "/etc/victoria-metrics/backup-s3-credentials",
        "/etc/victoria-metrics/backup-store-auth",
    },
    "prom01": {"/etc/prometheus/remote-write-password"},
    "prom02": {"/etc/prometheus/remote-write-password"},
}


def test_credentials_are_in_no_output_journal_or_other_file(
    deployed: Lab, extra: list[str], secret_values: list[str]
) -> None:
    inv = str(deployed.inventory_path)
    for args in (["inventory", "-i", inv], ["inventory", "-i", inv, "--output", "json"]):
        record(" ".join(args[:1]), gpumon(*args, *extra))
    record("restore --check", gpumon("restore", "-i", inv, *extra, "--check"))
    OUTPUTS.append(("lab s3 log", (deployed.dir / s3.LOG_FILE).read_text(errors="replace")))
    OUTPUTS.append(("lab inventory", deployed.inventory_path.read_text()))
    assert len(OUTPUTS) >= 6
    for what, text in OUTPUTS:
        for value in secret_values:
            assert value not in text, f"a secret in the output of {what}"
    group_vars = deployed.dir / s3.GROUP_VARS_FILE
    assert group_vars.stat().st_mode & 0o777 == 0o600

    grep = " ".join(f"-e {v!r}" for v in secret_values)
    for name, allowed in ALLOWED.items():
        journal = ssh_ok(deployed, name, "journalctl --no-pager -o cat", timeout=120)
        for value in secret_values:
            assert value not in journal, f"a secret in the journal of {name}"
        found = deployed.ssh(
            name,
            f"grep -rlF {grep} /etc /var/lib /var/log /usr/local /opt /root /tmp /home 2>/dev/null",
            timeout=300,
        ).stdout.split()
        assert set(found) <= allowed, (name, found)
        assert set(found) == allowed, (name, "expected secret files missing", found)
        modes = ssh_ok(deployed, name, "stat -c '%a %n' " + " ".join(sorted(allowed))).split("\n")
        assert all(m.startswith("600 ") for m in modes if m), modes


@pytest.fixture(scope="module", autouse=True)
def _report_outputs() -> Iterator[None]:
    yield
    OUTPUTS.clear()
