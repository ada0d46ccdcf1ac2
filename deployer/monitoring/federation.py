"""The federation tier: a ``prometheus_global`` HA pair that federates the shards' records (pure).

One inventory variable, ``gpumon_global_tier``, says how the shards' data reaches one place:

- ``remote_write`` (the default): every shard replica writes every sample to the long-term store
  (deployer/monitoring/remote_write.py), the store is the global view;
- ``federation``: no remote write; the hosts of the ``prometheus_global`` group (an HA pair, run
  by the prometheus role with ``serial: 1`` like the shards) scrape ``/federate`` of every replica
  of every shard, asking (``match[]``) only for the records the shards evaluate at their boundary
  (``roles/prometheus/templates/rules/shard-recording.yml.j2``: GPUs, utilization, power, memory and
  health counts per cluster and GPU model, the ``cluster_model:`` level), and evaluate the global
  records and alerts on them (``rules/global-federation.yml.j2``);
- ``both``: the two at once (edge Prometheus with their own dashboards, a store for history).

The federate job (prometheus/prometheus docs/federation.md, "Configuring federation", commit
acfafae9b2aae996885e7a00636991d73ee01093) sets ``honor_labels: true`` so the federated series keep
their own labels, and ``/federate`` attaches the source's external labels to each series that
lacks them, and an empty ``instance`` so the federating target's ``instance`` is not added
(web/federate.go, "Attach global labels if they do not exist yet", commit
906855e4d83f6ffcd178da225d1401ea9e53f7a3): each record arrives with its shard's ``cluster``,
``shard`` and ``replica``. Both replicas of a shard are federated (a shard stays visible while one
replica serves), so each record arrives twice, told apart by ``replica`` (and the target label
``node``). That is kept on purpose and resolved in the global rules, ``max without (instance,
node, replica)`` per shard, then a sum over the shards: dropping ``replica`` at scrape time
instead (``metric_relabel_configs``) would fold two replicas' samples into one series, whose
samples collide (storage/interface.go ``ErrOutOfOrderSample``,
``ErrDuplicateSampleForTimestamp``, commit d28d33afe06ff063520d927d18333288644e6592: the later
replica's samples refused or interleaved) and whose values alternate between the replicas.
``max`` keeps the more complete replica's
view of a count (a replica that restarted and missed a scrape counts fewer GPUs, not more).

The job ignores the samples' own timestamps (``honor_timestamps: false``): "Staleness will not be
marked for time series that have timestamps included in their scrapes. Only the 5 minute threshold
will be applied in that case" (docs/querying/basics.md, "Staleness", commit
6dd98681cf4e5535807777625dd341577b5c4706), so with them a stopped shard's records stayed in the
global counts for 5 minutes (seen on the lab: shard b stopped, its alert firing, the global GPU
count still 8 of 4); at the scrape's time they go stale with the failed scrape.

A shard whose replicas all stop is seen in two ways here: its federate targets are down
(``PrometheusShardUnreachable`` for all of its replicas), and its records leave the global rules.

Bad input: an unknown mode, federation asked for without a host in the global group, or hosts in
the group while the mode leaves federation out, are an ``InputError`` naming the host and the key
(exit 2 before any host is touched: the templates call this module at plan time).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deployer.errors import InputError
from deployer.monitoring import shards
from deployer.monitoring.file_sd import Target

MODE_VAR = "gpumon_global_tier"
MODES = ("remote_write", "federation", "both")
GROUP_VAR = "prometheus_global_group"
# The recorded series the shards evaluate for the global tier (shard-recording.yml.j2) and the
# federate job asks for: one name prefix, so a new record there needs no edit here.
RECORD_PREFIX = "cluster_model:"
MATCH = f'{{__name__=~"{RECORD_PREFIX}.+"}}'


def _host(variables: Mapping[str, Any]) -> str:
    return str(variables.get("inventory_hostname", "?"))


def mode(variables: Mapping[str, Any]) -> str:
    """The chosen mode, checked: an unknown one is refused, as is a mode that contradicts the
    inventory's ``prometheus_global`` group."""
    value = str(variables.get(MODE_VAR) or "remote_write")
    if value not in MODES:
        raise InputError(
            f"host {_host(variables)}: {value!r} is not one of {', '.join(MODES)}", key=MODE_VAR
        )
    hosts = global_hosts(variables)
    group = str(variables.get(GROUP_VAR) or "prometheus_global")
    if value == "remote_write" and hosts:
        raise InputError(
            f"host {_host(variables)}: the {group} group has hosts ({', '.join(hosts[:3])}) but "
            f"{MODE_VAR} is remote_write: set it to federation or both, or empty the group",
            key=MODE_VAR,
        )
    if value != "remote_write" and not hosts:
        raise InputError(
            f"host {_host(variables)}: {MODE_VAR} is {value} but the {group} group has no host "
            "to federate the shards",
            key=MODE_VAR,
        )
    return value


