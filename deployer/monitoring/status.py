"""``gpumon-deploy status``: the running monitoring stack checked through its APIs and, read-only,
on its hosts.

What should be running comes from the inventory and the roles' variables (``expect``). What is
running comes from each daemon's HTTP API, fetched from the controller at the inventory hosts'
addresses (the one HTTP client, ``deployer.monitoring.http``), and from each host over SSH with the engine's own connection
(host keys verified) and facts: the driver NVML loads on GPU hosts, the files each Prometheus and
Alertmanager host has on disk. ``collect`` gathers everything once, in parallel, then judges it
with pure functions, one row (``Check``, state ok/pending/failed) per thing checked. Each row
fails, naming the host and the cause, when:

- prometheus ``ready``: ``/-/ready`` does not answer (pending while it answers 503: starting);
- ``external labels``: the replica/cluster labels it loaded are not the inventory's;
- ``rules loaded``: a rule file of the pack is not loaded, or a rule fails to evaluate;
- ``loaded config = on disk``: the last reload failed, or prometheus.yml or a rule file changed
  on disk after the config it runs was loaded (a reload owed; checks_loaded.py);
- ``scraping job J``: an expected target of job J is down or missing (pending: not scraped yet
  since the replica or the target daemon started; checks_scrape.py);
- ``*`` ``shard layout record``: ``up`` would refuse the tier's shard layout record (another
  tier's, or unreadable: deployer/monitoring/handoff.py); the rest is checked as if there were
  none; ``*`` ``re-shard finished``: the inventory asks for another shard layout than the last
  whole ``up`` recorded (the targets rows then expect the hand-over: each moved host scraped by
  its old and its new shard), naming the run holding the inventory's lock (the ``up`` handing
  over) or saying none runs; ``--wait`` waits on it only while a whole ``up`` hands over, and
  plans each round anew until the ``up`` has recorded the layout (``collect_until``);
- ``*`` ``external labels distinct`` / ``replicas evaluate the same rules``: two replicas share
  external labels / evaluate different rule groups or rules;
- prometheus_global (the federation tier's pair, deployer/monitoring/federation.py): the rows
  above for each of its replicas, ``scraping job federate`` holding it to every shard replica's
  ``/federate``, ``rules loaded`` to its own rule files, and the two ``*`` rows between its own
  replicas (their rules are not the shards');
- gpus ``N GPUs in the exporter's metrics``: a replica sampled another number of distinct GPU
  UUIDs for the node since it started (checks_gpus.py); N is the declared gpu_count, else (the
  plan's rule: the count from facts) what ``up`` recorded on the host, else its facts now;
- alertmanager ``cluster ready with every peer``: not ready or a peer missing (pending: settling);
  ``loaded config = on disk``: the config it runs is not alertmanager.yml on disk (by MD5), or a
  template changed since; ``*`` ``peers run the same config``;
- driver ``NVML: loaded driver = installed``: nvidia-smi cannot initialise NVML (version
  mismatch: reboot owed), or the loaded kernel module is not the installed driver
  (checks_driver.py);
  ``next boot has the driver's module``: the kernel the host's next boot starts (its GRUB
  pick, else the newest installed kernel) has no NVIDIA module of the installed driver on disk
  -- a kernel installed later without headers, DKMS's autoinstall off --, so a reboot would
  bring it back without its driver (checks_driver.py; Debian family);
- thanos ``ready`` / ``every sidecar a store``;
- slurm (GPU hosts with ``gpumon_scheduler: slurm``): a node left drained by a rollout no
  controller drives any more, or a GPU busy with no Slurm job (slurm.py);
- upgrade-driver ``*`` (this controller's run records of the inventory, rollouts.py): ``rollout
  under way`` pending while a controller drives a run, naming the hosts it has out of service;
  ``no rollout left mid-run`` failed for a run a dead or interrupted controller left with hosts
  out of service, naming them and the command that resumes it. While a run is driven, the rows
  above that fail of a host it has out of service (a target down, its driver, its GPUs) are
  pending instead, naming the run and the host's step.

``collect`` takes the fetch function and the host opener as arguments, so the tables are tested
on canned answers (tests/unit/test_monitoring_status.py, tests/contract/test_status_*.py) and run
for real against the lab (tests/integration/test_monitoring.py).
"""

from __future__ import annotations

