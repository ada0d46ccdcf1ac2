"""Prometheus file-based discovery targets generated from the inventory (pure: no I/O).

One targets file per scrape job (``dcgm``, ``node``, ``prometheus``, ``alertmanager``,
``thanos-sidecar``, ``victoriametrics``), each a list of ``{"targets": [...], "labels": {...}}`` groups, one group per
host. GPU-host targets carry the inventory metadata the rules join on (``node`` plus the host vars
named in ``prometheus_target_label_vars``: cluster, rack, gpu_model, slurm_partition, scrape_tier)
and, for a host whose ``scrape_tier`` is a configured tier, that tier's ``__scrape_interval__`` and
``__scrape_timeout__``, so changing tiers needs no reload either.

A targets file is JSON with one target group per line (sorted keys, the C encoder: 100,000
hosts' groups are encoded in a fraction of what an indented dump takes). The prometheus role
writes exactly these files: its template ``templates/file_sd.json.j2`` calls
:func:`targets_file` (registered as the template global ``file_sd_targets_file``), so there is
one implementation; tests/unit/test_file_sd.py checks what the role plans.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

from deployer.booleans import truthy
from deployer.memory import collector_paused
from deployer.monitoring import handoff, host_values, shards

JOBS = ("dcgm", "node", "prometheus", "alertmanager", "thanos-sidecar", "victoriametrics")


@dataclass(frozen=True)
class Target:
    """One expected scrape target: its job, ``instance`` (host:port) and inventory host."""

    job: str
    instance: str
    node: str


def _address(hv: Mapping[str, Any], host: str) -> str:
    return str(hv.get("ansible_host", host))


def _unique(hosts: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(hosts))  # in order, each once (C speed: called per shard and job)


class _Labels:
    """The labels of GPU-host targets, with the job's settings read once (not once per host),
    and each host's target once made (``targets``: for every job and shard that scrapes it)."""

    def __init__(self, variables: Mapping[str, Any]) -> None:
        self.names = list(variables["prometheus_target_label_vars"])
        self.tiers = variables["prometheus_scrape_tiers"]
        self._tier_labels: dict[str, dict[str, str]] = {}
        # What ``of`` reads of a host, in this order: the label variables, its tier, its address.
        self.reads = (*self.names, "scrape_tier", "ansible_host")
        self.targets: dict[str, _HostTarget] = {}
        # The labels of the hosts of equal label values but their names (a rack's), with the
        # JSON around the name (``target``); None where the labels do not carry the name alone.
        self._shared: dict[tuple[str | None, ...], tuple[dict[str, str], str, str] | None] = {}
        # Kept to a bound: labels each host has its own of (a per-host label variable) would be
        # held twice over, each in a shared set no other host reads.
        self._most_shared = max(_SHARED_MIN, len(variables["hostvars"]) // 8)

    def of(self, values: Sequence[Any], host: str) -> dict[str, str]:
        """The labels of ``host`` from its values of ``reads``."""
        labels = {"node": host}
        # ``values`` holds the names' values, then the tier and the address (``reads``)
        for name, value in zip(self.names, values, strict=False):
            if value is not None:
                labels[name] = str(value)
        tier = values[-2]
        if tier is not None and str(tier) in self.tiers:
            labels.update(self._tier(str(tier)))
        return labels

    def target(self, values: Sequence[Any], host: str, address: str) -> _HostTarget:
        """``host``'s target, its labels (``of``) and their JSON (``_encode_group``) made from
        those of the hosts with the same label values: a label is the text of its value, so
        those hosts' labels differ in ``node`` alone, and the JSON is the same text around the
        name's (encoding 100,000 hosts' labels whole was half of their targets file)."""
        key = tuple([None if v is None else str(v) for v in values[:-1]])
        shared = self._shared.get(key, _UNSEEN)
        if shared is _UNSEEN:
            if len(self._shared) >= self._most_shared:
                return _HostTarget(address, self.of(values, host))
            shared = self._shared[key] = self._around_name(values)
        if shared is None:
            return _HostTarget(address, self.of(values, host))
        labels, before, after = shared
        return _HostTarget(address, {**labels, "node": host}, before + _encode_text(host) + after)

    def _around_name(self, values: Sequence[Any]) -> tuple[dict[str, str], str, str] | None:
        labels = self.of(values, _NAME_MARK)
        if labels.get("node") is not _NAME_MARK:  # a label variable named node: its own value
            return None
        parts = _encode_group(labels).split(_ENCODED_NAME_MARK)
        if len(parts) != 2:  # the mark in a value too
            return None
        return labels, parts[0], parts[1]

    def _tier(self, name: str) -> dict[str, str]:
        got = self._tier_labels.get(name)
        if got is None:
            tier = self.tiers[name]
            got = self._tier_labels[name] = {
                "__scrape_interval__": str(tier["interval"]),
                "__scrape_timeout__": str(tier["timeout"]),
            }
        return got


def members(variables: Mapping[str, Any], group_names: Sequence[str]) -> tuple[str, ...]:
    """Hosts of the named inventory groups, in inventory order, each once (a tuple: the same
    object to every caller until the groups change, never a copy)."""
    groups = variables["groups"]
    names = tuple(group_names)
    sizes = tuple(len(groups.get(g, ())) for g in names)
    for g, n, z, got in _MEMBERS:
        if g is groups and n == names and z == sizes:
            return got
    got = tuple(dict.fromkeys(chain.from_iterable(groups.get(g, ()) for g in names)))
    _MEMBERS.insert(0, (groups, names, sizes, got))
    del _MEMBERS[8:]
    return got


# The last members computed, with the groups object they came from (kept, so its id is not
# reused) and the groups' sizes: every shard's file_sd of a job asks for the same members
# (100,000 hosts, once per shard and job: what made every shard's file_sd grow with hosts x shards).
# Handed out as they are (tuples): a copy per shard and job was 100,000 references each time, and
# the shard partition (shards.py) knows a host list it has partitioned by its identity.
_MEMBERS: list[tuple[Any, tuple[str, ...], tuple[int, ...], tuple[str, ...]]] = []


def every_gpu_host(variables: Mapping[str, Any]) -> Sequence[str]:
    """The GPU hosts of the whole tier, whichever shard scrapes them (``job_members`` of
    ``dcgm`` is the replica's own shard's)."""
    return members(variables, [variables["prometheus_gpu_group"]])


def job_members(variables: Mapping[str, Any], job: str) -> Sequence[str]:
    """Which inventory hosts ``job`` scrapes (the sidecar job only when the sidecar is on)."""
    if job == "dcgm":
        return _own_shard(variables, every_gpu_host(variables))
    if job == "node":
        return _own_shard(variables, members(variables, variables["prometheus_node_groups"]))
    if job in ("prometheus", "thanos-sidecar"):
        if job == "thanos-sidecar" and not truthy(variables["prometheus_thanos_sidecar"]):
            return []
        return members(variables, [variables["prometheus_group"]])
    if job == "alertmanager":
        return members(variables, [variables["prometheus_alertmanager_group"]])
    if job == "victoriametrics":  # the long-term store (role victoriametrics)
        return members(variables, [variables["metrics_store_group"]])
    raise KeyError(f"no scrape job {job!r}; jobs: {', '.join(JOBS)}")


def _own_shard(variables: Mapping[str, Any], hosts: Sequence[str]) -> Sequence[str]:
    """The hosts of a GPU/node job this replica's shard scrapes (all of them when the tier is
    not sharded: deployer/monitoring/shards.py), and while a re-shard hands over
    (deployer/monitoring/handoff.py) also those its shard scraped in the recorded layout."""
    shard = variables.get(shards.SHARD_VAR)
    replica_shards, by = shards.layout(variables)
    tier = tuple(shards.replicas(variables))
    if shard in (None, ""):
        # One pair's replica records the tier's layout. The whole tier of a sharded one (a
        # global replica's view, capacity's) is every host, and records nothing: as one pair it
        # overwrote the shards' layout in the same record, and no re-shard handed over.
        if not replica_shards:
            handoff.previous(variables, handoff.Layout(handoff.UNSHARDED, by, tier))
        return hosts
    now = shards.members_of_shard(variables, hosts, str(shard))
    names = tuple(sorted(set(replica_shards.values())))
    old = handoff.previous(variables, handoff.Layout(names, by, tier))
    if old is None:
        return now
    if old.names == handoff.UNSHARDED:  # one pair scraped every host, no other replica any
        return hosts if old.scraped_everything(str(variables["inventory_hostname"])) else now
    if str(shard) not in old.names:  # a new shard: it takes over, it hands nothing over
        return now
    before = shards.partition(hosts, variables["hostvars"], old.names, old.by)[str(shard)]
    keep = set(now).union(before)
    return [h for h in hosts if h in keep]


def job_hosts(variables: Mapping[str, Any]) -> dict[str, Sequence[str]]:
    """Which inventory hosts each job scrapes."""
    return {job: job_members(variables, job) for job in JOBS}


def job_ports(variables: Mapping[str, Any]) -> dict[str, int]:
    return {
        "dcgm": int(variables["prometheus_dcgm_exporter_port"]),
        "node": int(variables["prometheus_node_exporter_port"]),
        "prometheus": int(variables["prometheus_port"]),
        "alertmanager": int(variables["prometheus_alertmanager_port"]),
        "thanos-sidecar": int(variables["prometheus_thanos_sidecar_http_port"]),
        "victoriametrics": int(variables["metrics_store_port"]),
    }


def job_targets(variables: Mapping[str, Any], job: str) -> list[dict[str, Any]]:
    """The target groups of ``job``, one per host, from one Prometheus host's variables."""
    # Every host's variables are resolved for its group and all stay alive until the file is
    # written: the cyclic collector, left on, rescans them again and again and frees none.
    with collector_paused():
        return _job_targets(variables, job)


def _job_targets(variables: Mapping[str, Any], job: str) -> list[dict[str, Any]]:
    port = job_ports(variables)[job]
    if job in LABELLED_JOBS:
        return [
            {"targets": [f"{t.address}:{port}"], "labels": t.labels}
            for t in _labelled(variables, job)
        ]
    hostvars = variables["hostvars"]
    return [
        {"targets": [f"{_address(hostvars[h], h)}:{port}"], "labels": {"node": h}}
        for h in job_members(variables, job)
    ]


# The jobs of GPU hosts: each target labelled with its host's inventory metadata.
LABELLED_JOBS = ("dcgm", "node")


@dataclass(slots=True)
class _HostTarget:
    """A host's address and target labels, and the labels as a targets file writes them."""

    address: str
    labels: dict[str, str]
    labels_json: str = ""


def _labelled(variables: Mapping[str, Any], job: str) -> list[_HostTarget]:
    hostvars = variables["hostvars"]
    labels = _labels_of(variables)
    known = labels.targets
    read, reads = host_values.reader(hostvars), labels.reads
    out = []
    for h in job_members(variables, job):
        got = known.get(h)
        if got is None:
            values = read(h, reads)
            address = values[-1]
            got = known[h] = labels.target(values, h, h if address is None else str(address))
        out.append(got)
    return out


# Each GPU host's address and target labels, once per (hostvars, label settings): the dcgm and
# node jobs of every shard label the same hosts, and each label is a lookup through the host's
# variable layers (of 100,000 hosts' file_sd, half the time went to labelling each host twice),
# and the hosts of a rack share their labels across shards (rendezvous hashing spreads a rack's
# hosts over every shard). The hostvars object is kept, so its id is not reused; the labels are
# shared, never changed.
_LABELS: list[tuple[Any, _Labels]] = []
# The shared label sets a run keeps at least (``_Labels``), however few its hosts
_SHARED_MIN = 1024


def _labels_of(variables: Mapping[str, Any]) -> _Labels:
    hostvars = variables["hostvars"]
    names = list(variables["prometheus_target_label_vars"])
    tiers = variables["prometheus_scrape_tiers"]
    for hv, labels in _LABELS:
        if hv is hostvars and labels.names == names and labels.tiers == tiers:
            return labels
    labels = _Labels(variables)
    _LABELS.insert(0, (hostvars, labels))
    del _LABELS[4:]
    return labels


def file_sd_targets(variables: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Target groups per job, from one Prometheus host's variables (``groups``, ``hostvars`` and
    the ``prometheus_*`` settings of the role)."""
    return {job: job_targets(variables, job) for job in JOBS}


_ENCODER = json.JSONEncoder(sort_keys=True)


def _group_encoder() -> Any:
    """One group's JSON as ``_ENCODER.encode`` writes it, by the C encoder built once (``encode``
    builds one per call: most of its time for a small group). Python's own when C is missing."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _ENCODER.encode
    encode = make(
        None,
        _ENCODER.default,
        json.encoder.encode_basestring_ascii,
        None,
        ": ",
        ", ",
        True,  # sort_keys
        False,  # skipkeys
        True,  # allow_nan
    )
    return lambda group: "".join(encode(group, 0))


