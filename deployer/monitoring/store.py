"""``status`` checks of the long-term store, the replicas' remote write and the global view.

What should be there comes from the roles' variables (``expect``); what is there from HTTP:

- each store host answers ``/health`` and runs with the deduplication interval the inventory
  says (``/flags``, which VictoriaMetrics serves without credentials and with secret flags
  hidden: v1.79.5 lib/httpserver/httpserver.go:301-307, lib/flagutil/secret.go);
- each replica's queue to each store is no further behind than ``prometheus_remote_write_max_lag``,
  read from the replica's own ``/metrics`` (prometheus/prometheus v2.42.0, commit
  225c61122d88b01d1f0eaaee0e05b6f3e0567ac0: ``prometheus_remote_storage_highest_timestamp_in_seconds``,
  storage/remote/write.go:95-101, the newest sample appended; and
  ``prometheus_remote_storage_queue_highest_sent_timestamp_seconds{remote_name,url}``,
  storage/remote/queue_manager.go:218-226, the newest sample the store accepted; their difference
  is the lag, as the prometheus-mixin's PrometheusRemoteWriteBehind alert computes it;
  ``..._samples_pending`` and ``..._shards`` are shown beside it);
- the global view (the store, or Thanos Query) answers, returns every GPU of the inventory
  exactly once (one series per ``UUID``: a second one means the pair was not deduplicated) and
  covers every cluster the inventory names.

Requests to the store and the view carry its basic-auth credentials when they are set; no check
detail ever contains them. ``collect`` takes the fetch function (``url, headers -> Response``) as an
argument, so the checks are tested on canned answers (tests/unit/test_status_store.py) and run on
the one HTTP client (``deployer.monitoring.http.http_fetch``) for real.
"""

from __future__ import annotations

import re
import time
import urllib.parse
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import yaml

from deployer import dcgm_fields, rule_pack
from deployer.monitoring import federation, file_sd, remote_write
from deployer.monitoring.check import PENDING, Check
from deployer.monitoring.http import Response, basic_auth, without_query
from deployer.tls import material as tls_material

# url, headers -> Response
Fetch = Callable[[str, Mapping[str, str]], Response]

GPU_METRIC = dcgm_fields.metric("gpu_temp")
# What tells one GPU series from another in the global view: the GPU, its MIG instance (the
# exporter's per-instance series, dcgm_fields.MIG_LABELS) and the job on it (rule_pack.JOB_LABEL).
SERIES_IDENTITY = ", ".join(("node", "UUID", "GPU_I_ID", rule_pack.JOB_LABEL))
# How long the global view keeps returning a series after its last sample: an instant query of
# VictoriaMetrics looks back its default step, 5 minutes (docs.victoriametrics.com/query-stats:
# an instant query logged with step_ms=300000), from 30 s ago (-search.latencyOffset); on the lab
# (1.79.5) a series 331 s past its last sample was still returned. Prometheus' lookback delta is
# 5 minutes too. A GPU whose host moved to another shard, written with the shard label (before
# remote_write.py dropped it from a host's own series), is seen under both shard labels that long.
VIEW_LOOKBACK_S = 330


def per_gpu_query(shard_label: str) -> str:
    """The global view's GPU series counted per GPU (``SERIES_IDENTITY``) and shard."""
    return f"count by ({SERIES_IDENTITY}, {shard_label}) ({GPU_METRIC})"


# A replica that started this recently may not have sent anything yet.
STARTUP_GRACE_S = 120.0


@dataclass(frozen=True)
class Store:
    host: str
    url: str  # scheme://address:port
    dedup_interval: str
    retention: str


@dataclass(frozen=True)
class Writer:
    """One replica and the store queues it must have."""

    host: str
    url: str  # the replica's http://address:port
    queues: dict[str, str]  # remote_write url -> store host
    max_lag_s: float