import dataclasses
import time
import urllib.parse
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deployer.connection import Connection, ConnectionPool, SSHConnection
from deployer.executor import DEFAULT_FORKS
from deployer.facts import HostFacts, gather
from deployer.modules import driver_module
from deployer.modules.driver_module import HostRead
from deployer.monitoring import checks_global
from deployer.monitoring.check import FAILED, OK, PENDING, Check, clock, parse_time, worst
from deployer.monitoring.checks_driver import driver_rows, reads_modules
from deployer.monitoring.checks_gpus import (
    RECORD_METRIC,
    expected_counts,
    gpu_query,
    gpus_by_node,
    parse_record,
    record_command,
)
from deployer.monitoring.checks_loaded import (
    ALERTMANAGER_GAUGES,
    AM_HASH,
    PROMETHEUS_GAUGES,
    START,
    AlertmanagerDisk,
    alertmanager_check,
    alertmanager_command,
    mtimes_command,
    parse_alertmanager,
    parse_mtimes,
    prometheus_check,
    replica_started,
    rule_set,
    same_alertmanager_config_check,
    same_rules_check,
)
from deployer.monitoring.checks_scrape import active_targets, scrape_checks
from deployer.monitoring.checks_shards import (
    RESHARD_CHECK,
    reshard_check,
    shard_checks,
    up_hands_over,
)
from deployer.monitoring.checks_thanos import ready, thanos_checks
from deployer.monitoring.expect import (
    Endpoint,
    Peer,
    Replica,
    StackExpectation,
    expect,
    load_expectation,
)
from deployer.monitoring.file_sd import Target
from deployer.monitoring.http import Fetch, api_data, get_json, http_fetch, query, self_gauges
from deployer.monitoring.rollouts import RunInfo, out_of_service_now, rollout_checks, runs_of

__all__ = [
    "Check",
    "Endpoint",
    "Peer",
    "Replica",
    "StackExpectation",
    "collect",
    "collect_until",
    "expect",
    "load_expectation",
]

GLOBAL = "prometheus_global"  # the component of the global pair's rows (federation tier)
EXIT_PENDING = 3  # nothing failed, something still pending (see the status command's help)
WAIT_EVERY_S = 5.0
SETTLE_GRACE_S = 60.0  # an Alertmanager younger than this may still be joining its peers

Opener = Callable[[str], Connection]


# ---------------------------------------------------------------- observing (I/O, in parallel)


@dataclass
class _Obs:
    """What one round saw: raw answers, judged afterwards."""

    ready: dict[str, tuple[str, str]] = field(default_factory=dict)  # replica -> (state, detail)
    gauges: dict[str, dict[str, float] | str] = field(default_factory=dict)  # url -> gauges | err
    config: dict[str, Any] = field(default_factory=dict)  # replica -> loaded config | err str
    rules: dict[str, Any] = field(default_factory=dict)  # replica -> groups | err str
    targets: dict[str, Any] = field(default_factory=dict)  # replica -> targets data | err str
    gpus: dict[str, Any] = field(default_factory=dict)  # replica -> vector | err str
    global_gpus: dict[str, Any] = field(default_factory=dict)  # global replica -> vector | err
    # global replica -> shard -> GPUs (checks_global.shard_counts; None: no record); a sharded
    # tier's only, and only where the query answered
    global_shard_gpus: dict[str, dict[str, float] | None] = field(default_factory=dict)
    am_status: dict[str, Any] = field(default_factory=dict)  # peer -> status | err str
    prom_disk: dict[str, tuple[list[tuple[float, str]] | None, str | None]] = field(
        default_factory=dict
    )
    am_disk: dict[str, tuple[AlertmanagerDisk | None, str | None]] = field(default_factory=dict)
    facts: dict[str, tuple[HostFacts | None, str | None]] = field(default_factory=dict)
    # GPU host -> its boot loader and modules on disk (driver_module.read_host) | why not
    modules: dict[str, tuple[HostRead | None, str | None]] = field(default_factory=dict)
    records: dict[str, int | None] = field(default_factory=dict)  # GPU node -> what up recorded
    scraped_records: dict[str, dict[str, int]] = field(default_factory=dict)  # replica -> node -> N
    slurm: Any = None  # monitoring.slurm.SlurmObservation, when the inventory opts in
    runs: list[RunInfo] = field(default_factory=list)  # the inventory's upgrade-driver runs