_encode_group = _group_encoder()


def render(groups: list[dict[str, Any]]) -> str:
    """A targets file's text: a JSON list with one group per line, keys sorted."""
    return _lines(list(map(_encode_group, groups)))


def _lines(encoded: list[str]) -> str:
    """The text of the groups ``encoded`` (a list of the caller's own, which this changes): the
    brackets go onto the first and the last line, so that one join builds the whole text (the
    brackets added around the joined text copied it twice: 20 MB a file at 100,000 hosts)."""
    if not encoded:
        return "[]\n"
    encoded[0] = "[\n  " + encoded[0]
    encoded[-1] += "\n]\n"
    return ",\n  ".join(encoded)


def targets_file(variables: Mapping[str, Any], job: str) -> str:
    """The targets file of ``job`` (what the prometheus role writes to ``<job>.json``): its
    groups rendered. A GPU host's labels are encoded once for the dcgm and node jobs of every
    shard, and each group written around them as the encoder writes it (``"labels"`` sorts
    before ``"targets"``): encoding 200,000 groups whole was half of 100,000 hosts' targets
    files. The hosts' labels (``_LABELS``) are kept for the run."""
    with collector_paused(keep=True):
        if job not in LABELLED_JOBS:
            return render(_job_targets(variables, job))
        port = job_ports(variables)[job]
        encoded = []
        for t in _labelled(variables, job):
            if not t.labels_json:
                t.labels_json = _encode_group(t.labels)
            target = _encode_text(f"{t.address}:{port}")
            encoded.append(f'{{"labels": {t.labels_json}, "targets": [{target}]}}')
        return _lines(encoded)