@dataclass
class StoreExpectation:
    stores: list[Store] = field(default_factory=list)
    writers: list[Writer] = field(default_factory=list)
    view: str = "none"  # victoriametrics | thanos | none
    view_url: str = ""
    gpus: dict[str, int] = field(default_factory=dict)
    # cluster -> its GPU nodes (a cluster all of whose nodes a rollout has away is pending)
    cluster_nodes: dict[str, set[str]] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # store credentials (never shown)
    scrape_interval: str = ""
    shard_label: str = "shard"  # the replicas' external label of their shard
    backups: dict[str, float] = field(default_factory=dict)  # store host -> interval, seconds
    # GPU node -> why, for the hosts a driven rollout has out of service (status fills it each
    # round: deployer/monitoring/rollouts.py ``out_of_service_now``)
    out_of_service: dict[str, str] = field(default_factory=dict)

    @property
    def clusters(self) -> set[str]:
        """The clusters the GPU series carry (``count by (cluster)`` must show each)."""
        return set(self.cluster_nodes)

    @property
    def active(self) -> bool:
        return bool(self.stores or self.writers or self.view != "none")


VariablesOf = Callable[[str], Mapping[str, Mapping[str, Any]]]


def expect(variables_of: VariablesOf) -> StoreExpectation:
    """The expectation from each role's hosts' variables (``variables_of(role)``)."""
    exp = StoreExpectation()
    store_vars = variables_of("victoriametrics")
    # the shard replicas write to the store; a global replica never does (federation.py)
    prom_vars, _ = federation.split(variables_of("prometheus"))
    for host, v in store_vars.items():
        exp.stores.append(
            Store(
                host=host,
                url=f"{v['metrics_store_scheme']}://{v.get('ansible_host', host)}:{v['metrics_store_port']}",
                dedup_interval=str(v["victoriametrics_dedup_min_scrape_interval"]),
                retention=str(v["victoriametrics_retention_period"]),
            )
        )
        if file_sd.truthy(v["victoriametrics_backup_enabled"]):
            exp.backups[host] = timespan_seconds(v["victoriametrics_backup_interval"])
    first = next(iter(prom_vars.values()), None)
    if first is None:
        return exp
    exp.scrape_interval = str(first["prometheus_scrape_interval"])
    exp.shard_label = str(first.get("prometheus_shard_label") or exp.shard_label)
    if remote_write.auth_enabled(first):
        exp.headers = basic_auth(first["metrics_store_username"], first["metrics_store_password"])
    # not with gpumon_global_tier: federation (deployer/monitoring/federation.py)
    hosts = remote_write.store_hosts(first) if remote_write.writes_to_store(first) else []
    queues = {remote_write.store_write_url(first, h): h for h in hosts}
    max_lag = remote_write.seconds(first["prometheus_remote_write_max_lag"])
    for host, v in prom_vars.items():
        address = v.get("ansible_host", host)
        exp.writers.append(
            Writer(
                host,
                f"{tls_material.scheme(v)}://{address}:{v['prometheus_port']}",
                queues,
                max_lag,
            )
        )
    hostvars = first["hostvars"]
    for node in file_sd.members(first, [first["prometheus_gpu_group"]]):
        hv = hostvars[node]
        if hv.get("gpu_count") is not None:
            exp.gpus[node] = int(hv["gpu_count"])
        # The GPU series' cluster: the target label when the host has one, else the replicas'
        # external label (external labels never replace a series' own label).
        cluster = str(hv.get("cluster") or first["prometheus_cluster"])
        exp.cluster_nodes.setdefault(cluster, set()).add(node)
    exp.view, exp.view_url = _global_view(first, store_vars, variables_of("thanos_query"))
    return exp