def _observe_replica(
    exp: StackExpectation, rep: Replica, fetch: Fetch, obs: _Obs, *, gpus: bool = True
) -> None:
    """One replica's answers; ``gpus``: also the GPUs it sampled (not on a global replica, which
    scrapes no exporter)."""
    obs.ready[rep.host] = ready(fetch, rep.url)
    if obs.ready[rep.host][0] != OK:
        return
    gauges, err = self_gauges(fetch, rep.url, PROMETHEUS_GAUGES)
    obs.gauges[rep.url] = gauges if err is None else err
    data, err = api_data(fetch, f"{rep.url}/api/v1/status/config")
    obs.config[rep.host] = err if err is not None else (yaml.safe_load(data["yaml"]) or {})
    data, err = api_data(fetch, f"{rep.url}/api/v1/rules")
    obs.rules[rep.host] = err if err is not None else list(data.get("groups") or [])
    data, err = api_data(fetch, f"{rep.url}/api/v1/targets?state=active")
    obs.targets[rep.host] = err if err is not None else active_targets(data)
    if gpus and (exp.gpus or exp.gpu_records):
        started = replica_started(fetch, rep.url, gauges)
        series, err = query(fetch, rep.url, gpu_query(exp.gpu_metric, since=started))
        obs.gpus[rep.host] = err if err is not None else series
    if not gpus and (exp.gpus or exp.gpu_records):  # a global replica: its GPU count
        series, err = query(fetch, rep.url, checks_global.QUERY)
        obs.global_gpus[rep.host] = err if err is not None else series
        if exp.node_shards and exp.global_shard_label:
            series, err = query(fetch, rep.url, checks_global.SHARD_RECORD)
            # an error: judged on the sum alone, as without the record
            if err is None:
                obs.global_shard_gpus[rep.host] = checks_global.shard_counts(
                    series, exp.global_shard_label
                )
    if gpus and exp.gpu_records:
        series, err = query(fetch, rep.url, f"max by (node) ({RECORD_METRIC})")
        if err is None:
            obs.scraped_records[rep.host] = {
                str(s["metric"].get("node", "")): int(float(s["value"][1])) for s in series or []
            }


def _observe_alertmanager(peer: Peer, fetch: Fetch, obs: _Obs) -> None:
    data, err = get_json(fetch, f"{peer.url}/api/v2/status")
    obs.am_status[peer.host] = err if err is not None else data
    if err is None:
        gauges, gerr = self_gauges(fetch, peer.url, ALERTMANAGER_GAUGES)
        obs.gauges[peer.url] = gauges if gerr is None else gerr


def _on_host(conn: Connection, command: str) -> tuple[str | None, str | None]:
    """stdout of a read-only command, or None and why not; an exception is left to the caller."""
    result = conn.run(command)
    if not result.ok:
        tail = (result.stderr or result.stdout).strip().splitlines()
        return None, f"exit {result.rc}: {tail[-1] if tail else ''}"
    return result.stdout, None


def _observe_host(
    host: str,
    replica: Replica | None,
    peer: Peer | None,
    gpu: bool,
    hosts: Opener,
    obs: _Obs,
    record: str | None = None,
) -> None:
    """Every read-only command status runs on ``host``, one after the other on its one pooled
    connection. A connection that failed is closed, so the next round (``--wait``) opens a new
    one instead of failing on a dead session until the end."""
    conn: Connection | None = None
    try:
        conn = hosts(host)
        if replica is not None:
            out, err = _on_host(conn, mtimes_command([replica.config_file, replica.rule_files]))
            obs.prom_disk[host] = (parse_mtimes(out) if out is not None else None, err)
        if peer is not None:
            out, err = _on_host(conn, alertmanager_command(peer.config_file, peer.templates))
            obs.am_disk[host] = (parse_alertmanager(out) if out is not None else None, err)
        if gpu:
            facts = gather(conn)
            obs.facts[host] = (facts, None)
            if reads_modules(facts):
                out, err = _on_host(conn, driver_module.host_script())
                obs.modules[host] = (driver_module.read_host(out) if out is not None else None, err)
        if record is not None:
            out, _ = _on_host(conn, record_command(record))
            obs.records[host] = parse_record(out or "")
    except Exception as exc:  # unreachable, host key refused, a dropped session
        why = str(exc) or type(exc).__name__
        if replica is not None:
            obs.prom_disk.setdefault(host, (None, why))
        if peer is not None:
            obs.am_disk.setdefault(host, (None, why))
        if gpu:
            obs.facts.setdefault(host, (None, why))
            obs.modules.setdefault(host, (None, why))
        if conn is not None:
            conn.close()


