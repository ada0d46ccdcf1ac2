"""The replicas' ``remote_write`` section, computed from the inventory (pure: no I/O).

Every host of the long-term store's group (``metrics_store_group``, role victoriametrics) gets one
``remote_write`` entry on each Prometheus replica, so both replicas write every sample to every
store. Two things make the pair's samples land on one series in the store:

- ``write_relabel_configs`` drops the replica's ``replica`` external label on the way. Prometheus
  adds the external labels to a series *before* it applies the write relabelling
  (prometheus/prometheus v2.42.0, commit 225c61122d88b01d1f0eaaee0e05b6f3e0567ac0,
  storage/remote/queue_manager.go:824-825, ``StoreSeries``: ``processExternalLabels`` then
  ``relabel.Process``), so the drop sees it; every other label, ``cluster`` included, is kept.
- VictoriaMetrics' ``-dedup.minScrapeInterval`` keeps one sample per series and interval (role
  victoriametrics).

On a sharded tier a host's own series (those with a ``node`` label: its dcgm and node targets'
series and the per-GPU and per-node records made of them) also lose the ``shard`` external label
on the way: which shard scraped a host is not part of what the host measured. A host that moves
to another shard (a re-shard hands it over, deployer/monitoring/handoff.py) is then one series in
the store, written by the old and the new owner while both scrape it and deduplicated as a pair's
are, not two series under two shard labels that a sum over the global view counts twice until the
old one leaves the store's lookback (5.5 minutes). A shard's aggregates (no ``node``: the
``cluster:`` and ``cluster_model:`` records, each shard's own part of a sum) and the stack's own
targets, which every shard scrapes, keep it. A ``replace`` whose replacement is empty deletes the
target label (prometheus/prometheus model/relabel/relabel.go ``relabel``, case ``Replace``:
``if len(res) == 0 { lb.Del(...) }``, commit 02a325539b6ad3745e799c0a24c4e44b2698e651).

The queue is sized from the targets the replica scrapes (the same file_sd targets the role writes)
and their intervals: :func:`samples_per_second` estimates what one replica ingests, and
:func:`queue_config` turns it into shards and a buffer that keep up with it and replay what piled
up in the WAL during a store outage (``prometheus_remote_write_catch_up``). The formulas are in the
README ("Long-term storage").

The prometheus role's ``prometheus.yml.j2`` calls :func:`remote_write_section` (the template
global ``remote_write_section``), so there is one implementation;
tests/unit/test_victoriametrics_role.py checks it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from deployer.monitoring import federation, file_sd, host_values, shards
from deployer.tls import material as tls_material

# Prometheus' duration units (model.ParseDuration).
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")

# Prometheus' own upper bound default for max_shards (config.DefaultQueueConfig, v2.42.0
# config/config.go:178).
MAX_SHARDS_CEILING = 200


def seconds(duration: Any) -> float:
    """A Prometheus duration (``15s``, ``1m30s``, ``2h``) in seconds."""
    text = str(duration).strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Prometheus duration: {duration!r}")
    return sum(int(n) * _UNITS[u] for n, u in parts)


def store_hosts(variables: Mapping[str, Any]) -> list[str]:
    """The long-term store hosts, in inventory order."""
    return file_sd.members(variables, [variables["metrics_store_group"]])


def store_base_url(variables: Mapping[str, Any], host: str) -> str:
    """``scheme://address:port`` of one store host, as the replicas reach it."""
    hv = variables["hostvars"][host]
    scheme = hv.get("metrics_store_scheme", variables["metrics_store_scheme"])
    port = hv.get("metrics_store_port", variables["metrics_store_port"])
    return f"{scheme}://{hv.get('ansible_host', host)}:{port}"


def store_write_url(variables: Mapping[str, Any], host: str) -> str:
    """The store's Prometheus remote-write endpoint (VictoriaMetrics: ``/api/v1/write``)."""
    return store_base_url(variables, host) + "/api/v1/write"


def remote_name(host: str) -> str:
    """The ``name`` of the queue to ``host`` (Prometheus' ``remote_name`` label)."""
    return f"store-{host}"


def auth_enabled(variables: Mapping[str, Any]) -> bool:
    return bool(str(variables.get("metrics_store_username") or "")) and bool(
        str(variables.get("metrics_store_password") or "")
    )


_READS = ("scrape_tier", "gpu_count")  # of each dcgm and node target's host


def samples_per_second(variables: Mapping[str, Any]) -> float:
    """Samples per second one replica ingests: per target of every job it scrapes (the hosts
    file_sd gives each job), its estimated series divided by its scrape interval (for dcgm and
    node targets the host's tier's, else the global one); dcgm targets count their host's GPUs.
    Reads the hosts' variables only, building no target groups (100,000 hosts in well under a
    second; bench/planning.py)."""
    estimate = variables["prometheus_remote_write_series_estimate"]
    default_every = seconds(variables["prometheus_scrape_interval"])
    tiers = {
        str(name): seconds(tier["interval"])
        for name, tier in variables["prometheus_scrape_tiers"].items()
    }
    read = host_values.per_host(variables["hostvars"], _READS)
    per_gpu = int(estimate["dcgm_per_gpu"])
    counted = variables.get("gpumon_gpu_counts") or {}
    total = 0.0
    for job in variables["prometheus_scrape_jobs"]:
        hosts = file_sd.job_members(variables, job)
        if job not in ("dcgm", "node"):
            total += len(hosts) * int(estimate.get(job, estimate["other"])) / default_every
            continue
        flat = int(estimate.get(job, estimate["other"]))
        for h in hosts:
            tier, gpus = read(h)
            every = tiers.get(str(tier), default_every) if tier is not None else default_every
            if job == "dcgm":
                # The plan's count: the declared gpu_count, else what the host's facts counted
                # (the session's ``gpumon_gpu_counts``), else (no facts read: check --offline,
                # an unreachable host) an estimate of 8.
                if gpus is None:
                    gpus = counted.get(h)
                series = int(gpus if gpus is not None else 8) * per_gpu
            else:
                series = flat
            total += series / every
    return total * (1 + float(variables["prometheus_remote_write_rules_overhead"]))