def _global_view(
    prom: Mapping[str, Any],
    stores: Mapping[str, Mapping[str, Any]],
    queries: Mapping[str, Mapping[str, Any]],
) -> tuple[str, str]:
    """Which global view the inventory chooses (``gpumon_global_view``) and its URL."""
    choice = str(prom["gpumon_global_view"]).strip().lower()
    thanos = {h: v for h, v in queries.items() if file_sd.truthy(v["thanos_active"])}
    if choice == "auto":
        choice = "thanos" if thanos else "victoriametrics" if stores else "none"
    if choice not in ("thanos", "victoriametrics", "none"):
        from deployer.errors import InputError

        raise InputError(
            f"gpumon_global_view must be auto, victoriametrics, thanos or none, not {choice!r}",
            key="gpumon_global_view",
        )
    override = str(prom.get("gpumon_global_view_url") or "")
    if choice == "none":
        return "none", ""
    if override:
        return choice, override.rstrip("/")
    if choice == "thanos":
        if not thanos:
            return "thanos", ""
        host, v = next(iter(thanos.items()))
        return (
            "thanos",
            f"{tls_material.scheme(v)}://{v.get('ansible_host', host)}:{v['thanos_query_http_port']}",
        )
    if not stores:
        return "victoriametrics", ""
    host = next(iter(stores))
    return "victoriametrics", remote_write.store_base_url(prom, host)


_TIMESPAN = re.compile(
    r"(\d+)\s*(us|ms|seconds|second|sec|s|minutes|minute|min|m|hours|hour|hr|h|days|day|d|weeks|week|w)?"
)
_SPAN_UNITS = {
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1,
    "sec": 1,
    "second": 1,
    "seconds": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "minutes": 60,
    "h": 3600,
    "hr": 3600,
    "hour": 3600,
    "hours": 3600,
    "d": 86400,
    "day": 86400,
    "days": 86400,
    "w": 604800,
    "week": 604800,
    "weeks": 604800,
}


def timespan_seconds(span: Any) -> float:
    """A systemd time span (``1h``, ``30min``, ``1h 30min``, ``3600``) in seconds."""
    text = str(span).strip()
    parts = _TIMESPAN.findall(text)
    if not parts or not re.fullmatch(r"(\s*\d+\s*[a-z]*)+\s*", text):
        raise ValueError(f"not a systemd time span: {span!r}")
    return sum(int(n) * _SPAN_UNITS[u or "s"] for n, u in parts)


# ---------------------------------------------------------------- the checks


def _json(fetch: Fetch, url: str, headers: Mapping[str, str]) -> tuple[Any, str | None]:
    r = fetch(url, headers)
    if r.error is not None:
        return None, r.error
    if r.status != 200:
        return None, f"HTTP {r.status} from {without_query(url)}"
    try:
        return r.json(), None
    except ValueError:
        return None, f"not JSON from {without_query(url)}"


def query(
    fetch: Fetch, base: str, promql: str, headers: Mapping[str, str]
) -> tuple[list[dict[str, Any]] | None, str | None]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    data, err = _json(fetch, url, headers)
    if err is not None:
        return None, err
    if data.get("status") != "success":
        return None, f"query {promql!r} failed: {data.get('error', data)}"
    return data["data"]["result"], None


def check_store(exp: StoreExpectation, store: Store, fetch: Fetch) -> list[Check]:
    comp = "metrics store"
    r = fetch(f"{store.url}/health", {})
    if r.error is not None or r.status != 200:
        why = r.error or f"/health answered HTTP {r.status}"
        return [Check.of(comp, store.host, "healthy", False, why)]
    checks = [Check.of(comp, store.host, "healthy", True, f"{store.url}/health")]
    r = fetch(f"{store.url}/flags", {})
    flags = dict(re.findall(r'^-([\w.]+)="(.*)"$', r.body, re.M)) if r.status == 200 else {}
    dedup = flags.get("dedup.minScrapeInterval")
    loaded = _loaded_intervals(exp, fetch)
    if dedup is None:
        ok, detail = False, f"no dedup.minScrapeInterval in {store.url}/flags"
    elif not _same_duration(dedup, store.dedup_interval):
        ok, detail = (
            False,
            f"dedup.minScrapeInterval={dedup}, the inventory says {store.dedup_interval}",
        )
    elif other := {h: i for h, i in loaded.items() if not _same_duration(i, store.dedup_interval)}:
        # The inventory's interval never reached the replicas (a refused config, a failed run).
        running = ", ".join(f"{h} {i}" for h, i in sorted(other.items()))
        ok, detail = (
            False,
            f"dedup.minScrapeInterval={dedup} but the replicas scrape every: {running}",
        )
    else:
        every = ", ".join(sorted(set(loaded.values()))) or exp.scrape_interval
        ok = True
        detail = (
            f"dedup.minScrapeInterval={dedup} (replicas scrape every {every}), "
            f"retentionPeriod={flags.get('retentionPeriod')}"
        )
    checks.append(Check.of(comp, store.host, "deduplicates the pair", ok, detail))
    return checks