def _observe_slurm(exp: StackExpectation, fetch: Fetch, hosts: Opener, obs: _Obs) -> None:
    """Slurm's view of the GPU hosts and their GPU use (deployer/monitoring/slurm.py)."""
    from deployer.monitoring import slurm

    obs.slurm = slurm.observe(exp.slurm, [r.url for r in exp.replicas], fetch, hosts)


def _observe_store_start(url: str, fetch: Fetch, obs: _Obs) -> None:
    """When the long-term store's process started (its ``/metrics``, with the store's own
    credentials in ``fetch``): a replica's failed scrape of it from before then is not a fault."""
    gauges, err = self_gauges(fetch, url, [START])
    obs.gauges[url] = gauges if err is None else err


def _observe(
    exp: StackExpectation,
    fetch: Fetch,
    hosts: Opener | None,
    workers: int,
    forks: int,
    store_fetch: Fetch | None = None,
) -> _Obs:
    """One round: the HTTP answers (``workers`` at a time) and the hosts' read-only commands
    (``forks`` hosts at a time, as ``up`` connects) at once. ``store_fetch``: the long-term
    store's client (its credentials), when the stack has one."""
    obs = _Obs(runs=runs_of(exp.inventory) if exp.inventory else [])
    replicas = {r.host: r for r in [*exp.replicas, *exp.global_replicas]}
    peers = {p.host: p for p in exp.alertmanagers}
    gpu_hosts = {*exp.gpu_hosts, *exp.gpu_records}
    with ThreadPoolExecutor(max_workers=workers) as api, ThreadPoolExecutor(forks) as ssh:
        jobs = [api.submit(_observe_replica, exp, r, fetch, obs) for r in exp.replicas]
        jobs += [
            api.submit(_observe_replica, exp, r, fetch, obs, gpus=False)
            for r in exp.global_replicas
        ]
        jobs += [api.submit(_observe_alertmanager, p, fetch, obs) for p in exp.alertmanagers]
        if store_fetch is not None and exp.store is not None:
            for s in exp.store.stores:
                jobs.append(api.submit(_observe_store_start, s.url, store_fetch, obs))
        if hosts is not None and exp.slurm is not None:
            jobs.append(api.submit(_observe_slurm, exp, fetch, hosts, obs))
        if hosts is not None:
            for h in dict.fromkeys([*exp.gpu_hosts, *exp.gpu_records, *replicas, *peers]):
                record = exp.gpu_records.get(h)
                args = (h, replicas.get(h), peers.get(h), h in gpu_hosts, hosts, obs, record)
                jobs.append(ssh.submit(_observe_host, *args))
        for j in jobs:
            j.result()
    return obs


# ---------------------------------------------------------------- judging (pure)


def _gauges(obs: _Obs, url: str) -> dict[str, float]:
    g = obs.gauges.get(url)
    return g if isinstance(g, dict) else {}


def _netloc(url: str) -> str:
    return urllib.parse.urlsplit(url).netloc


