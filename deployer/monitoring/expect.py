"""What ``gpumon-deploy status`` expects to find running: the stack the inventory describes, each
role host's variables resolved as ``up`` resolves them (role defaults < group < host < extra vars).

Pure data: the replicas, Alertmanager peers, scrape targets, GPUs per node, GPU hosts and Thanos
endpoints, with the paths of the files each daemon loads and how to reach each host over SSH.
Building it touches no host.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployer.connection import SSHTarget
from deployer.errors import InputError
from deployer.monitoring import federation, file_sd, shards
from deployer.monitoring.checks_gpus import presence_metric
from deployer.monitoring.file_sd import Target, truthy
from deployer.monitoring.http import ClientTLS
from deployer.tls import material as tls_material

# Where the node_exporter role writes ``gpumon_expected_gpus`` (roles/node_exporter/tasks/main.yml,
# "expected GPU count for the fell-off-the-bus alert"; the directory is the role's
# node_exporter_textfile_dir, its default here, the host's own value in load_expectation).
RECORD_FILE = "gpumon.prom"
DEFAULT_TEXTFILE_DIR = "/var/lib/node_exporter/textfile_collector"


@dataclass(frozen=True)
class Replica:
    host: str
    url: str  # http://address:port
    replica: str
    cluster: str
    replica_label: str
    cluster_label: str
    config_file: str = "/etc/prometheus/prometheus.yml"
    rule_files: str = "/etc/prometheus/rules/*.yml"  # the glob of prometheus.yml's rule_files
    shard: str = ""  # prometheus_shard: "" when the tier is one pair
    # the rule files it loads (names in rule_files' directory: the role's prometheus_rule_files)
    loads: tuple[str, ...] = ()


@dataclass(frozen=True)
class Peer:
    host: str
    url: str
    cluster_address: str  # the advertise address:port the other peers know it by
    config_file: str = "/etc/alertmanager/alertmanager.yml"
    templates: tuple[str, ...] = ()


@dataclass(frozen=True)
class Endpoint:
    host: str
    url: str


@dataclass
class StackExpectation:
    """What the inventory says should be running."""

    replicas: list[Replica] = field(default_factory=list)
    # the federation tier's global pair (deployer/monitoring/federation.py): each replica
    # scrapes every shard replica's /federate (global_targets) and evaluates the global rules
    global_replicas: list[Replica] = field(default_factory=list)
    global_targets: list[Target] = field(default_factory=list)
    # the label naming the shard in the global pair's GPUs per shard (checks_global.SHARD_RECORD)
    global_shard_label: str = ""
    alertmanagers: list[Peer] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    gpus: dict[str, int] = field(default_factory=dict)  # the inventory's gpu_count (declared)
    # GPU nodes with no gpu_count: their count is the one ``up`` planned from facts and recorded
    # on the host (node -> the node_exporter textfile it wrote, ``gpumon_expected_gpus``), else
    # the facts status reads now (``gpu_counts``).
    gpu_records: dict[str, str] = field(default_factory=dict)
    # sharded tier (deployer/monitoring/shards.py): each replica's own targets, each node's shard
    replica_targets: dict[str, list[Target]] = field(default_factory=dict)
    node_shards: dict[str, str] = field(default_factory=dict)
    gpu_metric: str = field(default_factory=presence_metric)
    gpu_hosts: list[str] = field(default_factory=list)  # hosts of the GPU driver play
    thanos_active: bool = False
    thanos_sidecars: list[Endpoint] = field(default_factory=list)
    thanos_queries: list[Endpoint] = field(default_factory=list)
    thanos_stores: list[str] = field(default_factory=list)  # sidecar gRPC host:port
    ssh: dict[str, SSHTarget] = field(default_factory=dict)  # how to reach each host above
    slurm: Any = None  # monitoring.slurm.SlurmExpectation when a GPU host sets gpumon_scheduler
    store: Any = (
        None  # monitoring.store.StoreExpectation: long-term store, remote write, global view
    )
    # gpumon_tls on: the CA, user and password the product's client uses (monitoring/http.py)
    client_tls: ClientTLS | None = None
    # what ``up`` would refuse in the shard layout records (deployer/monitoring/handoff.py:
    # another tier's, unreadable), each said once; planned as if there were no record
    record_problems: list[str] = field(default_factory=list)
    # re-shards the last whole ``up`` has not finished (handoff.changes): the inventory asks
    # for a layout the record does not hold; the targets above are the hand-over's
    reshards: list[str] = field(default_factory=list)
    # with reshards: the changing run that holds the inventory's lock (run_lock.holder), which
    # is then the ``up`` handing over; None: none runs (or it cannot be told)
    changing_run: str | None = None
    # the inventory's real path: its upgrade-driver runs on this controller are read each round
    # (deployer/monitoring/rollouts.py runs_of); empty: none are
    inventory: str = ""


# ---------------------------------------------------------------- expectation from the inventory


def _replica(host: str, v: Mapping[str, Any]) -> Replica:
    address = str(v.get("ansible_host", host))
    return Replica(
        host=host,
        url=f"{tls_material.scheme(v)}://{address}:{v['prometheus_port']}",
        replica=str(v["prometheus_replica"]),
        cluster=str(v["prometheus_cluster"]),
        replica_label=str(v["prometheus_replica_label"]),
        cluster_label=str(v["prometheus_cluster_label"]),
        config_file=f"{v['prometheus_config_dir']}/prometheus.yml",
        rule_files=f"{v['prometheus_rule_files_dir']}/*.yml",
        shard=str(v.get("prometheus_shard") or ""),
        loads=tuple(f"{name}.yml" for name in v["prometheus_rule_files"]),
    )


def expect(
    prometheus_vars: Mapping[str, Mapping[str, Any]],
    alertmanager_vars: Mapping[str, Mapping[str, Any]],
    query_vars: Mapping[str, Mapping[str, Any]],
) -> StackExpectation:
    """The expected stack from each role host's resolved variables (role defaults included):
    ``prometheus_vars[host]`` for every host of the Prometheus plays (shard replicas and the
    global pair, told apart by ``federation.split``), and so on."""
    exp = StackExpectation()
    prometheus_vars, global_vars = federation.split(prometheus_vars)
    for host, v in global_vars.items():
        exp.global_replicas.append(_replica(host, v))
    for v in list(global_vars.values())[:1]:
        exp.global_targets = federation.expected_targets(v)
        exp.global_shard_label = str(v["prometheus_shard_label"])
    first: Mapping[str, Any] | None = None
    for host, v in prometheus_vars.items():
        first = first or v
        address = str(v.get("ansible_host", host))
        exp.replicas.append(_replica(host, v))
        if truthy(v["prometheus_thanos_sidecar"]):
            exp.thanos_active = True
            exp.thanos_sidecars.append(
                Endpoint(
                    host,
                    f"{tls_material.scheme(v)}://{address}:{v['prometheus_thanos_sidecar_http_port']}",
                )
            )
            exp.thanos_stores.append(f"{address}:{v.get('thanos_sidecar_grpc_port', 10901)}")
    if first is not None:
        exp.targets = file_sd.expected_targets(first)
        if any(r.shard for r in exp.replicas):
            exp.replica_targets = {
                h: file_sd.expected_targets(v) for h, v in prometheus_vars.items()
            }
            union: dict[tuple[str, str], Target] = {}
            for rep in exp.replicas:
                for t in exp.replica_targets[rep.host]:
                    union.setdefault((t.job, t.instance), t)
                    if t.job in shards.SHARDED_JOBS:
                        exp.node_shards[t.node] = rep.shard
            exp.targets = list(union.values())
        hostvars = first["hostvars"]
        for node in file_sd.members(first, [first["prometheus_gpu_group"]]):
            count = hostvars[node].get("gpu_count")
            if count is not None:
                exp.gpus[node] = int(count)
            else:
                exp.gpu_records[node] = f"{DEFAULT_TEXTFILE_DIR}/{RECORD_FILE}"
    for v in [*prometheus_vars.values(), *alertmanager_vars.values()][:1]:
        # read-only: a directory without the tier's credentials is an error, never a new CA
        given = tls_material.client(v, create=False)
        if given is not None:
            exp.client_tls = ClientTLS(given["ca_pem"], given["username"], given["password"])
    for host, v in alertmanager_vars.items():
        address = str(v.get("ansible_host", host))
        config_dir = str(v["alertmanager_config_dir"])
        exp.alertmanagers.append(
            Peer(
                host=host,
                url=f"{tls_material.scheme(v)}://{address}:{v['alertmanager_port']}",
                cluster_address=f"{v['alertmanager_advertise_address']}:{v['alertmanager_cluster_port']}",
                config_file=f"{config_dir}/alertmanager.yml",
                # Alertmanager reads relative template paths from the config file's directory.
                templates=tuple(
                    t if str(t).startswith("/") else f"{config_dir}/{t}"
                    for t in (v.get("alertmanager_templates") or [])
                ),
            )
        )
    for host, v in query_vars.items():
        if truthy(v["thanos_active"]):
            exp.thanos_active = True
            address = str(v.get("ansible_host", host))
            exp.thanos_queries.append(
                Endpoint(
                    host, f"{tls_material.scheme(v)}://{address}:{v['thanos_query_http_port']}"
                )
            )
    return exp


def load_expectation(
    inventory: Path, extra_vars: list[str] | None = None, site: Path | None = None
) -> StackExpectation:
    """The expectation for an inventory: each role host's variables resolved as ``up`` resolves
    them (the site's plays, role defaults < group < host < extra vars). Touches no host."""
    from deployer.plan import Planner
    from deployer.roles import load_site
    from deployer.session import (
        DEFAULT_ROLES,
        DEFAULT_SITE,
        SHARED_TEMPLATES,
        DeploySession,
        RunOptions,
        role_hosts,
        role_variables,
        ssh_target,
    )

    session = DeploySession.load(
        RunOptions(inventory=inventory, extra_vars=list(extra_vars or [])), plan=False
    )
    plays = load_site(site or DEFAULT_SITE)
    roles_path = [DEFAULT_ROLES] if site is None else [site.parent / "roles", DEFAULT_ROLES]
    planner = Planner(session.inventory, roles_path, SHARED_TEMPLATES)

    resolved: dict[str, dict[str, Mapping[str, Any]]] = {}

    def variables_of(role: str) -> dict[str, Mapping[str, Any]]:
        if role not in resolved:
            resolved[role] = role_variables(session.inventory, plays, planner, role)
        return resolved[role]

    from deployer.monitoring import handoff, store
    from deployer.monitoring.http import use_tls

    # A shard layout record ``up`` would refuse (another tier's) is a finding here, not the end
    # of ``status``: the stack is still there to check.
    with handoff.diagnosing() as record_problems:
        exp = expect(
            variables_of("prometheus"), variables_of("alertmanager"), variables_of("thanos_query")
        )
        use_tls(exp.client_tls)
        exp.store = store.expect(variables_of)
        exp.reshards = handoff.changes()
    exp.record_problems = record_problems
    exp.inventory = str(Path(inventory).resolve())
    if exp.reshards:
        from deployer import run_lock

        exp.changing_run = run_lock.holder(inventory)
    if not exp.replicas and not exp.alertmanagers:
        raise InputError(
            "no host of the inventory is in a Prometheus or Alertmanager play of the site: "
            "nothing to check",
            source=str(inventory),
        )
    exp.gpu_hosts = list(role_hosts(session.inventory, plays, "nvidia_driver"))
    if exp.gpu_records:
        for h, v in variables_of("node_exporter").items():
            if h in exp.gpu_records:
                exp.gpu_records[h] = f"{v['node_exporter_textfile_dir']}/{RECORD_FILE}"
    if any("gpumon_scheduler" in session.inventory.host(h).vars for h in exp.gpu_hosts):
        from deployer.monitoring import slurm

        exp.slurm = slurm.expect_slurm(
            variables_of("nvidia_driver"), session.inventory.hosts, str(inventory)
        )
    slurm_hosts = [h for h in (exp.slurm.clusters if exp.slurm else ()) if h != "controller"]
    for h in [
        *exp.gpu_hosts,
        *exp.gpu_records,
        *(r.host for r in [*exp.replicas, *exp.global_replicas]),
        *(p.host for p in exp.alertmanagers),
        *slurm_hosts,
    ]:
        exp.ssh[h] = ssh_target(session.inventory.connection(h))
    return exp