def _loaded_intervals(exp: StoreExpectation, fetch: Fetch) -> dict[str, str]:
    """Each answering replica's global scrape_interval, from the config it has loaded."""
    out = {}
    for w in exp.writers:
        data, err = _json(fetch, f"{w.url}/api/v1/status/config", {})
        if err is not None or not isinstance(data, dict):
            continue  # a replica that does not answer has its own failed rows
        try:
            loaded = yaml.safe_load(data["data"]["yaml"]) or {}
            out[w.host] = str((loaded.get("global") or {})["scrape_interval"])
        except (KeyError, TypeError, yaml.YAMLError):
            continue
    return out


def _same_duration(a: str, b: str) -> bool:
    try:
        return remote_write.seconds(a) == remote_write.seconds(b)
    except ValueError:
        return a == b


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)", re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str, names: set[str]) -> list[tuple[str, dict[str, str], float]]:
    """The samples of ``names`` in a Prometheus text exposition."""
    out = []
    for m in _SAMPLE.finditer(text):
        if m["name"] not in names:
            continue
        labels = dict(_LABEL.findall(m["labels"] or ""))
        try:
            out.append((m["name"], labels, float(m["value"])))
        except ValueError:
            continue
    return out


RW = "prometheus_remote_storage_"
_RW_NAMES = {
    RW + "highest_timestamp_in_seconds",
    RW + "queue_highest_sent_timestamp_seconds",
    RW + "samples_pending",
    RW + "shards",
    "process_start_time_seconds",
}


def check_writer(
    exp: StoreExpectation, writer: Writer, fetch: Fetch, now: float | None = None
) -> list[Check]:
    """The replica's remote-write lag to every store (from its own /metrics)."""
    comp = "remote write"
    if not writer.queues:
        return []
    r = fetch(f"{writer.url}/metrics", {})
    if r.error is not None or r.status != 200:
        why = r.error or f"/metrics answered HTTP {r.status}"
        return [Check.of(comp, writer.host, f"to {h}", False, why) for h in writer.queues.values()]
    samples = parse_metrics(r.body, _RW_NAMES)
    newest = next((v for n, _, v in samples if n == RW + "highest_timestamp_in_seconds"), None)
    started = next((v for n, _, v in samples if n == "process_start_time_seconds"), None)
    by_url: dict[str, dict[str, float]] = {}
    for name, labels, value in samples:
        if "url" in labels:
            by_url.setdefault(labels["url"], {})[name.removeprefix(RW)] = value
    young = started is not None and (now or time.time()) - started < STARTUP_GRACE_S

    def judged(name: str, ok: bool, detail: str) -> Check:
        # A replica that just started has not sent, or caught up, yet: pending, not failed.
        if not ok and young:
            return Check(comp, writer.host, name, PENDING, f"{detail} (replica just started)")
        return Check.of(comp, writer.host, name, ok, detail)

    checks = []
    for url, host in writer.queues.items():
        queue = by_url.get(url)
        name = f"to {host}"
        if queue is None or "queue_highest_sent_timestamp_seconds" not in queue:
            checks.append(judged(name, False, f"no remote_write queue to {url}"))
            continue
        sent = queue["queue_highest_sent_timestamp_seconds"]
        extra = (
            f"shards {queue.get('shards', 0):.0f}, pending {queue.get('samples_pending', 0):.0f}"
        )
        if sent <= 0:
            checks.append(judged(name, False, f"nothing sent yet ({extra})"))
            continue
        lag = max(0.0, (newest or sent) - sent)
        ok = lag <= writer.max_lag_s
        detail = f"lag {lag:.0f}s ({extra})"
        if not ok:
            detail = f"lag {lag:.0f}s, more than {writer.max_lag_s:.0f}s ({extra})"
        checks.append(judged(name, ok, detail))
    return checks