def _replica_checks(
    exp: StackExpectation,
    rep: Replica,
    obs: _Obs,
    starts: Mapping[str, float],
    now: float,
    with_hosts: bool,
    targets: list[Target],
    maintenance: Mapping[str, str] | None = None,
) -> tuple[list[Check], dict[tuple[str, str], str], dict[str, str] | None]:
    comp = "prometheus"
    state, detail = obs.ready[rep.host]
    checks = [Check(comp, rep.host, "ready", state, detail)]
    if state != OK:
        return checks, {}, None

    labels: dict[str, str] | None = None
    loaded = obs.config[rep.host]
    if isinstance(loaded, str):
        checks.append(Check(comp, rep.host, "external labels", FAILED, loaded))
    else:
        ext = (loaded.get("global") or {}).get("external_labels") or {}
        labels = {str(k): str(v) for k, v in ext.items()}
        wrong = [
            f"{name}={labels.get(name)!r} (want {want!r})"
            for name, want in ((rep.replica_label, rep.replica), (rep.cluster_label, rep.cluster))
            if labels.get(name) != want
        ]
        checks.append(
            Check.of(
                comp,
                rep.host,
                "external labels",
                not wrong,
                "; ".join(wrong) or ", ".join(f"{k}={v}" for k, v in sorted(labels.items())),
            )
        )

    groups = obs.rules[rep.host]
    if isinstance(groups, str):
        checks.append(Check(comp, rep.host, "rules loaded", FAILED, groups))
    else:
        checks.append(_rules_loaded(rep, groups))

    if with_hosts:
        disk, ssh_error = obs.prom_disk.get(rep.host, (None, "not read"))
        gauges = obs.gauges.get(rep.url)
        if isinstance(gauges, str):
            checks.append(Check(comp, rep.host, "loaded config = on disk", FAILED, gauges))
        else:
            loaded_files = (
                {str(g.get("file")) for g in groups} if not isinstance(groups, str) else set()
            )
            checks.append(
                prometheus_check(
                    rep.host, gauges or {}, loaded_files, disk, ssh_error, rep.config_file
                )
            )

    seen = obs.targets[rep.host]
    states: dict[tuple[str, str], str] = {}
    if isinstance(seen, str):
        checks.append(Check(comp, rep.host, "scraping", FAILED, seen))
    else:
        rows, states = scrape_checks(
            rep.host,
            targets,
            seen,
            replica_start=_gauges(obs, rep.url).get(START),
            daemon_starts=starts,
            now=now,
            maintenance=maintenance,
        )
        checks.extend(rows)
    return checks, states, labels


def _rules_loaded(rep: Replica, groups: list[dict[str, Any]]) -> Check:
    files = {Path(str(g.get("file", ""))).name for g in groups}
    missing = [f for f in rep.loads if f not in files]
    broken = sorted(
        {
            f"{r.get('name')} ({r.get('lastError') or r.get('health')})"
            for g in groups
            for r in g.get("rules") or []
            if r.get("health") not in (None, "ok", "unknown")
        }
    )
    n_rules = sum(len(g.get("rules") or []) for g in groups)
    problems = []
    if missing:
        problems.append(f"rule files not loaded: {', '.join(missing)}")
    if broken:
        problems.append(f"rules failing to evaluate: {'; '.join(broken)}")
    return Check.of(
        "prometheus",
        rep.host,
        "rules loaded",
        not problems,
        "; ".join(problems) or f"{n_rules} rules in {len(groups)} groups",
    )


def _distinct_labels(replicas: list[Replica], labels: Mapping[str, dict[str, str] | None]) -> Check:
    seen: dict[tuple[tuple[str, str], ...], list[str]] = {}
    unknown = []
    for rep in replicas:
        got = labels.get(rep.host)
        if got is None:
            unknown.append(rep.host)
            continue
        seen.setdefault(tuple(sorted(got.items())), []).append(rep.host)
    clashes = [hosts for hosts in seen.values() if len(hosts) > 1]
    if clashes:
        detail = "; ".join(f"{' and '.join(h)} have identical external labels" for h in clashes)
        return Check("prometheus", "*", "external labels distinct", FAILED, detail)
    # A replica that did not answer already has its own row; compare the others.
    note = f" (not compared: {', '.join(unknown)})" if unknown else ""
    return Check("prometheus", "*", "external labels distinct", OK, f"{len(seen)} replicas{note}")


def gpu_counts(exp: StackExpectation, obs: _Obs) -> dict[str, tuple[int | None, str]]:
    """The number of GPUs each GPU node is held to and where it comes from: the declared
    gpu_count, else what ``up`` recorded on the host, else its facts now (checks_gpus)."""
    facts_counts: dict[str, tuple[int, str] | None] = {}
    for node in exp.gpu_records:
        found = obs.facts.get(node, (None, None))[0]
        if found is not None:
            names, source = found.gpu_names()
            facts_counts[node] = (len(names), source or "no GPU seen")
    scraped: dict[str, int] = {}
    for per_node in obs.scraped_records.values():
        for node, n in per_node.items():
            scraped[node] = max(n, scraped.get(node, 0))
    return expected_counts(exp.gpus, exp.gpu_records, obs.records, facts_counts, scraped)


def _shard_checks(exp: StackExpectation, obs: _Obs) -> list[Check]:
    seen: dict[str, set[tuple[str, str]] | None] = {}
    for rep in exp.replicas:
        got = obs.targets.get(rep.host)
        seen[rep.host] = (
            None if got is None or isinstance(got, str) else {(t.job, t.instance) for t in got}
        )
    return shard_checks({r.host: r.shard for r in exp.replicas}, exp.replica_targets, seen)