_encode_text = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]
_UNSEEN: Any = object()
# A host name no inventory has (NUL is no YAML character), told apart by identity, and its JSON
_NAME_MARK = "\x00gpumon-node\x00"
_ENCODED_NAME_MARK = _encode_text(_NAME_MARK)


def common_cluster(variables: Mapping[str, Any], fallback: str) -> str:
    """The ``cluster`` every host this replica scrapes sets, when they agree; else ``fallback``.

    The default of the replica's external ``cluster`` label when its own host sets none: an
    inventory that names the cluster on its GPU hosts only (``group_vars/gpu.yml``) then labels the
    replica's own alerts (meta alerts, aggregated alerts) as its GPU alerts, not as ``fallback``.
    """
    read = host_values.reader(variables["hostvars"])
    with collector_paused():
        found = {
            str(value)
            for host in _unique([h for job in JOBS for h in job_members(variables, job)])
            if (value := read(host, _CLUSTER)[0]) not in (None, "")
        }
    return found.pop() if len(found) == 1 else fallback


_CLUSTER = ("cluster",)


def expected_targets(variables: Mapping[str, Any]) -> list[Target]:
    """Every (job, instance) a replica must scrape, for ``status``."""
    return [
        Target(job, target, group["labels"]["node"])
        for job, groups in file_sd_targets(variables).items()
        for group in groups
        for target in group["targets"]
    ]
