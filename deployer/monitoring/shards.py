"""Which Prometheus shard (HA pair) scrapes which host (pure: no I/O, but for the assignment of
a large tier remembered between runs, deployer/monitoring/shard_memo.py).

The inventory shape: every replica in the ``prometheus`` group sets ``prometheus_shard`` (the
usual way: one child group of ``prometheus`` per pair, ``prometheus_shard`` in its group vars).
No replica setting it is one pair, as before: every replica scrapes every target. Once any
replica sets it, every replica must, and each shard needs its own replicas.

The product assigns the GPU and node targets itself, in each pair's file_sd, by rendezvous
(highest-random-weight) hashing: a host goes to the shard whose ``hash(shard, key)`` is highest.
So the assignment is deterministic (the same inventory, the same files on every controller), a
host added or removed moves no other host, and adding or removing a shard moves only the hosts
that go to, or came from, that shard (about 1/n of them). A host's ``dcgm`` and ``node`` targets
follow the host, so they are always in the same shard. ``prometheus_shard_by: rack`` keys on the
host's ``rack`` (a host without one keys on its name): a rack's hosts stay together.

Prometheus' own ``hashmod`` relabelling is not used: each replica would need its own ``keep``
regex, and a wrong one drops targets silently (prometheus/prometheus#14101); here the assignment
is data, ``status`` checks it against what each replica scrapes.

The stack's own daemons (``prometheus``, ``alertmanager``, ``thanos-sidecar``, ``victoriametrics``)
are scraped by every shard: each pair watches the others, so a pair that stops entirely is
alerted on by the rest (the ``prometheus`` job's replica-down alert).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from deployer.errors import InputError
from deployer.memory import collector_paused
from deployer.monitoring import host_values, shard_memo

SHARD_VAR = "prometheus_shard"
BY_VAR = "prometheus_shard_by"
BY_CHOICES = ("host", "rack")
SHARDED_JOBS = ("dcgm", "node")


def _weight_base(shard: str) -> Any:
    h = hashlib.blake2b(digest_size=8)
    h.update(shard.encode())
    h.update(b"\0")
    return h


def assign(keys: Iterable[str], shards: Sequence[str]) -> dict[str, str]:
    """Each key's shard by rendezvous hashing (ties broken by the shard's name)."""
    names = sorted(set(shards))
    if not names:
        raise ValueError("no shards to assign to")
    if len(names) == 1:
        return {k: names[0] for k in keys}
    bases = [(_weight_base(s), s) for s in names]
    out: dict[str, str] = {}
    for key in keys:
        if key in out:
            continue
        data = key.encode()
        best = None
        best_shard = names[0]
        for base, shard in bases:
            h = base.copy()
            h.update(data)
            w = h.digest()
            if best is None or w > best:
                best, best_shard = w, shard
        out[key] = best_shard
    return out


def shard_of_replicas(
    replicas: Sequence[str], hostvars: Mapping[str, Mapping[str, Any]]
) -> dict[str, str]:
    """Replica -> its shard; empty when no replica sets ``prometheus_shard`` (one pair).
    ``InputError`` naming the host and key when only some replicas set it."""
    found = {h: hostvars[h].get(SHARD_VAR) for h in replicas}
    named = {h: str(v) for h, v in found.items() if v not in (None, "")}
    if not named:
        return {}
    missing = [h for h in replicas if h not in named]
    if missing:
        raise InputError(
            f"host {missing[0]}: every Prometheus replica needs a shard once one has "
            f"({len(missing)} without: {', '.join(missing[:5])})",
            key=SHARD_VAR,
        )
    return named


def rack_key(host: str, rack: Any) -> str:
    """A host's key when hosts are sharded by rack: its rack, else the host alone."""
    return f"host:{host}" if rack in (None, "") else f"rack:{rack}"


_RACK = ("rack",)


def check_by(value: Any) -> str:
    by = str(value or "host")
    if by not in BY_CHOICES:
        raise InputError(f"{by!r} is not one of {', '.join(BY_CHOICES)}", key=BY_VAR)
    return by