def _every_gpu_once(
    exp: StoreExpectation, fetch: Fetch, h: Mapping[str, str]
) -> tuple[Check, str | None]:
    """One series per GPU and, on a MIG GPU, per GPU instance, and with job mapping per job on it.
    More than one under one shard label is the pair not deduplicated (a replica label kept):
    failed. A host's own series reach the store without the shard label (remote_write.py), so a
    host that moved to another shard is one series; one under each of two shard labels is a
    moved host's series written with the label (before that release, or by another writer): the
    old shard's series stays in the view's lookback (``VIEW_LOOKBACK_S``) after its last sample,
    so pending; two shards scraping one host for longer is the shard rows' failure
    (deployer/monitoring/checks_shards.py). Fewer GPUs only of hosts a driven rollout has out
    of service (``out_of_service``) is pending, naming the run and the step."""
    comp, name = "global view", exp.view
    per_gpu, err = query(fetch, exp.view_url, per_gpu_query(exp.shard_label), h)
    if err is not None:
        return Check.of(comp, name, "every GPU once", False, err), err
    seen: dict[str, set[str]] = {}
    shards_of: dict[str, set[str]] = {}
    twice = []
    for s in per_gpu or []:
        m = s["metric"]
        node, uuid, instance = m.get("node", ""), m.get("UUID", ""), m.get("GPU_I_ID")
        seen.setdefault(node, set()).add(uuid)
        where = f"{node} {uuid} GPU instance {instance}" if instance else f"{node} {uuid}"
        job = m.get(rule_pack.JOB_LABEL)
        shards_of.setdefault(f"{where} job {job}" if job else where, set()).add(
            m.get(exp.shard_label, "")
        )
        if float(s["value"][1]) > 1:
            twice.append(f"{where} x{float(s['value'][1]):.0f}")
    short = [node for node, want in exp.gpus.items() if len(seen.get(node, ())) != want]
    problems = [f"{node} {len(seen.get(node, ()))}/{exp.gpus[node]}" for node in short]
    if twice:
        problems.append("more than one series for " + ", ".join(sorted(twice)[:5]))
    away = exp.out_of_service
    if (
        problems
        and not twice
        and all(n in away and len(seen.get(n, ())) < exp.gpus[n] for n in short)
    ):
        # fewer GPUs only of hosts a rollout has out of service: back when they are
        detail = "; ".join(f"{p} ({away[n]})" for p, n in zip(problems, short, strict=True))
        return Check(comp, name, "every GPU once", PENDING, detail), None
    if problems:
        return Check.of(comp, name, "every GPU once", False, "; ".join(problems)), None
    moved = sorted(
        f"{where} ({', '.join(repr(s) for s in sorted(found))})"
        for where, found in shards_of.items()
        if len(found) > 1
    )
    if moved:
        more = f" and {len(moved) - 5} more" if len(moved) > 5 else ""
        detail = (
            f"under two {exp.shard_label} labels: {', '.join(moved[:5])}{more}; a host that "
            f"moved to another shard keeps its old series in the view for up to "
            f"{VIEW_LOOKBACK_S} s"
        )
        return Check(comp, name, "every GPU once", PENDING, detail), None
    total = sum(exp.gpus.values())
    detail = f"{total} GPUs of {len(exp.gpus)} hosts, one series each"
    return Check.of(comp, name, "every GPU once", True, detail), None


