"""``gpumon-deploy status``: the running monitoring stack checked through its HTTP APIs.

What should be running comes from the inventory and the roles' variables (``expect``); what is
running comes from the APIs (``collect``), fetched from the controller, only at the inventory
hosts' addresses. The result is one list of checks (one table); any failed check makes the
command exit 1 and names the host and what is wrong.

``collect`` takes the fetch function as an argument, so the table logic is tested on canned API
answers (tests/unit/test_monitoring_status.py) and run for real against the lab.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deployer import file_sd
from deployer.errors import InputError
from deployer.file_sd import Target, truthy

RULE_FILES = ("gpu-alerts.yml", "gpu-recording.yml", "meta-alerts.yml")
HTTP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Response:
    """One HTTP answer (status 0 and ``error`` set when there was no answer at all)."""

    status: int
    body: str = ""
    error: str | None = None

    def json(self) -> Any:
        return json.loads(self.body)


Fetch = Callable[[str], Response]


@dataclass(frozen=True)
class Replica:
    host: str
    url: str  # http://address:port
    replica: str
    cluster: str
    replica_label: str
    cluster_label: str


@dataclass(frozen=True)
class Peer:
    host: str
    url: str
    cluster_address: str  # the advertise address:port the other peers know it by


@dataclass(frozen=True)
class Endpoint:
    host: str
    url: str


@dataclass
class StackExpectation:
    """What the inventory says should be running."""

    replicas: list[Replica] = field(default_factory=list)
    alertmanagers: list[Peer] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    gpus: dict[str, int] = field(default_factory=dict)
    gpu_metric: str = "DCGM_FI_DEV_GPU_TEMP"
    thanos_active: bool = False
    thanos_sidecars: list[Endpoint] = field(default_factory=list)
    thanos_queries: list[Endpoint] = field(default_factory=list)
    thanos_stores: list[str] = field(default_factory=list)  # sidecar gRPC host:port
    store: Any = None  # deployer/status_store.py: long-term store, remote write, global view


@dataclass(frozen=True)
class Check:
    component: str
    host: str
    check: str
    ok: bool
    detail: str = ""


# ---------------------------------------------------------------- expectation from the inventory


def expect(
    prometheus_vars: Mapping[str, Mapping[str, Any]],
    alertmanager_vars: Mapping[str, Mapping[str, Any]],
    query_vars: Mapping[str, Mapping[str, Any]],
) -> StackExpectation:
    """The expected stack from each role host's resolved variables (role defaults included):
    ``prometheus_vars[host]`` for the hosts of the Prometheus play, and so on."""
    exp = StackExpectation()
    first: Mapping[str, Any] | None = None
    for host, v in prometheus_vars.items():
        first = first or v
        address = str(v.get("ansible_host", host))
        exp.replicas.append(
            Replica(
                host=host,
                url=f"http://{address}:{v['prometheus_port']}",
                replica=str(v["prometheus_replica"]),
                cluster=str(v["prometheus_cluster"]),
                replica_label=str(v["prometheus_replica_label"]),
                cluster_label=str(v["prometheus_cluster_label"]),
            )
        )
        if truthy(v["prometheus_thanos_sidecar"]):
            exp.thanos_active = True
            exp.thanos_sidecars.append(
                Endpoint(host, f"http://{address}:{v['prometheus_thanos_sidecar_http_port']}")
            )
            exp.thanos_stores.append(f"{address}:{v.get('thanos_sidecar_grpc_port', 10901)}")
    if first is not None:
        exp.targets = file_sd.expected_targets(first)
        hostvars = first["hostvars"]
        for node in file_sd.members(first, [first["prometheus_gpu_group"]]):
            count = hostvars[node].get("gpu_count")
            if count is not None:
                exp.gpus[node] = int(count)
    for host, v in alertmanager_vars.items():
        address = str(v.get("ansible_host", host))
        exp.alertmanagers.append(
            Peer(
                host=host,
                url=f"http://{address}:{v['alertmanager_port']}",
                cluster_address=f"{v['alertmanager_advertise_address']}:{v['alertmanager_cluster_port']}",
            )
        )
    for host, v in query_vars.items():
        if truthy(v["thanos_active"]):
            exp.thanos_active = True
            address = str(v.get("ansible_host", host))
            exp.thanos_queries.append(
                Endpoint(host, f"http://{address}:{v['thanos_query_http_port']}")
            )
    return exp


# ---------------------------------------------------------------- the checks


def _get_json(fetch: Fetch, url: str) -> tuple[Any, str | None]:
    r = fetch(url)
    if r.error is not None:
        return None, r.error
    if r.status != 200:
        return None, f"HTTP {r.status} from {url}"
    try:
        return r.json(), None
    except ValueError:
        return None, f"not JSON from {url}"


def _query(fetch: Fetch, base: str, promql: str) -> tuple[list[dict[str, Any]] | None, str | None]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    data, err = _get_json(fetch, url)
    if err is not None:
        return None, err
    if data.get("status") != "success":
        return None, f"query {promql!r} failed: {data.get('error', data)}"
    return data["data"]["result"], None


def _ready(fetch: Fetch, url: str) -> tuple[bool, str]:
    r = fetch(f"{url}/-/ready")
    if r.error is not None:
        return False, r.error
    return r.status == 200, "" if r.status == 200 else f"/-/ready answered HTTP {r.status}"


@dataclass
class _ReplicaResult:
    checks: list[Check]
    ready: bool
    labels: dict[str, str] | None = None
    gpus: dict[str, int] | None = None


def check_replica(exp: StackExpectation, rep: Replica, fetch: Fetch) -> _ReplicaResult:
    comp = "prometheus"
    ok, why = _ready(fetch, rep.url)
    checks = [Check(comp, rep.host, "ready", ok, why or f"{rep.url}/-/ready")]
    if not ok:
        return _ReplicaResult(checks, ready=False)
    result = _ReplicaResult(checks, ready=True)

    # external labels, from the config the replica actually loaded
    data, err = _get_json(fetch, f"{rep.url}/api/v1/status/config")
    if err is None:
        loaded = yaml.safe_load(data["data"]["yaml"]) or {}
        labels = {
            str(k): str(v)
            for k, v in ((loaded.get("global") or {}).get("external_labels") or {}).items()
        }
        result.labels = labels
        wrong = [
            f"{name}={labels.get(name)!r} (want {want!r})"
            for name, want in ((rep.replica_label, rep.replica), (rep.cluster_label, rep.cluster))
            if labels.get(name) != want
        ]
        checks.append(
            Check(
                comp,
                rep.host,
                "external labels",
                not wrong,
                "; ".join(wrong) or ", ".join(f"{k}={v}" for k, v in sorted(labels.items())),
            )
        )
    else:
        checks.append(Check(comp, rep.host, "external labels", False, err))

    # rules loaded
    data, err = _get_json(fetch, f"{rep.url}/api/v1/rules")
    if err is None:
        groups = data["data"]["groups"]
        files = {Path(g["file"]).name for g in groups}
        missing = [f for f in RULE_FILES if f not in files]
        broken = [
            r["name"]
            for g in groups
            for r in g["rules"]
            if r.get("health") not in (None, "ok", "unknown")
        ]
        n_rules = sum(len(g["rules"]) for g in groups)
        problems = []
        if missing:
            problems.append(f"rule files not loaded: {', '.join(missing)}")
        if broken:
            problems.append(f"rules failing to evaluate: {', '.join(sorted(set(broken)))}")
        checks.append(
            Check(
                comp,
                rep.host,
                "rules loaded",
                not problems,
                "; ".join(problems) or f"{n_rules} rules in {len(groups)} groups",
            )
        )
    else:
        checks.append(Check(comp, rep.host, "rules loaded", False, err))

    # every expected target scraped: up per job and instance
    result_up, err = _query(fetch, rep.url, "up")
    if err is None:
        up = {
            (s["metric"].get("job"), s["metric"].get("instance")): s["value"][1] for s in result_up
        }
        by_job: dict[str, list[Target]] = {}
        for t in exp.targets:
            by_job.setdefault(t.job, []).append(t)
        for job, targets in by_job.items():
            down = [t for t in targets if up.get((t.job, t.instance)) == "0"]
            absent = [t for t in targets if (t.job, t.instance) not in up]
            bad = [f"{t.node} ({t.instance}) down" for t in down] + [
                f"{t.node} ({t.instance}) not scraped" for t in absent
            ]
            checks.append(
                Check(
                    comp,
                    rep.host,
                    f"scraping job {job}",
                    not bad,
                    "; ".join(bad) or f"{len(targets)}/{len(targets)} up",
                )
            )
    else:
        checks.append(Check(comp, rep.host, "scraping", False, err))

    # GPUs present in the exporters' metrics
    if exp.gpus:
        promql = f'count by (node) ({exp.gpu_metric}{{job="dcgm"}})'
        series, err = _query(fetch, rep.url, promql)
        if err is None:
            result.gpus = {s["metric"].get("node", ""): int(float(s["value"][1])) for s in series}
        else:
            checks.append(Check(comp, rep.host, "GPU metrics", False, err))
    return result


def check_alertmanager(exp: StackExpectation, peer: Peer, fetch: Fetch) -> list[Check]:
    comp = "alertmanager"
    data, err = _get_json(fetch, f"{peer.url}/api/v2/status")
    if err is not None:
        return [Check(comp, peer.host, "cluster ready with every peer", False, err)]
    cluster = data.get("cluster") or {}
    status = cluster.get("status")
    seen = {p.get("address") for p in cluster.get("peers") or []}
    want = {p.cluster_address for p in exp.alertmanagers}
    problems = []
    if status != "ready":
        problems.append(f"cluster status {status!r}")
    if want - seen:
        problems.append(f"peers missing: {', '.join(sorted(want - seen))}")
    if seen - want:
        problems.append(f"unexpected peers: {', '.join(sorted(a for a in seen - want if a))}")
    return [
        Check(
            comp,
            peer.host,
            "cluster ready with every peer",
            not problems,
            "; ".join(problems) or f"ready, {len(seen)}/{len(want)} peers",
        )
    ]


def collect(
    exp: StackExpectation, fetch: Fetch, *, workers: int = 16, store_fetch: Any = None
) -> list[Check]:
    """Every check of the running stack, in table order."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        replica_jobs = [pool.submit(check_replica, exp, r, fetch) for r in exp.replicas]
        am_jobs = [pool.submit(check_alertmanager, exp, p, fetch) for p in exp.alertmanagers]
        thanos_jobs = [
            (kind, e, pool.submit(_ready, fetch, e.url))
            for kind, endpoints in (
                ("thanos sidecar", exp.thanos_sidecars),
                ("thanos query", exp.thanos_queries),
            )
            for e in endpoints
        ]
        replicas = [j.result() for j in replica_jobs]
        checks: list[Check] = [c for r in replicas for c in r.checks]

        if exp.replicas:
            checks.append(_distinct_labels(exp, replicas))
            if exp.gpus:
                checks.extend(_gpu_checks(exp, replicas))
        for j in am_jobs:
            checks.extend(j.result())
        if not exp.thanos_active:
            checks.append(
                Check(
                    "thanos",
                    "-",
                    "deployed",
                    True,
                    "not deployed (thanos_enabled false, or auto with no Thanos archive configured)",
                )
            )
        for kind, e, job in thanos_jobs:
            ok, why = job.result()
            checks.append(Check(kind, e.host, "ready", ok, why or f"{e.url}/-/ready"))
            if ok and kind == "thanos query":
                checks.append(check_query_stores(exp, e, fetch))
    from deployer import status_store

    checks.extend(status_store.collect(exp.store, store_fetch or status_store.http_fetch))
    return checks