def _gpu_checks(
    exp: StackExpectation, obs: _Obs, target_states: Mapping[str, dict[tuple[str, str], str]]
) -> list[Check]:
    counted: dict[str, tuple[dict[str, int], dict[str, int]] | str] = {}
    for rep in exp.replicas:
        got = obs.gpus.get(rep.host)
        if got is not None:
            counted[rep.host] = got if isinstance(got, str) else gpus_by_node(got)
    out = []
    for rep in exp.replicas:
        if isinstance(counted.get(rep.host), str):
            out.append(Check("prometheus", rep.host, "GPU metrics", FAILED, str(counted[rep.host])))
    for node, (want, source) in gpu_counts(exp, obs).items():
        if want is None:
            out.append(Check("gpus", node, "GPUs in the exporter's metrics", FAILED, source))
            continue
        states, notes = [], []
        asked = 0
        for rep in exp.replicas:
            if exp.node_shards and exp.node_shards.get(node) != rep.shard:
                continue  # another shard scrapes this node
            got = counted.get(rep.host)
            if got is None or isinstance(got, str):
                continue  # not ready or the query failed: already a row of that replica
            asked += 1
            have, no_uuid = got[0].get(node, 0), got[1].get(node, 0)
            if no_uuid:
                states.append(FAILED)
                notes.append(f"{rep.host}: {no_uuid} series without a UUID label")
            elif have != want:
                if target_states.get(rep.host, {}).get(("dcgm", node)) == PENDING:
                    states.append(PENDING)
                    notes.append(f"{rep.host} has not scraped the exporter yet")
                else:
                    states.append(FAILED)
                    notes.append(f"{rep.host} sees {have}")
        if asked == 0:
            states.append(FAILED)
            notes.append("no replica could be asked")
        out.append(
            Check(
                "gpus",
                node,
                f"{want} GPUs in the exporter's metrics",
                worst(states),
                ("; ".join(notes) or f"{want}/{want} (distinct UUIDs) on {asked} replica(s)")
                + ("" if source == "gpu_count" else f" ({source})"),
            )
        )
    return out


def _alertmanager_checks(
    exp: StackExpectation, peer: Peer, obs: _Obs, now: float, with_hosts: bool
) -> list[Check]:
    comp, check = "alertmanager", "cluster ready with every peer"
    data = obs.am_status[peer.host]
    if isinstance(data, str):
        return [Check(comp, peer.host, check, FAILED, data)]
    cluster = data.get("cluster") or {}
    status = cluster.get("status")
    seen = {p.get("address") for p in cluster.get("peers") or []}
    want = {p.cluster_address for p in exp.alertmanagers}
    # ``uptime`` is when the Alertmanager's API started, i.e. the process (alertmanager v0.25.0
    # ``api/v2/api.go:101,157-162``).
    started = parse_time(str(data.get("uptime") or ""))
    young = started is not None and now - started < SETTLE_GRACE_S
    problems, states = [], []
    if status == "settling":
        states.append(PENDING)
        problems.append("cluster settling (joining its peers)")
    elif status != "ready":
        states.append(FAILED)
        problems.append(f"cluster status {status!r}")
    if want - seen:
        states.append(PENDING if young else FAILED)
        problems.append(f"peers missing: {', '.join(sorted(want - seen))}")
    if seen - want:
        states.append(FAILED)
        problems.append(f"unexpected peers: {', '.join(sorted(a for a in seen - want if a))}")
    if young and problems:
        problems.append(f"started {clock(started or 0)}")
    checks = [
        Check(
            comp,
            peer.host,
            check,
            worst(states),
            "; ".join(problems) or f"ready, {len(seen)}/{len(want)} peers",
        )
    ]
    if with_hosts:
        gauges = obs.gauges.get(peer.url)
        if isinstance(gauges, str):
            checks.append(Check(comp, peer.host, "loaded config = on disk", FAILED, gauges))
        else:
            disk, err = obs.am_disk.get(peer.host, (None, "not read"))
            checks.append(alertmanager_check(peer.host, gauges or {}, disk, err, peer.config_file))
    return checks


#: the row of a shard layout record ``up`` refuses (StackExpectation.record_problems)
RECORD_CHECK = "shard layout record"