def check_global_view(exp: StoreExpectation, fetch: Fetch) -> list[Check]:
    comp = "global view"
    name = exp.view
    if not exp.view_url:
        return [Check.of(comp, name, "answers", False, f"{name}: no host to query")]
    h = exp.headers if name == "victoriametrics" else {}
    _, err = query(fetch, exp.view_url, "vector(1)", h)
    if err is not None:
        return [Check.of(comp, name, "answers", False, err)]
    checks = [Check.of(comp, name, "answers", True, f"{exp.view_url}/api/v1/query")]
    if not exp.gpus:
        return checks
    once, err = _every_gpu_once(exp, fetch, h)
    checks.append(once)
    if err is not None:
        return checks
    clusters, err = query(fetch, exp.view_url, f"count by (cluster) ({GPU_METRIC})", h)
    if err is not None:
        return [*checks, Check.of(comp, name, "every cluster", False, err)]
    have = {s["metric"].get("cluster", "") for s in clusters or []}
    missing = sorted(exp.clusters - have)
    away = exp.out_of_service
    if missing and all(
        exp.cluster_nodes.get(c) and exp.cluster_nodes[c] <= away.keys() for c in missing
    ):
        # every GPU node of each missing cluster is out of service in a driven rollout
        detail = "; ".join(
            f"missing: {c} (" + ", ".join(f"{n} {away[n]}" for n in sorted(exp.cluster_nodes[c]))
            + ")"
            for c in missing
        )  # fmt: skip
        checks.append(Check(comp, name, "every cluster", PENDING, detail))
        return checks
    checks.append(
        Check.of(
            comp,
            name,
            "every cluster",
            not missing,
            f"missing: {', '.join(missing)}" if missing else ", ".join(sorted(have)),
        )
    )
    return checks


BACKUP_METRIC = "gpumon_vmbackup_last_success_timestamp_seconds"
# A backup may be late by this much beyond two intervals (the timer's random delay, its run).
BACKUP_GRACE_S = 600.0


def check_backup(
    exp: StoreExpectation, host: str, interval: float, fetch: Fetch, now: float | None = None
) -> list[Check]:
    """The store's last successful backup, from its node_exporter (textfile collector, written
    by gpumon-vmbackup.service), as a replica scraped it."""
    comp, name = "metrics store", "backed up"
    now = now or time.time()
    for w in exp.writers:
        last, err = query(fetch, w.url, f'{BACKUP_METRIC}{{node="{host}"}}', {})
        if err is not None:
            continue  # this replica does not answer: its own rows say so; ask the next
        every = _span(interval)
        if last:
            age = now - float(last[0]["value"][1])
            ok = age <= 2 * interval + BACKUP_GRACE_S
            detail = f"last backup {_span(age)} ago (every {every})"
            if not ok:
                detail = f"last backup {_span(age)} ago, more than twice the interval ({every})"
            return [Check.of(comp, host, name, ok, detail)]
        started, _ = query(
            fetch, w.url, f'process_start_time_seconds{{job="victoriametrics",node="{host}"}}', {}
        )
        up_for = now - float(started[0]["value"][1]) if started else None
        if up_for is not None and up_for <= interval + BACKUP_GRACE_S:
            detail = f"no backup yet: the first runs one interval ({every}) after the timer starts"
            return [Check.of(comp, host, name, True, detail)]
        since = f" in the {_span(up_for)} the store has run" if up_for is not None else ""
        return [Check.of(comp, host, name, False, f"no successful backup{since} (every {every})")]
    return []


def _span(seconds_: float) -> str:
    s_ = int(seconds_)
    if s_ < 120:
        return f"{s_}s"
    if s_ < 7200:
        return f"{s_ // 60}m"
    return f"{s_ // 3600}h{(s_ % 3600) // 60:02d}m"


def collect(exp: StoreExpectation | None, fetch: Fetch, *, workers: int = 8) -> list[Check]:
    """Every check of the store, the remote writes and the global view, in table order."""
    if exp is None or not exp.active:
        return []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        stores = [pool.submit(check_store, exp, s, fetch) for s in exp.stores]
        writers = [pool.submit(check_writer, exp, w, fetch) for w in exp.writers]
        view = pool.submit(check_global_view, exp, fetch) if exp.view != "none" else None
        backups = [pool.submit(check_backup, exp, h, i, fetch) for h, i in exp.backups.items()]
        checks = [c for j in stores for c in j.result()]
        checks += [c for j in backups for c in j.result()]
        checks += [c for j in writers for c in j.result()]
        if view is not None:
            checks += view.result()
    return checks