def check_query_stores(exp: StackExpectation, query: Endpoint, fetch: Fetch) -> Check:
    """Every sidecar is a healthy store of this Query (``/api/v1/stores``, the API behind the
    Query UI's Stores page: ``{"data": {"<type>": [{"name": "host:port", "lastError": ...}]}}``;
    the shape is from Thanos' UI code, not checked against a running Thanos here)."""
    data, err = _get_json(fetch, f"{query.url}/api/v1/stores")
    if err is not None:
        return Check("thanos query", query.host, "every sidecar a store", False, err)
    healthy = {
        s.get("name")
        for stores in (data.get("data") or {}).values()
        for s in stores or []
        if not s.get("lastError")
    }
    missing = [a for a in exp.thanos_stores if a not in healthy]
    return Check(
        "thanos query",
        query.host,
        "every sidecar a store",
        not missing,
        f"not healthy stores: {', '.join(missing)}"
        if missing
        else f"{len(exp.thanos_stores)}/{len(exp.thanos_stores)} sidecars",
    )


def _distinct_labels(exp: StackExpectation, replicas: list[_ReplicaResult]) -> Check:
    seen: dict[tuple[tuple[str, str], ...], list[str]] = {}
    unknown = []
    for rep, res in zip(exp.replicas, replicas, strict=True):
        if res.labels is None:
            unknown.append(rep.host)
            continue
        seen.setdefault(tuple(sorted(res.labels.items())), []).append(rep.host)
    clashes = [hosts for hosts in seen.values() if len(hosts) > 1]
    if clashes:
        detail = "; ".join(f"{' and '.join(h)} have identical external labels" for h in clashes)
        return Check("prometheus", "*", "external labels distinct", False, detail)
    # A replica that did not answer already has its own failed row; compare the others.
    note = f" (not compared: {', '.join(unknown)})" if unknown else ""
    return Check("prometheus", "*", "external labels distinct", True, f"{len(seen)} replicas{note}")