def judge(exp: StackExpectation, obs: _Obs, *, now: float, with_hosts: bool) -> list[Check]:
    """Every row of one round but Thanos', in table order, from what ``_observe`` saw."""
    # the stack's daemons a replica scrapes, by the address it scrapes them at, and when each
    # started: a Prometheus, an Alertmanager, the long-term store
    stores = exp.store.stores if exp.store is not None else []
    starts = {
        _netloc(d.url): _gauges(obs, d.url)[START]
        for d in [*exp.replicas, *exp.global_replicas, *exp.alertmanagers, *stores]
        if START in _gauges(obs, d.url)
    }
    # hosts a driven rollout has out of service: their down targets and failed rows are pending
    maintenance = out_of_service_now(obs.runs)
    checks: list[Check] = []
    target_states: dict[str, dict[tuple[str, str], str]] = {}
    labels: dict[str, dict[str, str] | None] = {}
    for rep in exp.replicas:
        targets = exp.replica_targets.get(rep.host, exp.targets)
        rows, target_states[rep.host], labels[rep.host] = _replica_checks(
            exp, rep, obs, starts, now, with_hosts, targets, maintenance
        )
        checks.extend(rows)
    if exp.replicas:
        checks.extend(_pair_checks(exp.replicas, obs, labels))
        if exp.gpus or exp.gpu_records:
            checks.extend(_gpu_checks(exp, obs, target_states))
        if exp.replica_targets:
            checks.extend(_shard_checks(exp, obs))
    # ``up`` refuses these before touching a host; the targets above are what it would converge
    checks.extend(
        Check("prometheus", "*", RECORD_CHECK, FAILED, said) for said in exp.record_problems
    )
    # the rows above expect the hand-over (old and new owners); this one says why
    checks.extend(reshard_check(said, exp.changing_run) for said in exp.reshards)
    checks.extend(_global_pair_checks(exp, obs, starts, now, with_hosts, maintenance))
    for peer in exp.alertmanagers:
        checks.extend(_alertmanager_checks(exp, peer, obs, now, with_hosts))
    if exp.alertmanagers:
        hashes = {
            p.host: _gauges(obs, p.url)[AM_HASH]
            for p in exp.alertmanagers
            if AM_HASH in _gauges(obs, p.url)
        }
        checks.append(same_alertmanager_config_check(hashes))
    if with_hosts:
        for host in exp.gpu_hosts:
            found, err = obs.facts.get(host, (None, "not read"))
            checks.extend(driver_rows(host, found, err, obs.modules.get(host, (None, err))))
        if exp.slurm is not None:
            from deployer.monitoring import slurm

            checks.extend(slurm.checks(exp.slurm, obs.slurm))
    elif exp.gpu_hosts or exp.replicas or exp.alertmanagers:
        checks.append(
            Check(
                "hosts",
                "-",
                "over SSH",
                OK,
                "skipped (--api-only): driver/NVML on GPU hosts and loaded-vs-on-disk configs "
                "not checked",
            )
        )
        if exp.slurm is not None:
            checks.append(Check("slurm", "-", "read Slurm", OK, "skipped (--api-only)"))
    if maintenance:
        checks = [
            dataclasses.replace(c, state=PENDING, detail=f"{c.detail} ({maintenance[c.host]})")
            if c.state == FAILED and c.host in maintenance
            else c
            for c in checks
        ]
    # the controller's own records, also with --api-only: a rollout under way, or one left mid-run
    checks.extend(rollout_checks(obs.runs))
    return checks


def _pair_checks(
    replicas: list[Replica], obs: _Obs, labels: Mapping[str, dict[str, str] | None]
) -> list[Check]:
    """The rows of a tier's replicas together: distinct external labels, the same rules."""
    sets = {
        r.host: rule_set(obs.rules[r.host])
        for r in replicas
        if isinstance(obs.rules.get(r.host), list)
    }
    return [_distinct_labels(replicas, labels), same_rules_check(sets)]