def queue_config(variables: Mapping[str, Any], rate: float) -> dict[str, Any]:
    """Queue settings for ``rate`` samples/s (the README gives the reasoning).

    One shard moves ``max_samples_per_send / request_seconds`` samples/s. ``min_shards`` carries
    the steady rate; ``max_shards`` the rate plus the WAL's backlog after an outage of
    ``wal_span`` replayed within ``catch_up`` (Prometheus raises shards between the two on its
    own); ``capacity`` buffers a few requests per shard.
    """
    per_send = int(variables["prometheus_remote_write_max_samples_per_send"])
    per_shard = per_send / seconds(variables["prometheus_remote_write_request_duration"])
    backlog = seconds(variables["prometheus_remote_write_wal_span"]) / seconds(
        variables["prometheus_remote_write_catch_up"]
    )
    floor = int(variables["prometheus_remote_write_min_max_shards"])
    max_shards = min(MAX_SHARDS_CEILING, max(floor, math.ceil(rate * (1 + backlog) / per_shard)))
    min_shards = min(max_shards, max(1, math.ceil(rate / per_shard)))
    return {
        "capacity": per_send * int(variables["prometheus_remote_write_capacity_sends"]),
        "max_shards": max_shards,
        "min_shards": min_shards,
        "max_samples_per_send": per_send,
        "batch_send_deadline": str(variables["prometheus_remote_write_batch_send_deadline"]),
        "min_backoff": str(variables["prometheus_remote_write_min_backoff"]),
        "max_backoff": str(variables["prometheus_remote_write_max_backoff"]),
    }


def remote_write_configs(variables: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One ``remote_write`` entry per store host, then the user's extra entries as given."""
    hosts = store_hosts(variables) if _enabled(variables) else []
    out: list[dict[str, Any]] = []
    if hosts:
        queue = queue_config(variables, samples_per_second(variables))
        replica_label = str(variables["prometheus_replica_label"])
        for host in hosts:
            entry: dict[str, Any] = {
                "url": store_write_url(variables, host),
                "name": remote_name(host),
                "remote_timeout": str(variables["prometheus_remote_write_timeout"]),
                # The pair's samples become one series in the store: the replica label goes,
                # and on a sharded tier a host's own series' shard label.
                "write_relabel_configs": write_relabel_configs(variables, replica_label),
                "queue_config": dict(queue),
            }
            if entry["url"].startswith("https://"):
                # gpumon_tls: the store serves the tier's certificate (role victoriametrics).
                entry["tls_config"] = {"ca_file": tls_material.HOST_CA_FILE}
            if auth_enabled(variables):
                entry["basic_auth"] = {
                    "username": str(variables["metrics_store_username"]),
                    "password_file": str(variables["prometheus_remote_write_password_file"]),
                }
            out.append(entry)
    out.extend(dict(e) for e in variables.get("prometheus_remote_write_extra") or [])
    return out


def write_relabel_configs(variables: Mapping[str, Any], replica_label: str) -> list[dict[str, Any]]:
    """The replica label dropped; on a sharded tier also the shard label of every series with a
    ``node`` label from a sharded job, or from no job (a record made of such series)."""
    out: list[dict[str, Any]] = [{"action": "labeldrop", "regex": replica_label}]
    if variables.get(shards.SHARD_VAR) in (None, ""):
        return out
    jobs = "|".join(re.escape(j) for j in shards.SHARDED_JOBS)
    out.append({
        "source_labels": ["node", "job"],
        "separator": ";",
        "regex": f".+;(?:{jobs})?",
        "target_label": str(variables["prometheus_shard_label"]),
        "replacement": "",
        "action": "replace",
    })  # fmt: skip
    return out


def writes_to_store(variables: Mapping[str, Any]) -> bool:
    """Whether this replica remote-writes to the store (status expects its queues then)."""
    return _enabled(variables)


def _enabled(variables: Mapping[str, Any]) -> bool:
    # federation only (gpumon_global_tier), or a replica of the global pair: no remote write
    return file_sd.truthy(variables["prometheus_remote_write_enabled"]) and (
        federation.remote_write_on(variables)
    )


def remote_write_section(variables: Mapping[str, Any]) -> dict[str, Any]:
    """``{"remote_write": [...]}`` for prometheus.yml, or ``{}`` when there is nothing to write."""
    configs = remote_write_configs(variables)
    return {"remote_write": configs} if configs else {}
