"""The ``status`` row that holds the federation tier's global pair to every GPU once (pure).

The global pair's ``global_cluster:gpus:count`` (roles/prometheus/templates/rules/
global-federation.yml.j2) is each shard's ``cluster_model:gpus:count`` taken once per shard (the
max over its replicas) and added up over the shards. It must equal the GPUs the shard replicas'
own rows hold the GPU nodes to (``gpus`` rows: the inventory's gpu_count, else what ``up``
recorded, else the facts): fewer is a shard the global view lost (its federate row says which),
more is a GPU counted twice (a shard label two shards share, replicas not deduplicated).

A record that lags is not a fault: the count moves through a shard replica's scrape and rule
evaluation, then the global pair's federate scrape and its own evaluation. A difference while a
global replica or a shard replica started within ``SETTLE_S``, or while one of the replica's
federate targets is pending, is pending; ``status --wait`` waits it out. So is a shortfall no
larger than the GPUs of the hosts a driven rollout has out of service (their exporters stopped
or rebooting: deployer/monitoring/rollouts.py ``out_of_service_now``), naming them, in each
shard: the global pair's view of each shard (:data:`SHARD_RECORD`) is held to that shard's own
nodes, so a rollout's hosts in one shard never cover GPUs another shard lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from deployer.monitoring.check import FAILED, OK, PENDING, Check

RECORD = "global_cluster:gpus:count"
QUERY = f"sum({RECORD})"
# Each shard's GPUs as the global pair receives them, recorded by the same rules, in the same
# evaluation, as RECORD (global-federation.yml.j2: the per-shard part of its ``once``)
SHARD_RECORD = "global_shard:gpus:count"
CHECK = "every GPU once"
# A shard replica's scrape and evaluation (15 s each), the federate scrape (30 s), the global
# evaluation (15 s), with a restarted daemon's own start-up on a loaded host.
SETTLE_S = 150.0


def shard_counts(answer: list[dict[str, Any]], shard_label: str) -> dict[str, float] | None:
    """Shard -> GPUs, from the vector :data:`SHARD_RECORD` answers; None for no series (rules
    rendered before the record existed, or not evaluated yet: the row is judged on the sum)."""
    if not answer:
        return None
    return {str(s["metric"].get(shard_label, "")): float(s["value"][1]) for s in answer}


def global_gpu_check(
    host: str,
    answer: list[dict[str, Any]] | str | None,
    counts: Mapping[str, int | None],
    federate_states: Iterable[str],
    young: bool,
    out_of_service: Mapping[str, str] | None = None,
    by_shard: Mapping[str, float] | None = None,
    node_shards: Mapping[str, str] | None = None,
) -> Check | None:
    """``answer``: the replica's vector for :data:`QUERY` (an error text; None: not asked, its
    ready row says why); ``counts``: GPU node -> the GPUs it is held to (None: unknown, that
    node's own row fails); ``federate_states``: the states of the replica's federate targets;
    ``young``: a global or shard replica started within ``SETTLE_S``; ``out_of_service``: GPU
    node -> why, for the hosts a driven rollout has out of service; ``by_shard``: the replica's
    GPUs per shard (:func:`shard_counts`; None: a tier of one pair, or not read) and
    ``node_shards``: node -> the shard that scrapes it."""
    if answer is None:
        return None
    if isinstance(answer, str):
        return Check("prometheus", host, CHECK, FAILED, f"{QUERY}: {answer}")
    unknown = sorted(n for n, c in counts.items() if c is None)
    if unknown:
        return Check(
            "prometheus", host, CHECK, PENDING,
            f"not judged: the GPUs of {', '.join(unknown)} are unknown (their gpus rows)",
        )  # fmt: skip
    want = sum(c for c in counts.values() if c is not None)
    have = sum(float(s["value"][1]) for s in answer)
    if answer and have == want:
        return Check("prometheus", host, CHECK, OK, f"{want:g}/{want:g} GPUs ({RECORD})")
    if not answer:
        detail = f"no {RECORD} yet (the shards' records not federated)"
    elif have < want:
        detail = f"{RECORD} counts {have:g} of {want:g} GPUs (a shard missing from the view)"
    else:
        detail = f"{RECORD} counts {have:g} of {want:g} GPUs (a GPU counted twice)"
    away = {n: why for n, why in (out_of_service or {}).items() if counts.get(n)}
    short = _shards_short(counts, away, by_shard, node_shards) if have < want else []
    if short:
        detail += f": {'; '.join(short)}"
    states = set(federate_states)
    settling = young or PENDING in states
    if settling:
        why = "replicas just started" if young else "a federate target not scraped yet"
        return Check("prometheus", host, CHECK, PENDING, f"{detail}; {why}")
    if away and not short and want - sum(counts[n] or 0 for n in away) <= have < want:
        named = "; ".join(f"{n} {why}" for n, why in sorted(away.items()))
        counted = f"{RECORD} counts {have:g} of {want:g} GPUs" if answer else f"no {RECORD}"
        return Check("prometheus", host, CHECK, PENDING, f"{counted}: {named}")
    return Check("prometheus", host, CHECK, FAILED, detail)


def _shards_short(
    counts: Mapping[str, int | None],
    away: Mapping[str, str],
    by_shard: Mapping[str, float] | None,
    node_shards: Mapping[str, str] | None,
) -> list[str]:
    """The shards the global pair counts fewer GPUs of than their nodes hold, beyond the GPUs
    of their own nodes a rollout has out of service (none without a per-shard view)."""
    if by_shard is None or not node_shards:
        return []
    want: dict[str, int] = {}
    out: dict[str, int] = {}
    for node, count in counts.items():
        shard = node_shards.get(node)
        if shard is None or not count:
            continue
        want[shard] = want.get(shard, 0) + count
        if node in away:
            out[shard] = out.get(shard, 0) + count
    said = []
    for shard in sorted(want):
        have = by_shard.get(shard, 0.0)
        if want[shard] - have > out.get(shard, 0):
            gone = f", {out[shard]} of them out of service" if shard in out else ""
            said.append(f"shard {shard} {have:g} of {want[shard]} GPUs{gone}")
    return said