def _global_pair_checks(
    exp: StackExpectation,
    obs: _Obs,
    starts: Mapping[str, float],
    now: float,
    with_hosts: bool,
    maintenance: Mapping[str, str],
) -> list[Check]:
    """The federation tier's global pair, judged as the shard replicas are (ready, labels, rules
    loaded, loaded config = on disk, scraping: every shard replica's /federate) and then as a
    pair of its own (its rules are not the shards'); every row under component ``GLOBAL``.
    ``maintenance``: the hosts a driven rollout has out of service (their GPUs may be missing)."""
    checks: list[Check] = []
    labels: dict[str, dict[str, str] | None] = {}
    counts = {n: c for n, (c, _) in gpu_counts(exp, obs).items()}
    young = any(
        now - starts[_netloc(r.url)] < checks_global.SETTLE_S
        for r in [*exp.global_replicas, *exp.replicas]
        if _netloc(r.url) in starts
    )
    for rep in exp.global_replicas:
        rows, federate, labels[rep.host] = _replica_checks(
            exp, rep, obs, starts, now, with_hosts, exp.global_targets
        )
        checks.extend(rows)
        if counts:
            row = checks_global.global_gpu_check(
                rep.host, obs.global_gpus.get(rep.host), counts, federate.values(), young,
                maintenance, obs.global_shard_gpus.get(rep.host), exp.node_shards,
            )  # fmt: skip
            if row is not None:
                checks.append(row)
    if exp.global_replicas:
        checks.extend(_pair_checks(exp.global_replicas, obs, labels))
    return [dataclasses.replace(c, component=GLOBAL) for c in checks]


def collect(
    exp: StackExpectation,
    fetch: Fetch,
    hosts: Opener | None = None,
    *,
    now: Callable[[], float] = time.time,
    workers: int = 16,
    forks: int = DEFAULT_FORKS,
    store_fetch: Any = None,
) -> list[Check]:
    """Every check of the running stack, in table order. ``hosts`` opens a connection to a host
    (None: the APIs only, no SSH); ``store_fetch`` is the long-term store's HTTP client (with
    headers: its basic auth), ``http_fetch`` unless given."""
    from deployer.monitoring import store

    sfetch = store_fetch or http_fetch
    headers = exp.store.headers if exp.store is not None else {}
    obs = _observe(exp, fetch, hosts, workers, forks, lambda url: sfetch(url, headers))
    checks = judge(exp, obs, now=now(), with_hosts=hosts is not None)
    stored_exp = exp.store
    if stored_exp is not None and exp.gpu_records:
        # The global view holds every node to the same count as the replicas' rows.
        counts = {n: c for n, (c, _) in gpu_counts(exp, obs).items() if c is not None}
        stored_exp = dataclasses.replace(stored_exp, gpus=counts)
    if stored_exp is not None:
        # a host a driven rollout has out of service may be missing from the global view
        stored_exp = dataclasses.replace(stored_exp, out_of_service=out_of_service_now(obs.runs))
    stored = store.collect(stored_exp, sfetch)
    return checks + thanos_checks(exp, fetch) + stored


def collect_until(
    exp: StackExpectation,
    fetch: Fetch,
    hosts: Opener | None = None,
    *,
    wait_s: float = 0,
    every_s: float = WAIT_EVERY_S,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    replan: Callable[[], StackExpectation] | None = None,
) -> list[Check]:
    """``collect`` again every ``every_s`` while a check is not ok, for at most ``wait_s``
    seconds; the last round's checks (``wait_s`` 0: one round). While a re-shard is unfinished,
    each round plans its expectation anew (``replan``): the ``up`` handing over records the new
    layout when its replicas have their hosts, and from then on the old owners are expected to
    let go of the moved hosts, not to keep them."""
    deadline = monotonic() + wait_s
    while True:
        checks = collect(exp, fetch, hosts, now=now)
        left = deadline - monotonic()
        if left <= 0 or all(c.ok or not _waited_on(c, exp) for c in checks):
            return checks
        sleep(min(every_s, left))
        if exp.reshards and replan is not None:
            planned = replan()
            # one mapping of every host's SSH settings, the first round's: what ``open_hosts``
            # reads when it opens a host (an inventory edited meanwhile may name another)
            exp.ssh.update(planned.ssh)
            planned.ssh = exp.ssh
            exp = planned


def _waited_on(check: Check, exp: StackExpectation) -> bool:
    """Whether waiting can mend a row that is not ok: not a record ``up`` refuses (it stays until
    someone mends it), nor a re-shard no whole ``up`` is finishing (it stays until one runs)."""
    if check.check == RESHARD_CHECK:
        return up_hands_over(exp.changing_run)
    return check.check != RECORD_CHECK


def open_hosts(exp: StackExpectation) -> ConnectionPool:
    """One SSH connection per host, opened on first use (close with ``close_all``)."""
    return ConnectionPool(lambda host: SSHConnection(exp.ssh[host]))