def _gpu_checks(exp: StackExpectation, replicas: list[_ReplicaResult]) -> list[Check]:
    out = []
    for node, want in exp.gpus.items():
        problems = []
        for rep, res in zip(exp.replicas, replicas, strict=True):
            if res.gpus is None:
                continue  # not ready or query failed: already a failed row of that replica
            have = res.gpus.get(node, 0)
            if have != want:
                problems.append(f"{rep.host} sees {have}")
        checked = sum(1 for r in replicas if r.gpus is not None)
        if checked == 0:
            problems.append("no replica could be asked")
        out.append(
            Check(
                "gpus",
                node,
                f"{want} GPUs in the exporter's metrics",
                not problems,
                "; ".join(problems) or f"{want}/{want} on {checked} replica(s)",
            )
        )
    return out


# ---------------------------------------------------------------- HTTP and presentation


def http_fetch(url: str, timeout: float = HTTP_TIMEOUT_S) -> Response:
    """GET ``url`` directly (no proxy from the environment), never raising."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            return Response(resp.status, resp.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as exc:
        return Response(exc.code, exc.read().decode("utf-8", "replace"))
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return Response(0, error=f"no answer from {url}: {reason}")


def failures(checks: list[Check]) -> list[Check]:
    return [c for c in checks if not c.ok]


def to_json(checks: list[Check]) -> dict[str, Any]:
    return {
        "ok": not failures(checks),
        "checks": [asdict(c) for c in checks],
        "failed": [asdict(c) for c in failures(checks)],
    }


def table(checks: list[Check]) -> str:
    rows = [("COMPONENT", "HOST", "CHECK", "RESULT", "DETAIL")] + [
        (c.component, c.host, c.check, "ok" if c.ok else "FAILED", c.detail) for c in checks
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] for r in rows)


# ---------------------------------------------------------------- from an inventory file


def load_expectation(
    inventory: Path, extra_vars: list[str] | None = None, site: Path | None = None
) -> StackExpectation:
    """The expectation for an inventory: each role host's variables resolved as ``up`` resolves
    them (the site's plays, role defaults < group < host < extra vars). Touches no host."""
    from deployer.hostpattern import NoHostsMatched, select
    from deployer.plan import Planner
    from deployer.roles import load_site
    from deployer.session import (
        DEFAULT_ROLES,
        DEFAULT_SITE,
        SHARED_TEMPLATES,
        DeploySession,
        RunOptions,
        validation_facts,
    )

    session = DeploySession.load(
        RunOptions(inventory=inventory, extra_vars=list(extra_vars or [])), plan=False
    )
    plays = load_site(site or DEFAULT_SITE)
    roles_path = [DEFAULT_ROLES] if site is None else [site.parent / "roles", DEFAULT_ROLES]
    planner = Planner(session.inventory, roles_path, SHARED_TEMPLATES)

    def variables_of(role: str) -> dict[str, Mapping[str, Any]]:
        play = next((p for p in plays if role in p.roles), None)
        if play is None:
            return {}
        try:
            hosts = [h.name for h in select(session.inventory, play.hosts)]
        except NoHostsMatched:
            return {}
        out: dict[str, Mapping[str, Any]] = {}
        for h in hosts:
            planner.extra_context = {"facts": validation_facts(h).to_json()}
            out[h] = planner.host_vars(h, play)
        return out

    exp = expect(
        variables_of("prometheus"), variables_of("alertmanager"), variables_of("thanos_query")
    )
    from deployer import status_store

    exp.store = status_store.expect(variables_of)
    if not exp.replicas and not exp.alertmanagers:
        raise InputError(
            "no host of the inventory is in a Prometheus or Alertmanager play of the site: "
            "nothing to check",
            source=str(inventory),
        )
    return exp
