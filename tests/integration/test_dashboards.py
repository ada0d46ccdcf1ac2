"""Every panel of the generated dashboards, proven against the lab's real Prometheus replicas.

No Grafana runs here (none can be had): each panel's queries are sent as Grafana's Prometheus
datasource sends them (``deployer/monitoring/dashboards/proof.py``: the variables set to the
lab's values), to each datasource the grafana role would provision (both replicas; the global
view too once the inventory has one), and must return series carrying the labels their legends
name. Then faults are injected -- a hot GPU, an XID, a GPU fallen off the bus, an exporter
stopped, and a silence -- and the panels that should show them must. Every panel is drawn to PNG
from the same real results, healthy and faulted, and kept as an artifact of the run in
``$GPUMON_ARTIFACTS/dashboards`` (default ``/var/lib/gpumon-lab/<lab>/artifacts/dashboards``).

Runs on the session ``lab`` fixture. While developing, ``GPUMON_DASHBOARDS_LAB=<name>`` runs it
on a lab of that name that is already up.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployer.lab import Lab
from deployer.lab.paths import state_root
from deployer.monitoring import dashboards
from deployer.monitoring.dashboards import of_inventory, proof, render
from deployer.monitoring.dashboards.scope import Scope
from tests.integration.labtools import lab_named_by, run_cli, wait_until

pytestmark = pytest.mark.lab

# Short `for` so that the faults' alerts fire within the test (the thresholds stay the pack's).
RULE_VARS = {
    "prometheus_rules_gpu_temp_critical_for": "15s",
    "prometheus_rules_gpu_temp_warning_for": "30s",
    "prometheus_rules_gpu_missing_for": "15s",
}
RANGE_S = 900.0
# Panels that show nothing on a healthy lab, by design: they list what is wrong.
EMPTY_WHEN_HEALTHY = {
    ("gpumon-fleet", "Alerts firing by severity"),
    ("gpumon-fleet", "Alerts firing"),
    ("gpumon-operations", "XID errors (exporter window)"),
    ("gpumon-operations", "Clock-event (throttle) reasons"),
    ("gpumon-operations", "Alerts firing"),
}
HOT, XID, MISSING, DOWN = ("gpu01", 3), ("gpu02", 1), ("gpu04", 2), "gpu03"

gpumon = functools.partial(run_cli, timeout=1200)


@pytest.fixture(scope="module")
def dlab(request: pytest.FixtureRequest) -> Lab:
    return lab_named_by("GPUMON_DASHBOARDS_LAB", request)


@pytest.fixture(scope="module")
def extra_vars() -> list[str]:
    return [json.dumps(RULE_VARS)]


@pytest.fixture(scope="module")
def deployed(dlab: Lab, extra_vars: list[str]) -> None:
    args = [a for v in extra_vars for a in ("-e", v)]
    proc = gpumon("up", "-i", str(dlab.inventory_path), *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # The panels query what the replicas scraped and the store received: on a lab just brought
    # up, wait (bounded) until status says every target is scraped and every GPU in the view.
    ready = gpumon("status", "-i", str(dlab.inventory_path), *args, "--wait", "300")
    assert ready.returncode == 0, ready.stdout[-3000:] + ready.stderr[-3000:]


@pytest.fixture(scope="module")
def generated(dlab: Lab, extra_vars: list[str], deployed: None) -> tuple[Scope, dict[str, Any]]:
    return of_inventory.for_inventory(dlab.inventory_path, extra_vars)


@pytest.fixture(scope="module")
def artifacts(dlab: Lab) -> Path:
    base = os.environ.get("GPUMON_ARTIFACTS")
    root = Path(base) if base else state_root() / dlab.name / "artifacts"
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = root / "dashboards" / stamp
    out.mkdir(parents=True, exist_ok=True)
    return out


def datasources(scope: Scope) -> Iterator[tuple[str, proof.Prometheus]]:
    for ds in scope.datasources:
        yield ds.uid, proof.Prometheus(ds.url)


def values(scope: Scope, uid: str, **chosen: list[str]) -> proof.Values:
    picked: dict[str, list[str] | None] = dict(chosen)
    if uid == "gpumon-node" and "node" not in picked:
        picked["node"] = [scope.fleet.gpu_hosts[0]]
    if uid == "gpumon-mig" and "node" not in picked:
        picked["node"] = [scope.fleet.mig_hosts[0]]
    return proof.Values(picked, scope.default_datasource, 15.0, step_s=15.0, range_s=RANGE_S)


def results(scope: Scope, built: dict[str, Any], prom: proof.Prometheus, **chosen: list[str]):
    return {
        uid: {(r.target.panel, r.target.ref): r for r in proof.run(prom, uid, d, values(scope, uid, **chosen))}
        for uid, d in built.items()
    }  # fmt: skip


def last(series: dict[str, Any]) -> float:
    pairs = series.get("values") or [series["value"]]
    return float(pairs[-1][1])


def series_of(res: proof.Result, **labels: str) -> list[dict[str, Any]]:
    return [s for s in res.series if all(s["metric"].get(k) == v for k, v in labels.items())]


# ---------------------------------------------------------------- a healthy lab


def test_the_lab_inventory_gets_every_dashboard_mig_included(generated):
    scope, built = generated
    assert tuple(built) == dashboards.ALL_UIDS
    assert "gpumon-mig" in built and scope.fleet.mig_hosts == ("gpu05",)


def test_every_variable_lists_the_labs_values(dlab, generated):
    scope, built = generated
    models = {h.gpu_model for h in dlab.hosts if h.is_gpu}
    for uid, prom in datasources(scope):
        for dash_uid, d in built.items():
            v = values(scope, dash_uid)
            got = {
                name: prom.series_labels(proof.interpolate(match, d, v), label)
                for name, match, label in proof.variable_queries(d)
            }
            assert got["cluster"] == ["lab"], (uid, dash_uid)
            assert set(got["gpu_model"]) == models
            assert got["node"] == sorted(scope.fleet.gpu_hosts)
            if dash_uid == "gpumon-mig":
                assert set(got["mig_profile"]) == {"3g.40gb", "2g.20gb", "1g.10gb"}
            # no Slurm job mapping in this lab yet: the variable's query runs and finds none
            assert got.get("hpc_job", []) == []


def test_every_panel_returns_series_with_its_legends_labels_on_every_datasource(
    generated, artifacts
):
    scope, built = generated
    for uid, prom in datasources(scope):
        # the recording rules' first samples and rate windows: wait until the panels fill
        def filled(prom=prom) -> Any:
            got = results(scope, built, prom)
            empty = [
                (d, p, ref)
                for d, by in got.items()
                for (p, ref), r in by.items()
                if not r.series and (d, p) not in EMPTY_WHEN_HEALTHY
            ]
            return got if not empty else None

        got = wait_until(f"every panel with data on {uid}", filled, 240, every=15)
        for d, by in got.items():
            for (p, ref), r in by.items():
                assert r.error is None, (d, p, ref, r.error)
                assert r.missing_legend_labels == [], (d, p, ref, r.query)
        for d, dash in built.items():
            for t in proof.annotation_targets(d, dash):
                prom.range(
                    proof.interpolate(t.expr, dash, values(scope, d)),
                    time.time() - 60,
                    time.time(),
                    15,
                )
    dashboards_out = artifacts / "healthy"
    render.render_all(built, proof.Prometheus(scope.datasources[0].url), dashboards_out,
                      {u: values(scope, u) for u in built})  # fmt: skip
    assert len(list(dashboards_out.glob("*/*.png"))) == sum(
        1 for d in built.values() for p in d["panels"] if p["type"] != "row"
    )


def test_a_healthy_lab_counts_every_gpu_of_the_inventory(dlab, generated):
    scope, built = generated
    expected = sum(h.gpu_count for h in dlab.hosts if h.is_gpu)
    got = results(scope, built, proof.Prometheus(scope.datasources[0].url))["gpumon-fleet"]
    assert last(got[("GPUs in the inventory", "A")].series[0]) == expected
    assert last(got[("GPUs reporting", "A")].series[0]) == expected


def test_the_hbm_panel_has_no_line_for_a_board_without_a_memory_sensor(generated):
    scope, built = generated
    got = results(scope, built, proof.Prometheus(scope.datasources[0].url))["gpumon-operations"]
    hbm = got[("HBM memory temperature", "A")]
    assert not series_of(hbm, node="gpu06") and series_of(hbm, node="gpu01")


# ---------------------------------------------------------------- faults


def silence(dlab: Lab, minutes: int = 10) -> str:
    am = next(h for h in dlab.hosts if "alertmanager" in h.groups)
    now = datetime.datetime.now(datetime.UTC)
    body = json.dumps(
        {
            "matchers": [{"name": "node", "value": DOWN, "isRegex": False, "isEqual": True}],
            "startsAt": now.isoformat(),
            "endsAt": (now + datetime.timedelta(minutes=minutes)).isoformat(),
            "createdBy": "test_dashboards",
            "comment": "dashboards show the silences in force",
        }
    ).encode()
    req = urllib.request.Request(
        f"http://{am.address}:9093/api/v2/silences", data=body, method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=10) as resp:
        return json.loads(resp.read())["silenceID"]


def expire(dlab: Lab, silence_id: str) -> None:
    am = next(h for h in dlab.hosts if "alertmanager" in h.groups)
    req = urllib.request.Request(
        f"http://{am.address}:9093/api/v2/silence/{silence_id}", method="DELETE"
    )
    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=10).close()


@pytest.fixture(scope="module")
def faulted(dlab: Lab, generated, deployed) -> Iterator[None]:
    dlab.fault(HOT[0], "gpu-temp", gpu=HOT[1], value=99)
    dlab.fault(XID[0], "xid", gpu=XID[1], xid=79)
    dlab.fault(MISSING[0], "gpu-missing", gpu=MISSING[1])
    dlab.fault(DOWN, "exporter-down")
    sid = silence(dlab)
    try:
        yield
    finally:
        expire(dlab, sid)
        for host in (HOT[0], XID[0], MISSING[0], DOWN):
            dlab.heal(host)


def fault_results(scope: Scope, built: dict[str, Any]):
    return results(scope, built, proof.Prometheus(scope.datasources[0].url))


def test_the_faults_show_where_they_should(dlab, generated, faulted, artifacts):
    scope, built = generated
    r = scope.rules

    def shown() -> Any:
        got = fault_results(scope, built)
        ops, fleet = got["gpumon-operations"], got["gpumon-fleet"]
        hot = series_of(ops[("GPU die temperature", "A")], node=HOT[0], gpu=str(HOT[1]))
        xid = series_of(
            ops[("XID errors (exporter window)", "A")], node=XID[0], gpu=str(XID[1]), xid="79"
        )
        reporting = series_of(
            ops[("GPUs reporting per node vs the inventory", "A")], node=MISSING[0]
        )
        up = series_of(ops[("dcgm-exporter scrape", "A")], node=DOWN)
        silences = fleet[("Silences in force", "A")].series
        firing = fleet[("GPU alerts firing", "A")].series
        total_reporting = fleet[("GPUs reporting", "A")].series
        healthy = fleet[("GPUs healthy", "A")].series
        names = {
            s["metric"]["alertname"] for ref in "ABC" for s in ops[("Alerts firing", ref)].series
        }
        checks = {
            "hot GPU above the red line": bool(hot) and last(hot[0]) >= r.gpu_temp_critical,
            "XID 79 on its GPU": bool(xid) and last(xid[0]) >= 1,
            "one GPU fewer reporting on its node": bool(reporting)
            and last(reporting[0]) == dlab.topology.host(MISSING[0]).gpu_count - 1,
            "the stopped exporter down": bool(up) and last(up[0]) == 0,
            "a silence in force": bool(silences) and last(silences[0]) >= 1,
            "the hot GPU and the XID alerting": bool(firing) and last(firing[0]) >= 2,
            "GPUs reporting: all but the lost": bool(total_reporting)
            and last(total_reporting[0]) == total - lost,
            "GPUs healthy: without the alerting": bool(healthy)
            and last(healthy[0]) <= total - lost - 2,
            "the alerts on the timeline": {"GPUTemperatureCritical", "GPUXidCritical", "GPUMissing"}
            <= names,
        }
        state["missing"] = [k for k, v in checks.items() if not v]
        return got if not state["missing"] else None

    total = sum(h.gpu_count for h in dlab.hosts if h.is_gpu)
    lost = dlab.topology.host(DOWN).gpu_count + 1  # an exporter down, one GPU gone
    state: dict[str, Any] = {}
    try:
        got = wait_until("every fault on its panel", shown, 300, every=15)
    except pytest.fail.Exception:
        pytest.fail(f"not shown within 300s: {state.get('missing')}")
    fleet = got["gpumon-fleet"]
    table = fleet[("Alerts firing", "A")]
    assert series_of(table, alertname="GPUTemperatureCritical", node=HOT[0], gpu=str(HOT[1]))
    for d, by in got.items():
        for key, res in by.items():
            assert res.error is None and res.missing_legend_labels == [], (d, key, res.query)
    # the alerts and the silence on the time axis
    dash = built["gpumon-operations"]
    prom = proof.Prometheus(scope.datasources[0].url)
    firing_ann, silence_ann = proof.annotation_targets("gpumon-operations", dash)
    v = values(scope, "gpumon-operations")
    now = time.time()
    assert prom.range(proof.interpolate(firing_ann.expr, dash, v), now - 300, now, 15)
    assert prom.range(proof.interpolate(silence_ann.expr, dash, v), now - 300, now, 15)
    # the drill-down on the hot GPU's host: above its alert's red line
    node = results(scope, built, prom, node=[HOT[0]])["gpumon-node"]
    die = series_of(node[("Die and HBM temperature", "A")], gpu=str(HOT[1]))
    assert die and last(die[0]) >= r.gpu_temp_critical
    out = artifacts / "faults"
    render.render_all(built, prom, out, {u: values(scope, u) for u in built})
    render.render_all(
        {"gpumon-node": built["gpumon-node"]}, prom, out / "hot-node",
        {"gpumon-node": values(scope, "gpumon-node", node=[HOT[0]])},
    )  # fmt: skip
    assert (out / "gpumon-operations.png").is_file()