def global_hosts(variables: Mapping[str, Any]) -> list[str]:
    group = str(variables.get(GROUP_VAR) or "prometheus_global")
    return list(dict.fromkeys(variables["groups"].get(group, [])))


def is_global(variables: Mapping[str, Any]) -> bool:
    """Whether this host is a replica of the global (federating) pair."""
    return _host(variables) in global_hosts(variables)


def split(
    prometheus_vars: Mapping[str, Mapping[str, Any]],
) -> tuple[dict[str, Mapping[str, Any]], dict[str, Mapping[str, Any]]]:
    """The hosts the prometheus role runs on, each with its variables, as (shard replicas,
    global pair): a host of the global group is rendered as a global replica (``is_global``)."""
    shard_vars: dict[str, Mapping[str, Any]] = {}
    global_vars: dict[str, Mapping[str, Any]] = {}
    for host, v in prometheus_vars.items():
        (global_vars if is_global(v) else shard_vars)[host] = v
    return shard_vars, global_vars


def remote_write_on(variables: Mapping[str, Any]) -> bool:
    """Whether this replica remote-writes: a shard replica unless the mode is federation only;
    never a global replica (its inputs are already in the store, or are not wanted there)."""
    if is_global(variables):
        mode(variables)
        return False
    return mode(variables) != "federation"


def peers(variables: Mapping[str, Any]) -> list[str]:
    """The restart handler's HA peers: the global pair's replicas for a global replica, else the
    replica's own shard's (deployer/monitoring/shards.py)."""
    if is_global(variables):
        return global_hosts(variables)
    return shards.peers(variables)


def federated_replicas(variables: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(replica, shard) of every shard replica the global pair federates; shard "" when the tier
    is one pair."""
    replicas = list(dict.fromkeys(variables["groups"].get(variables["prometheus_group"], [])))
    of, _ = shards.layout(variables)
    return [(r, of.get(r, "")) for r in replicas]


def scrape_configs(
    variables: Mapping[str, Any], tls: Mapping[str, Any], tls_dir: str
) -> list[dict[str, Any]]:
    """The global replica's scrape jobs: ``federate`` (every shard replica, its shard and host as
    target labels); empty on a shard replica. ``tls``: the template global
    ``gpumon_tls_material()`` of this host; ``tls_dir``: where its client password lies."""
    if not is_global(variables):
        return []
    mode(variables)
    job: dict[str, Any] = {
        "job_name": str(variables["prometheus_federation_job"]),
        "honor_labels": True,
        # each sample at the scrape's time, so a stopped shard's records go stale at once
        "honor_timestamps": False,
        "metrics_path": "/federate",
        "params": {"match[]": [MATCH]},
        "scrape_interval": str(variables["prometheus_federation_interval"]),
        "scrape_timeout": str(variables["prometheus_federation_timeout"]),
    }
    if tls.get("enabled"):
        job["scheme"] = "https"
        job["tls_config"] = {"ca_file": tls["ca_file"]}
        job["basic_auth"] = {
            "username": str(tls["username"]),
            # the credential slot clients send now (deployer/tls/rotation.py): during a
            # rotation it is client-password-2, and the user and file move together
            "password_file": f"{tls_dir}/{tls['client_password_file']}",
        }
    job["static_configs"] = target_groups(variables)
    return [job]


def target_groups(variables: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The federate job's static target groups: one per shard replica, its address and port,
    its host (``node``) and its shard as target labels."""
    hostvars = variables["hostvars"]
    groups = []
    for replica, shard in federated_replicas(variables):
        hv = hostvars[replica]
        port = hv.get("prometheus_port", variables["prometheus_port"])
        labels = {"node": replica}
        if shard:
            labels[str(variables["prometheus_shard_label"])] = shard
        address = f"{hv.get('ansible_host', replica)}:{port}"
        groups.append({"targets": [address], "labels": labels})
    return groups


def expected_targets(variables: Mapping[str, Any]) -> list[Target]:
    """Every target a global replica must scrape (each shard replica's /federate), for
    ``status``."""
    job = str(variables["prometheus_federation_job"])
    return [
        Target(job, address, str(g["labels"]["node"]))
        for g in target_groups(variables)
        for address in g["targets"]
    ]