def host_shards(
    hosts: Sequence[str],
    hostvars: Mapping[str, Mapping[str, Any]],
    shards: Sequence[str],
    by: str = "host",
    remembered: bool = False,
) -> dict[str, str]:
    """Each host's shard (hosts keyed by name, or by rack with ``by='rack'``). ``remembered``:
    a large assignment is kept on the controller between runs (the one I/O here, in
    deployer/monitoring/shard_memo.py); the same shards either way."""
    if by == "host":  # the name alone: no host's variables resolved
        keys = {h: f"host:{h}" for h in hosts}
    else:
        read = host_values.reader(hostvars)
        keys = {h: rack_key(h, read(h, _RACK)[0]) for h in hosts}
    if remembered:
        of_key = shard_memo.assign(list(keys.values()), shards, assign)
    else:
        of_key = assign(keys.values(), shards)
    return {h: of_key[k] for h, k in keys.items()}


def replicas(variables: Mapping[str, Any]) -> list[str]:
    """Every replica of the tier (the ``prometheus`` group), in inventory order, each once."""
    return list(dict.fromkeys(variables["groups"].get(variables["prometheus_group"], [])))


def layout(variables: Mapping[str, Any]) -> tuple[dict[str, str], str]:
    """From a replica's variables: replica -> shard (empty: not sharded) and the key kind."""
    by = check_by(variables.get(BY_VAR))
    return shard_of_replicas(replicas(variables), variables["hostvars"]), by


# The last assignments computed, with the hostvars object they were computed from (kept, so its
# id is not reused), as each shard's hosts: every replica's file_sd of every sharded job asks for
# its shard's part of the same assignment, and 100,000 hosts x 50 shards is seconds of hashing;
# filtering the whole host list once per shard and job made every shard's file_sd together
# grow with hosts x shards (shards grow with hosts: quadratic), a partition made once does not.
_MEMO: list[tuple[Any, tuple[str, ...], str, tuple[str, ...], dict[str, list[str]]]] = []
_MEMO_SIZE = 4


def _cached_partition(
    hosts: Sequence[str], hostvars: Mapping[str, Mapping[str, Any]], names: tuple[str, ...], by: str
) -> dict[str, list[str]]:
    """shard -> its hosts, in the order of ``hosts``."""
    key = tuple(hosts)  # the same object when hosts is a tuple (file_sd.members hands out one)
    for hv, n, b, k, got in _MEMO:
        if hv is hostvars and n == names and b == by and (k is key or k == key):
            return got
    with collector_paused():
        of_host = _assigned(key, hostvars, names, by)
        got: dict[str, list[str]] = {name: [] for name in names}
        for h in key:
            got[of_host[h]].append(h)
    _MEMO.insert(0, (hostvars, names, by, key, got))
    del _MEMO[_MEMO_SIZE:]
    return got


# Each host's shard once per (hostvars, shards, key kind), whichever job's host list asks: the
# dcgm and node jobs' lists share their GPU hosts, and hashing is hosts x shards blake2b digests.
_ASSIGNED: list[tuple[Any, tuple[str, ...], str, dict[str, str]]] = []


def _assigned(
    hosts: Sequence[str], hostvars: Mapping[str, Mapping[str, Any]], names: tuple[str, ...], by: str
) -> dict[str, str]:
    found = [k for hv, n, b, k in _ASSIGNED if hv is hostvars and n == names and b == by]
    known: dict[str, str] = found[0] if found else {}
    if not found:
        _ASSIGNED.insert(0, (hostvars, names, by, known))
        del _ASSIGNED[_MEMO_SIZE:]
    new = [h for h in hosts if h not in known]
    if new:
        known.update(host_shards(new, hostvars, names, by, remembered=True))
    return known


def partition(
    hosts: Sequence[str], hostvars: Mapping[str, Mapping[str, Any]], names: Sequence[str], by: str
) -> dict[str, list[str]]:
    """shard -> its hosts among ``hosts`` (in their order) under the layout ``names``/``by``."""
    return _cached_partition(hosts, hostvars, tuple(names), by)


def members_of_shard(variables: Mapping[str, Any], hosts: Sequence[str], shard: str) -> list[str]:
    """Those of ``hosts`` (a sharded job's members) that ``shard`` scrapes, in their order."""
    replica_shards, by = layout(variables)
    names = tuple(sorted(set(replica_shards.values())))
    return list(_cached_partition(hosts, variables["hostvars"], names, by).get(shard, ()))


def peers(variables: Mapping[str, Any]) -> list[str]:
    """The replicas of this replica's pair (its shard's, itself included); every replica of the
    ``prometheus`` group when the tier is not sharded. The restart handler's HA peers: a replica
    restarts only while another replica of its own pair serves."""
    tier = replicas(variables)
    own = variables.get(SHARD_VAR)
    if own in (None, ""):
        return tier
    replica_shards, _ = layout(variables)
    return [r for r in tier if replica_shards.get(r) == str(own)]
